// Building the mesh: every rank listens and publishes its address; rank r dials every rank below
// it and accepts every rank above it, so each pair has exactly one connection. A connection
// joins only after bootstrap::handshake (the shared token) and an Ident exchange (rank, size,
// communicator); anything else is refused, logged and closed, and the legitimate mesh completes.
#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <atomic>
#include <mutex>
#include <numeric>
#include <set>
#include <thread>

#include "bootstrap/auth.hpp"
#include "bootstrap/socket_io.hpp"
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

std::string address_key(std::uint64_t comm_id, int rank) {
  return "tcp/" + std::to_string(comm_id) + "/" + std::to_string(rank);
}

std::chrono::milliseconds left_until(Clock::time_point deadline) {
  const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now());
  return std::max(left, std::chrono::milliseconds(0));
}

// The connections made so far, and the accepted ones still in their handshake (so that they
// can be cut short once the mesh is complete).
struct Mesh {
  explicit Mesh(int size) : fds(static_cast<std::size_t>(size)) {}
  std::mutex mutex;
  std::vector<Fd> fds;
  std::set<int> pending;
  int accepted = 0;
};

struct Setup {
  bootstrap::Store& store;
  const std::string& token;
  int rank;
  int size;
  std::uint64_t comm_id;
  Clock::time_point deadline;
};

// An accepted connection: handshake, then the caller's Ident; joins the mesh or is refused.
void admit(const Setup& s, Mesh& mesh, int raw_fd) {
  Fd fd(raw_fd);
  const std::string from = peer_name(raw_fd);
  std::string why;
  Ident theirs;
  bool ok = bootstrap::handshake(raw_fd, s.token, false, s.deadline, &why) &&
            recv_all(raw_fd, &theirs, sizeof(theirs), s.deadline, &why);
  if (ok && (theirs.magic != ident_magic || theirs.comm_id != s.comm_id || theirs.size != s.size ||
             theirs.rank <= s.rank || theirs.rank >= s.size)) {
    ok = false;
    why = "bad identification (rank " + std::to_string(theirs.rank) + ", size " + std::to_string(theirs.size) +
          ", communicator " + std::to_string(theirs.comm_id) + ")";
  }
  std::lock_guard lock(mesh.mutex);
  mesh.pending.erase(raw_fd);  // before the fd can be closed and its number reused
  if (ok && mesh.fds[static_cast<std::size_t>(theirs.rank)].get() >= 0) {
    ok = false;
    why = "rank " + std::to_string(theirs.rank) + " is connected already";
  }
  const Ident mine{ident_magic, s.rank, s.size, 0, s.comm_id};
  if (ok && !send_all(raw_fd, &mine, sizeof(mine), s.deadline, &why)) ok = false;
  if (!ok) {
    core::log(core::LogLevel::warn, s.rank, "tcp: refused a connection from " + from + ": " + why);
    return;
  }
  mesh.fds[static_cast<std::size_t>(theirs.rank)] = std::move(fd);
  ++mesh.accepted;
}

// Accepts until every higher rank has joined, the deadline passes or `stop` is set.
void accept_peers(const Setup& s, Mesh& mesh, int listener, const std::atomic<bool>& stop) {
  const int expected = s.size - 1 - s.rank;
  std::vector<std::thread> workers;
  for (;;) {
    {
      std::lock_guard lock(mesh.mutex);
      if (mesh.accepted == expected) break;
    }
    if (stop.load() || Clock::now() >= s.deadline) break;
    pollfd entry{listener, POLLIN, 0};
    if (::poll(&entry, 1, 20) <= 0) continue;
    const int fd = ::accept4(listener, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) continue;
    std::lock_guard lock(mesh.mutex);
    mesh.pending.insert(fd);
    workers.emplace_back([&s, &mesh, fd] { admit(s, mesh, fd); });
  }
  {
    std::lock_guard lock(mesh.mutex);
    for (int fd : mesh.pending) ::shutdown(fd, SHUT_RDWR);  // strays still in their handshake
  }
  for (auto& worker : workers) worker.join();
}

// Dials rank q. False when the deadline passed first; throws when q answered but was not right.
bool dial_peer(const Setup& s, Mesh& mesh, int q) {
  std::string address;
  try {
    address = s.store.get(address_key(s.comm_id, q), left_until(s.deadline));
  } catch (const Error& e) {
    if (e.code() == ErrorCode::timeout) return false;
    throw;
  }
  std::string host, why;
  int port = 0;
  split_address(address, &host, &port);
  Fd fd = dial(host, port, s.deadline, &why);
  if (fd.get() < 0) return false;
  const Ident mine{ident_magic, s.rank, s.size, 0, s.comm_id};
  Ident theirs;
  const bool ok = bootstrap::handshake(fd.get(), s.token, true, s.deadline, &why) &&
                  send_all(fd.get(), &mine, sizeof(mine), s.deadline, &why) &&
                  recv_all(fd.get(), &theirs, sizeof(theirs), s.deadline, &why);
  if (!ok && Clock::now() >= s.deadline) return false;
  if (ok && (theirs.magic != ident_magic || theirs.rank != q || theirs.comm_id != s.comm_id))
    why = "it answered as rank " + std::to_string(theirs.rank) + " of communicator " + std::to_string(theirs.comm_id);
  else if (ok)
    why.clear();
  if (!why.empty())
    throw Error(ErrorCode::system, "tcp: rank " + std::to_string(s.rank) + " could not connect to rank " +
                                       std::to_string(q) + " at " + address + ": " + why);
  std::lock_guard lock(mesh.mutex);
  mesh.fds[static_cast<std::size_t>(q)] = std::move(fd);
  return true;
}

}  // namespace

std::unique_ptr<Transport> connect(bootstrap::Store& store, const std::string& token, int rank, int size,
                                   std::uint64_t comm_id, const std::string& bind_host,
                                   std::chrono::milliseconds timeout) {
  if (size < 1 || rank < 0 || rank >= size)
    throw Error(ErrorCode::invalid_argument,
                "tcp connect: rank " + std::to_string(rank) + " is out of range [0, " + std::to_string(size) + ")");
  std::vector<int> members(static_cast<std::size_t>(size));
  std::iota(members.begin(), members.end(), 0);
  std::vector<int> fds(static_cast<std::size_t>(size), -1);
  if (size == 1) return std::make_unique<TcpTransport>(std::make_shared<Hub>(0, 1, fds), comm_id, members, 0);

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
    if (q != rank && mesh.fds[static_cast<std::size_t>(q)].get() < 0)
      missing += (missing.empty() ? "" : ", ") + std::to_string(q);
  if (!missing.empty())
    throw Error(ErrorCode::timeout, "tcp connect: rank " + std::to_string(rank) + " timed out after " +
                                        std::to_string(timeout.count()) + " ms waiting for rank(s) " + missing);
  for (int q = 0; q < size; ++q) {
    if (q == rank) continue;
    tune_connection(mesh.fds[static_cast<std::size_t>(q)].get());
  }
  for (int q = 0; q < size; ++q) fds[static_cast<std::size_t>(q)] = mesh.fds[static_cast<std::size_t>(q)].release();
  return std::make_unique<TcpTransport>(std::make_shared<Hub>(rank, size, std::move(fds)), comm_id, members, rank);
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

}  // namespace testing

}  // namespace tutti::transport::tcp
