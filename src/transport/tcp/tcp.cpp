// Building the mesh: every rank listens and publishes its address; rank r dials every rank below
// it and accepts every rank above it, so each pair has exactly one connection. A connection
// joins only after bootstrap::handshake (the shared token) and an authenticated Ident exchange
// (rank, size, communicator); anything else is refused, logged and closed, and the legitimate
// mesh completes.
//
// Accepting is bounded whatever arrives: one thread polls the listener and every accepted
// connection that has not spoken yet (a legitimate dialer speaks at once); only a connection that
// spoke goes to one of a few handshake workers, with a short deadline. Connections that stay
// silent are closed after a short while, and when too many wait (per source address or in all)
// the oldest silent one makes room. Dialers retry until their own deadline, so a flood can delay
// the mesh but not refuse it.
#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>
#include <numeric>
#include <set>
#include <thread>

#include "bootstrap/auth.hpp"
#include "bootstrap/frame_mac.hpp"
#include "bootstrap/socket_io.hpp"
#include "core/deadline.hpp"
#include "core/log.hpp"
#include "transport/tcp/socket.hpp"
#include "transport/tcp/tcp.hpp"
#include "transport/tcp/tcp_transport.hpp"
#include "transport/tcp/testing.hpp"
#include "transport/tcp/wire.hpp"

namespace tutti::transport::tcp {

namespace {

using bootstrap::detail::recv_all;
using bootstrap::detail::send_all;
using Key = std::optional<bootstrap::SessionKey>;

constexpr auto silence_limit = std::chrono::seconds(2);    // for an accepted connection to say something
constexpr auto handshake_limit = std::chrono::seconds(2);  // for its handshake and Ident, once it spoke
constexpr auto attempt_limit = std::chrono::seconds(5);    // a dialer's handshake attempt, before it retries
constexpr std::size_t max_waiting = 256;                   // accepted, not yet handed to a worker
constexpr std::size_t max_silent_per_source = 16;          // of those, silent ones from one address
constexpr std::size_t max_ready = 64;                      // spoke, waiting for a worker
constexpr int handshake_workers = 4;
constexpr int logged_per_kind = 3;  // then counted, and summed up once set-up ends

std::string address_key(std::uint64_t comm_id, int rank) {
  return "tcp/" + std::to_string(comm_id) + "/" + std::to_string(rank);
}

// Ident, followed by its tag under the session key when there is one.
bool send_ident(int fd, const Ident& ident, const Key& key, bool initiator, Clock::time_point deadline,
                std::string* why) {
  if (!send_all(fd, &ident, sizeof(ident), deadline, why)) return false;
  if (!key) return true;
  const Tag tag = FrameMac(*key, initiator).tag(0, FrameMac::Part::ident, &ident, sizeof(ident));
  return send_all(fd, tag.data(), tag.size(), deadline, why);
}

bool recv_ident(int fd, Ident* ident, const Key& key, bool from_initiator, Clock::time_point deadline,
                std::string* why) {
  if (!recv_all(fd, ident, sizeof(*ident), deadline, why)) return false;
  if (!key) return true;
  Tag tag;
  if (!recv_all(fd, tag.data(), tag.size(), deadline, why)) return false;
  if (FrameMac::same(tag, FrameMac(*key, from_initiator).tag(0, FrameMac::Part::ident, ident, sizeof(*ident))))
    return true;
  *why = "its identification failed authentication";
  return false;
}

struct Joined {
  Fd fd;
  bool initiator = false;
  Key key;
};

// The connections made so far, and the accepting side's queues and counters.
struct Mesh {
  explicit Mesh(int size) : joined(static_cast<std::size_t>(size)) {}
  std::mutex mutex;
  std::condition_variable ready_cv;
  std::vector<Joined> joined;
  int accepted = 0;
  std::deque<std::pair<Fd, std::string>> ready;  // spoke: (connection, its address) for a worker
  std::set<int> handshaking;                     // in a worker's hands (cut short when set-up ends)
  bool closing = false;
  std::map<std::string, int> turned_away;  // by reason, for the logs
};

struct Setup {
  bootstrap::Store& store;
  const std::string& token;
  int rank;
  int size;
  std::uint64_t comm_id;
  Clock::time_point deadline;
};

// Logs the first few connections turned away for each reason; the rest are summed up at the end.
void turn_away(const Setup& s, Mesh& mesh, const std::string& reason, const std::string& text) {
  int count;
  {
    std::lock_guard lock(mesh.mutex);
    count = ++mesh.turned_away[reason];
  }
  if (count <= logged_per_kind) core::log(core::LogLevel::warn, s.rank, "tcp: " + text);
}

// A connection that spoke: handshake, then the caller's Ident; joins the mesh or is refused.
void admit(const Setup& s, Mesh& mesh, Fd fd, const std::string& from) {
  const int raw_fd = fd.get();
  const Clock::time_point deadline = std::min(s.deadline, Clock::now() + handshake_limit);
  std::string why;
  bootstrap::SessionKey session{};
  Ident theirs;
  bool ok = bootstrap::handshake(raw_fd, s.token, false, deadline, &why, &session);
  const Key key = s.token.empty() ? Key{} : Key{session};
  if (!ok) why = "handshake failed: " + why;
  if (ok && !recv_ident(raw_fd, &theirs, key, true, deadline, &why)) {
    ok = false;
    why = "no identification: " + why;
  }
  if (ok && (theirs.magic != ident_magic || theirs.comm_id != s.comm_id || theirs.size != s.size ||
             theirs.rank <= s.rank || theirs.rank >= s.size)) {
    ok = false;
    why = "bad identification (rank " + std::to_string(theirs.rank) + ", size " + std::to_string(theirs.size) +
          ", communicator " + std::to_string(theirs.comm_id) + ")";
  }
  const Ident mine{ident_magic, s.rank, s.size, 0, s.comm_id};
  if (ok && !send_ident(raw_fd, mine, key, false, deadline, &why)) ok = false;
  std::unique_lock lock(mesh.mutex);
  mesh.handshaking.erase(raw_fd);  // before the fd can be closed and its number reused
  if (!ok) {
    lock.unlock();
    turn_away(s, mesh, "refused", "refused a connection from " + from + ": " + why);
    return;
  }
  // A dialer that retries after its own deadline for an attempt ran out replaces its earlier
  // connection, which it has given up.
  Joined& slot = mesh.joined[static_cast<std::size_t>(theirs.rank)];
  if (slot.fd.get() < 0) ++mesh.accepted;
  slot = Joined{std::move(fd), false, key};
}

void handshake_worker(const Setup& s, Mesh& mesh) {
  for (;;) {
    std::unique_lock lock(mesh.mutex);
    mesh.ready_cv.wait(lock, [&] { return mesh.closing || !mesh.ready.empty(); });
    if (mesh.closing) return;
    auto [fd, from] = std::move(mesh.ready.front());
    mesh.ready.pop_front();
    mesh.handshaking.insert(fd.get());
    lock.unlock();
    admit(s, mesh, std::move(fd), from);
  }
}

struct Waiting {
  Fd fd;
  std::string source;  // address without the port
  std::string name;    // address:port, for logs
  Clock::time_point since;
};

// Accepts until every higher rank has joined, the deadline passes or `stop` is set.
void accept_peers(const Setup& s, Mesh& mesh, int listener, const std::atomic<bool>& stop) {
  const int expected = s.size - 1 - s.rank;
  std::vector<std::thread> workers;
  for (int i = 0; i < std::min(handshake_workers, expected); ++i)
    workers.emplace_back([&s, &mesh] { handshake_worker(s, mesh); });
  std::vector<Waiting> waiting;  // accepted, silent so far; oldest first
  std::vector<pollfd> polled;
  const auto make_room = [&](std::size_t index, const std::string& why) {
    turn_away(s, mesh, "evicted",
              "closed a silent connection from " + waiting[index].name + " to make room (" + why + ")");
    waiting.erase(waiting.begin() + static_cast<std::ptrdiff_t>(index));
  };
  for (;;) {
    {
      std::lock_guard lock(mesh.mutex);
      if (mesh.accepted == expected) break;
    }
    if (stop.load() || Clock::now() >= s.deadline) break;
    polled.assign(1, pollfd{listener, POLLIN, 0});
    for (const Waiting& w : waiting) polled.push_back(pollfd{w.fd.get(), POLLIN, 0});
    if (::poll(polled.data(), polled.size(), 20) < 0) continue;
    // Connections that spoke go to the workers; those silent for too long are closed.
    const auto now = Clock::now();
    std::vector<Waiting> still;
    for (std::size_t i = 0; i < waiting.size(); ++i) {
      Waiting& w = waiting[i];
      if (polled[i + 1].revents != 0) {
        std::lock_guard lock(mesh.mutex);
        if (mesh.ready.size() >= max_ready) mesh.ready.pop_front();  // the oldest has been stuck longest
        mesh.ready.emplace_back(std::move(w.fd), w.name);
        mesh.ready_cv.notify_one();
      } else if (now - w.since >= silence_limit) {
        turn_away(s, mesh, "silent",
                  "closed a connection from " + w.name + " that sent nothing for " +
                      std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(silence_limit).count()) +
                      " ms");
      } else {
        still.push_back(std::move(w));
      }
    }
    waiting = std::move(still);
    if (!(polled[0].revents & POLLIN)) continue;
    for (int i = 0; i < 64; ++i) {
      const int raw = ::accept4(listener, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
      if (raw < 0) {
        if ((errno == EMFILE || errno == ENFILE) && !waiting.empty()) make_room(0, "out of file descriptors");
        break;
      }
      Waiting w{Fd(raw), {}, peer_name(raw), Clock::now()};
      w.source = w.name.substr(0, w.name.rfind(':'));
      const auto same =
          std::count_if(waiting.begin(), waiting.end(), [&](const Waiting& other) { return other.source == w.source; });
      if (static_cast<std::size_t>(same) >= max_silent_per_source) {
        const auto oldest = std::find_if(waiting.begin(), waiting.end(),
                                         [&](const Waiting& other) { return other.source == w.source; });
        make_room(static_cast<std::size_t>(oldest - waiting.begin()),
                  std::to_string(same) + " silent connections from " + w.source);
      } else if (waiting.size() >= max_waiting) {
        make_room(0, std::to_string(waiting.size()) + " silent connections in all");
      }
      waiting.push_back(std::move(w));
    }
  }
  {
    std::lock_guard lock(mesh.mutex);
    mesh.closing = true;
    for (int fd : mesh.handshaking) ::shutdown(fd, SHUT_RDWR);  // strays still in their handshake
  }
  mesh.ready_cv.notify_all();
  for (auto& worker : workers) worker.join();
  mesh.ready.clear();
  std::string summary;
  for (const auto& [reason, count] : mesh.turned_away)
    if (count > logged_per_kind) summary += (summary.empty() ? "" : ", ") + std::to_string(count) + " " + reason;
  if (!summary.empty())
    core::log(core::LogLevel::warn, s.rank, "tcp: set-up turned away connections that were not ranks: " + summary);
}

// Dials rank q, again and again until the deadline if the connection is cut. False when the
// deadline passed first; throws when q answered but was not right.
bool dial_peer(const Setup& s, Mesh& mesh, int q) {
  std::string address;
  try {
    address = s.store.get(address_key(s.comm_id, q), core::left_until(s.deadline));
  } catch (const Error& e) {
    if (e.code() == ErrorCode::timeout) return false;
    throw;
  }
  std::string host, why;
  int port = 0;
  split_address(address, &host, &port);
  const auto fail = [&](const std::string& reason) {
    return Error(ErrorCode::system, "tcp: rank " + std::to_string(s.rank) + " could not connect to rank " +
                                        std::to_string(q) + " at " + address + ": " + reason);
  };
  for (int attempt = 0;; ++attempt) {
    Fd fd = dial(host, port, s.deadline, &why);
    if (fd.get() < 0) return false;
    const Clock::time_point deadline = std::min(s.deadline, Clock::now() + attempt_limit);
    bootstrap::SessionKey session{};
    const Ident mine{ident_magic, s.rank, s.size, 0, s.comm_id};
    Ident theirs;
    bool ok = bootstrap::handshake(fd.get(), s.token, true, deadline, &why, &session);
    const Key key = s.token.empty() ? Key{} : Key{session};
    if (!ok && (why.find("wrong token") != std::string::npos || why.find("not a Tutti peer") != std::string::npos))
      throw fail(why);
    ok = ok && send_ident(fd.get(), mine, key, true, deadline, &why) &&
         recv_ident(fd.get(), &theirs, key, false, deadline, &why);
    if (ok && (theirs.magic != ident_magic || theirs.rank != q || theirs.comm_id != s.comm_id))
      throw fail("it answered as rank " + std::to_string(theirs.rank) + " of communicator " +
                 std::to_string(theirs.comm_id));
    if (ok) {
      std::lock_guard lock(mesh.mutex);
      mesh.joined[static_cast<std::size_t>(q)] = Joined{std::move(fd), true, key};
      return true;
    }
    if (Clock::now() >= s.deadline) return false;
    core::log(attempt == 0 ? core::LogLevel::warn : core::LogLevel::info, s.rank,
              "tcp: connection to rank " + std::to_string(q) + " at " + address + " failed (" + why + "); retrying");
    const auto pause = std::min<std::chrono::milliseconds>(std::chrono::milliseconds(10 << std::min(attempt, 5)),
                                                           core::left_until(s.deadline));
    std::this_thread::sleep_for(pause);
  }
}

}  // namespace

std::unique_ptr<Transport> connect(bootstrap::Store& store, const std::string& token, int rank, int size,
                                   std::uint64_t comm_id, const std::string& bind_host,
                                   std::chrono::milliseconds timeout) {
  bootstrap::require_token(token, "the TCP transport", rank);
  if (size < 1 || rank < 0 || rank >= size)
    throw Error(ErrorCode::invalid_argument,
                "tcp connect: rank " + std::to_string(rank) + " is out of range [0, " + std::to_string(size) + ")");
  std::vector<int> members(static_cast<std::size_t>(size));
  std::iota(members.begin(), members.end(), 0);
  std::vector<Link> links(static_cast<std::size_t>(size));
  if (size == 1) return std::make_unique<TcpTransport>(std::make_shared<Hub>(0, 1, links), comm_id, members, 0);

  const Setup setup{store, token, rank, size, comm_id, Clock::now() + timeout};
  int port = 0;
  Fd listener = listen_on(bind_host, &port);
  store.set(address_key(comm_id, rank), advertised_host(bind_host) + ":" + std::to_string(port));
  Mesh mesh(size);
  std::atomic<bool> stop{false};
  std::thread acceptor([&] { accept_peers(setup, mesh, listener.get(), stop); });
  std::optional<Error> failure;
  try {
    for (int q = 0; q < rank; ++q) dial_peer(setup, mesh, q);
  } catch (const Error& e) {
    failure = e;
  }
  if (failure) stop = true;  // else the acceptor returns once every higher rank joined, or at the deadline
  acceptor.join();
  if (failure) throw *failure;
  std::string missing;
  for (int q = 0; q < size; ++q)
    if (q != rank && mesh.joined[static_cast<std::size_t>(q)].fd.get() < 0)
      missing += (missing.empty() ? "" : ", ") + std::to_string(q);
  if (!missing.empty())
    throw Error(ErrorCode::timeout, "tcp connect: rank " + std::to_string(rank) + " timed out after " +
                                        std::to_string(timeout.count()) + " ms waiting for rank(s) " + missing);
  for (int q = 0; q < size; ++q) {
    if (q == rank) continue;
    Joined& joined = mesh.joined[static_cast<std::size_t>(q)];
    tune_connection(joined.fd.get());
    links[static_cast<std::size_t>(q)] = Link{joined.fd.release(), joined.initiator, joined.key};
  }
  return std::make_unique<TcpTransport>(std::make_shared<Hub>(rank, size, std::move(links)), comm_id, members, rank);
}

TcpTransport::TcpTransport(std::shared_ptr<Hub> hub, std::uint64_t id, std::vector<int> members, int rank)
    : hub_(std::move(hub)), id_(id), members_(std::move(members)), rank_(rank) {
  state_ = hub_->join(id_, members_, rank_);
}

TcpTransport::~TcpTransport() { hub_->leave(id_); }

std::unique_ptr<Transport> TcpTransport::split(std::uint64_t id, const std::vector<int>& ranks, int new_rank) {
  std::vector<int> members;
  members.reserve(ranks.size());
  for (int r : ranks) members.push_back(members_.at(static_cast<std::size_t>(r)));
  return std::make_unique<TcpTransport>(hub_, id, std::move(members), new_rank);
}

namespace testing {

void crash(Transport& transport) { dynamic_cast<TcpTransport&>(transport).hub().crash_for_testing(); }

std::uint64_t socket_writes(Transport& transport) {
  return dynamic_cast<TcpTransport&>(transport).hub().writes_for_testing();
}

}  // namespace testing

}  // namespace tutti::transport::tcp
