// StoreServer: one thread polls the listening socket, a wake-up eventfd and every connection.
// A new connection first runs the token handshake, as a Handshaker driven by the same poll loop
// (no thread per connection, so a flood of connections costs descriptors, never threads); once
// it passes, the loop serves its requests. A get of an absent key is parked and answered by the
// set or add that creates the key, so no request ever blocks the thread.
//
// Before authentication a connection is cheap to open and costs the server a slot, so slots are
// bounded: a handshake has handshake_limit to finish; at most max_handshakes_per_source come from
// one address and max_handshakes in all. When a new connection finds its cap full, the server
// evicts the oldest connection in handshake that has sent nothing (else the oldest one) rather
// than refusing the newcomer: an idle flood then only ever pushes out itself, while an honest
// client, which sends its hello at once and finishes in one round trip, gets in. Its client
// retries when it was evicted anyway (see connect_tcp_store).
#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <map>
#include <memory>
#include <optional>
#include <thread>
#include <unordered_map>
#include <vector>

#include "bootstrap/auth.hpp"
#include "bootstrap/socket_io.hpp"
#include "bootstrap/store.hpp"
#include "bootstrap/store_backends.hpp"
#include "bootstrap/tcp_store_protocol.hpp"
#include "core/log.hpp"
#include "tutti/types.hpp"

namespace tutti::bootstrap {

using detail::Clock;

namespace {

constexpr auto handshake_limit = std::chrono::seconds(2);
constexpr std::size_t max_handshakes_per_source = 8;
constexpr std::size_t max_handshakes = 256;
constexpr int accepts_per_round = 64;  // then the connections already accepted get their turn
constexpr int reads_per_round = 16;    // chunks read from one connection before the others' turn
// An authenticated client that asks and never reads its replies is closed past this much queued
// output; one that parks this many gets at once is told no.
constexpr std::size_t max_outbox = 4 * std::size_t{detail::max_store_frame};
constexpr std::size_t max_parked_gets = 1u << 16;
constexpr int logged_refusals = 16;  // then a summary at each power of two

struct Peer {
  std::string source;   // the address alone (the per-source cap counts by it)
  std::string address;  // address:port, for messages
};

Peer peer_of(const sockaddr_storage& address) {
  char host[NI_MAXHOST] = "?", port[NI_MAXSERV] = "?";
  ::getnameinfo(reinterpret_cast<const sockaddr*>(&address), sizeof(address), host, sizeof(host), port, sizeof(port),
                NI_NUMERICHOST | NI_NUMERICSERV);
  return {host, std::string(host) + ":" + port};
}

// A listening socket on host:port (port 0 = ephemeral); throws Error(system).
int listen_on(const std::string& host, int port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* list = nullptr;
  const int resolved =
      ::getaddrinfo(host.empty() ? nullptr : host.c_str(), std::to_string(port).c_str(), &hints, &list);
  if (resolved != 0)
    throw Error(ErrorCode::system, "store server: cannot resolve '" + host + "': " + ::gai_strerror(resolved));
  std::string why = "no address";
  int fd = -1;
  for (addrinfo* at = list; at != nullptr && fd < 0; at = at->ai_next) {
    fd = ::socket(at->ai_family, at->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, at->ai_protocol);
    const int one = 1;
    if (fd >= 0 && ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) == 0 &&
        ::bind(fd, at->ai_addr, at->ai_addrlen) == 0 && ::listen(fd, 128) == 0)
      break;
    why = detail::errno_text(errno);
    if (fd >= 0) ::close(fd);
    fd = -1;
  }
  ::freeaddrinfo(list);
  if (fd < 0)
    throw Error(ErrorCode::system, "store server: cannot listen on " + host + ":" + std::to_string(port) + ": " + why);
  return fd;
}

int bound_port(int fd) {
  sockaddr_storage address{};
  socklen_t size = sizeof(address);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &size);
  if (address.ss_family == AF_INET6) return ntohs(reinterpret_cast<sockaddr_in6*>(&address)->sin6_port);
  return ntohs(reinterpret_cast<sockaddr_in*>(&address)->sin_port);
}

}  // namespace

struct StoreServer::Impl {
  struct Connection {
    int fd = -1;
    Peer peer;
    std::unique_ptr<Handshaker> handshake;  // until it passes; then the connection is served
    Clock::time_point handshake_deadline;
    std::string inbox, outbox;
    detail::StoreSeal receive_seal, send_seal;  // tags of requests and replies, once the handshake passed
    std::size_t parked = 0;                     // its gets waiting for a key
    bool overflowed = false;                    // it stopped reading its replies: closed at the end of the round
  };
  struct Waiter {
    std::uint64_t connection;
    std::uint32_t id;
  };

  std::string host;
  std::string token;
  int listen_fd = -1;
  int wake_fd = -1;
  int port = 0;
  std::atomic<int> refused{0};
  std::atomic<bool> stopping{false};
  std::thread thread;

  // Touched by the poll thread only. Connection ids grow, so a lower id is an older connection.
  std::uint64_t next_connection = 1;
  std::map<std::uint64_t, Connection> connections;
  std::size_t handshaking = 0;
  std::unordered_map<std::string, std::size_t> handshaking_from;
  Clock::time_point accept_paused_until{};
  std::unordered_map<std::string, std::string> values;
  std::unordered_map<std::string, std::vector<Waiter>> waiting_gets;

  void wake() {
    const std::uint64_t one = 1;
    [[maybe_unused]] const ssize_t wrote = ::write(wake_fd, &one, sizeof(one));
  }

  void run();
  int poll_timeout() const;
  void accept_all();
  void admit(int fd, Peer peer);
  void evict(const std::string* source);
  void step_handshake(std::uint64_t id);
  void expire_handshakes();
  void refuse(const Peer& peer, const std::string& why);
  void close_connection(std::uint64_t id, const std::string* refusal);
  bool receive_requests(std::uint64_t id);
  bool flush(Connection& connection);
  void serve(std::uint64_t connection_id, const detail::StoreMessage& request);
  void reply(std::uint64_t connection_id, std::uint32_t id, char status, const std::string& payload);
  void store_value(const std::string& key, const std::string& value);
  void close_all();
};

void StoreServer::Impl::run() {
  std::vector<pollfd> entries;
  std::vector<std::uint64_t> ids;
  while (!stopping) {
    const bool accepting = Clock::now() >= accept_paused_until;
    entries.assign({{wake_fd, POLLIN, 0}, {listen_fd, static_cast<short>(accepting ? POLLIN : 0), 0}});
    ids.assign(2, 0);
    for (const auto& [id, connection] : connections) {
      entries.push_back({connection.fd, static_cast<short>(POLLIN | (connection.outbox.empty() ? 0 : POLLOUT)), 0});
      ids.push_back(id);
    }
    if (::poll(entries.data(), entries.size(), poll_timeout()) < 0) continue;  // EINTR
    if (entries[0].revents != 0) {
      std::uint64_t count = 0;
      [[maybe_unused]] const ssize_t got = ::read(wake_fd, &count, sizeof(count));
    }
    if (stopping) break;
    if (entries[1].revents != 0) accept_all();
    for (std::size_t i = 2; i < entries.size(); ++i) {
      if (entries[i].revents == 0) continue;
      const auto at = connections.find(ids[i]);
      if (at == connections.end()) continue;  // evicted by a newcomer this round
      if (at->second.handshake) {
        step_handshake(ids[i]);
        continue;
      }
      bool alive = true;
      if (entries[i].revents & (POLLIN | POLLHUP | POLLERR)) alive = receive_requests(ids[i]);
      if (alive) alive = flush(at->second);
      if (!alive) close_connection(ids[i], nullptr);  // its parked gets go with it
    }
    std::vector<std::uint64_t> overflowed;
    for (const auto& [id, connection] : connections)
      if (connection.overflowed) overflowed.push_back(id);
    for (const auto id : overflowed) {
      core::log(core::LogLevel::warn, -1,
                "store: " + connections.at(id).peer.address + " does not read its replies; closing it");
      close_connection(id, nullptr);
    }
    expire_handshakes();
  }
  close_all();
}

// Until the next handshake deadline (or the end of a pause in accepting); -1: nothing to time.
int StoreServer::Impl::poll_timeout() const {
  std::optional<Clock::time_point> next;
  if (Clock::now() < accept_paused_until) next = accept_paused_until;
  for (const auto& [id, connection] : connections)
    if (connection.handshake && (!next || connection.handshake_deadline < *next)) next = connection.handshake_deadline;
  return next ? detail::poll_timeout_ms(*next) : -1;
}

void StoreServer::Impl::accept_all() {
  for (int round = 0; round < accepts_per_round; ++round) {
    sockaddr_storage address{};
    socklen_t size = sizeof(address);
    const int fd = ::accept4(listen_fd, reinterpret_cast<sockaddr*>(&address), &size, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd >= 0) {
      admit(fd, peer_of(address));
      continue;
    }
    if (errno == EINTR || errno == ECONNABORTED) continue;
    if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
      // Out of descriptors: free one held by a connection in handshake, and stop polling the
      // listening socket for a moment (it stays readable, so poll would spin).
      if (handshaking > 0) evict(nullptr);
      accept_paused_until = Clock::now() + std::chrono::milliseconds(50);
      core::log(core::LogLevel::warn, -1, "store: accept: " + detail::errno_text(errno));
    }
    return;  // EAGAIN: no more for now
  }
}

void StoreServer::Impl::admit(int fd, Peer peer) {
  if (handshaking_from[peer.source] >= max_handshakes_per_source)
    evict(&peer.source);
  else if (handshaking >= max_handshakes)
    evict(nullptr);
  std::unique_ptr<Handshaker> machine;
  try {
    machine = std::make_unique<Handshaker>(token, false);
  } catch (const std::exception& e) {  // getrandom failed: refuse rather than end the process
    ::close(fd);
    if (handshaking_from[peer.source] == 0) handshaking_from.erase(peer.source);
    return refuse(peer, e.what());
  }
  const std::uint64_t id = next_connection++;
  Connection& connection = connections[id];
  connection.fd = fd;
  connection.peer = std::move(peer);
  connection.handshake = std::move(machine);
  connection.handshake_deadline = Clock::now() + handshake_limit;
  ++handshaking;
  ++handshaking_from[connection.peer.source];
  step_handshake(id);  // sends the hello; reads the client's if it is there already
}

// Closes one connection in handshake (from `source`, or from anywhere): the oldest that has
// sent nothing, else the oldest.
void StoreServer::Impl::evict(const std::string* source) {
  std::optional<std::uint64_t> idle, oldest;
  for (const auto& [id, connection] : connections) {
    if (!connection.handshake || (source != nullptr && connection.peer.source != *source)) continue;
    if (!oldest) oldest = id;
    if (connection.handshake->received() == 0) {
      idle = id;
      break;
    }
  }
  const auto victim = idle ? idle : oldest;
  if (!victim) return;
  const std::string why = source != nullptr ? "evicted: more than " + std::to_string(max_handshakes_per_source) +
                                                  " connections in handshake from " + *source + " (a flood?)"
                                            : "evicted: more than " + std::to_string(max_handshakes) +
                                                  " connections in handshake (a flood?)";
  close_connection(*victim, &why);
}

// Moves the handshake of connection `id` as far as the bytes at hand allow; it passes, fails
// (the connection is refused) or waits for more.
void StoreServer::Impl::step_handshake(std::uint64_t id) {
  Connection& connection = connections.at(id);
  Handshaker& machine = *connection.handshake;
  for (;;) {
    connection.outbox += machine.output();
    machine.output().clear();
    if (!flush(connection)) {
      const std::string why = "the connection failed during the handshake: " + detail::errno_text(errno);
      return close_connection(id, &why);
    }
    if (machine.state() == Handshaker::State::failed) return close_connection(id, &machine.why());
    if (machine.state() == Handshaker::State::passed) {
      auto count = handshaking_from.find(connection.peer.source);
      if (--count->second == 0) handshaking_from.erase(count);
      --handshaking;
      if (!token.empty()) {
        connection.receive_seal = detail::StoreSeal(machine.session_key(), true);
        connection.send_seal = detail::StoreSeal(machine.session_key(), false);
      }
      connection.handshake.reset();
      const int one = 1;
      ::setsockopt(connection.fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
      return;  // requests that came along are still in the socket: the next poll reports them
    }
    char bytes[64];
    const ssize_t got = ::recv(connection.fd, bytes, std::min(sizeof(bytes), machine.wanted()), MSG_DONTWAIT);
    if (got > 0) {
      machine.feed(bytes, static_cast<std::size_t>(got));
      continue;
    }
    if (got < 0 && errno == EINTR) continue;
    if (got < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
    const std::string why = got == 0 ? "closed the connection during the handshake"
                                     : "the connection failed during the handshake: " + detail::errno_text(errno);
    return close_connection(id, &why);
  }
}

void StoreServer::Impl::expire_handshakes() {
  const auto now = Clock::now();
  std::vector<std::uint64_t> late;
  for (const auto& [id, connection] : connections)
    if (connection.handshake && connection.handshake_deadline <= now) late.push_back(id);
  const std::string why = "no handshake within " + std::to_string(handshake_limit.count()) + " s";
  for (const auto id : late) close_connection(id, &why);
}

// Counts a connection that never got in, and says so: each of the first ones, then a summary at
// every power of two (a flood must not flood the log as well).
void StoreServer::Impl::refuse(const Peer& peer, const std::string& why) {
  const int count = ++refused;
  if (count <= logged_refusals) {
    core::log(core::LogLevel::warn, -1, "store: refused a connection from " + peer.address + ": " + why);
  } else if ((count & (count - 1)) == 0) {
    core::log(core::LogLevel::warn, -1,
              "store: " + std::to_string(count) + " connections refused so far; the latest from " + peer.address +
                  ": " + why + " (the others are counted, not logged)");
  }
}

// Closes connection `id`. One still in its handshake is counted as refused (with `refusal` as the
// reason) unless the server is stopping; a served one loses the gets it parked.
void StoreServer::Impl::close_connection(std::uint64_t id, const std::string* refusal) {
  const auto at = connections.find(id);
  Connection& connection = at->second;
  if (connection.handshake) {
    auto count = handshaking_from.find(connection.peer.source);
    if (--count->second == 0) handshaking_from.erase(count);
    --handshaking;
    if (!stopping) refuse(connection.peer, refusal != nullptr ? *refusal : "closed");
  }
  if (connection.parked > 0) {
    for (auto key = waiting_gets.begin(); key != waiting_gets.end();) {
      std::erase_if(key->second, [id](const Waiter& waiter) { return waiter.connection == id; });
      key = key->second.empty() ? waiting_gets.erase(key) : std::next(key);
    }
  }
  ::close(connection.fd);
  connections.erase(at);
}

// Reads what connection `id` sent and serves every whole request in it. Parses after each chunk,
// so the inbox never holds more than one frame (take_message refuses a frame over
// max_store_frame from its header alone). False when the connection must be closed.
bool StoreServer::Impl::receive_requests(std::uint64_t id) {
  Connection& connection = connections.at(id);
  char chunk[65536];
  for (int round = 0; round < reads_per_round; ++round) {
    const ssize_t got = ::recv(connection.fd, chunk, sizeof(chunk), MSG_DONTWAIT);
    if (got == 0) return false;  // the client left
    if (got < 0) {
      if (errno == EINTR) continue;
      return errno == EAGAIN || errno == EWOULDBLOCK;
    }
    connection.inbox.append(chunk, static_cast<std::size_t>(got));
    detail::StoreMessage request;
    for (;;) {
      const auto status = detail::take_message(connection.inbox, true, &request, &connection.receive_seal);
      if (status == detail::FrameStatus::incomplete) break;
      if (status == detail::FrameStatus::forged) {
        core::log(core::LogLevel::warn, -1,
                  "store: a request from " + connection.peer.address +
                      " failed authentication (forged, replayed or altered on the way); closing");
        return false;
      }
      if (status == detail::FrameStatus::malformed) {
        core::log(core::LogLevel::warn, -1, "store: malformed request from " + connection.peer.address + "; closing");
        return false;
      }
      serve(id, request);
    }
  }
  return true;  // more may be waiting: the next poll says so
}

bool StoreServer::Impl::flush(Connection& connection) {
  while (!connection.outbox.empty()) {
    const ssize_t sent =
        ::send(connection.fd, connection.outbox.data(), connection.outbox.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
    if (sent < 0) return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR;
    connection.outbox.erase(0, static_cast<std::size_t>(sent));
  }
  return true;
}

void StoreServer::Impl::serve(std::uint64_t connection_id, const detail::StoreMessage& request) {
  const std::string& key = request.key;
  switch (request.kind) {
    case 'S':
      store_value(key, request.payload);
      return reply(connection_id, request.id, 'O', "");
    case 'G': {
      const auto found = values.find(key);
      if (found != values.end()) return reply(connection_id, request.id, 'O', found->second);
      Connection& connection = connections.at(connection_id);
      if (connection.parked >= max_parked_gets)
        return reply(connection_id, request.id, 'E',
                     "store: get '" + key + "': more than " + std::to_string(max_parked_gets) +
                         " gets of this connection wait already");
      ++connection.parked;
      waiting_gets[key].push_back({connection_id, request.id});
      return;
    }
    case 'A': {
      const auto delta = detail::decode_i64(request.payload);
      std::int64_t value = 0;
      const auto found = values.find(key);
      if (!delta || (found != values.end() && !detail::parse_store_int(found->second, &value)))
        return reply(connection_id, request.id, 'E', "store: add: key '" + key + "' does not hold an integer");
      if (__builtin_add_overflow(value, *delta, &value))
        return reply(connection_id, request.id, 'E', "store: add: key '" + key + "' would overflow");
      store_value(key, std::to_string(value));
      return reply(connection_id, request.id, 'O', detail::encode_i64(value));
    }
    default:
      return reply(connection_id, request.id, 'E', std::string("store: unknown request '") + request.kind + "'");
  }
}

void StoreServer::Impl::store_value(const std::string& key, const std::string& value) {
  values[key] = value;
  const auto parked = waiting_gets.find(key);
  if (parked == waiting_gets.end()) return;
  const std::vector<Waiter> waiters = std::move(parked->second);
  waiting_gets.erase(parked);
  for (const Waiter& waiter : waiters) {
    if (const auto at = connections.find(waiter.connection); at != connections.end()) --at->second.parked;
    reply(waiter.connection, waiter.id, 'O', value);
  }
}

// Queues a reply; it leaves in flush() (now or when the socket has room). Replies to
// connections that have closed are dropped; a connection whose replies pile up is closed.
void StoreServer::Impl::reply(std::uint64_t connection_id, std::uint32_t id, char status, const std::string& payload) {
  const auto at = connections.find(connection_id);
  if (at == connections.end() || at->second.overflowed) return;
  Connection& connection = at->second;
  std::string frame = detail::encode_message({id, status, "", payload}, false);
  detail::seal_frame(frame, connection.send_seal);
  connection.outbox += frame;
  flush(connection);  // a failure shows up as POLLERR/POLLHUP on the next poll
  if (connection.outbox.size() > max_outbox) {
    connection.overflowed = true;
    connection.outbox.clear();
  }
}

void StoreServer::Impl::close_all() {
  for (auto& [id, connection] : connections) ::close(connection.fd);
  connections.clear();
  handshaking = 0;
  handshaking_from.clear();
}

StoreServer::StoreServer(const std::string& host, int port, const std::string& token) : impl_(new Impl) {
  require_token(token, "the tcp:// store server");
  impl_->host = host;
  impl_->token = token;
  impl_->listen_fd = listen_on(host, port);
  impl_->port = bound_port(impl_->listen_fd);
  impl_->wake_fd = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (impl_->wake_fd < 0) {
    ::close(impl_->listen_fd);
    throw Error(ErrorCode::system, "store server: eventfd: " + detail::errno_text(errno));
  }
  impl_->thread = std::thread([impl = impl_.get()] { impl->run(); });
}

StoreServer::~StoreServer() {
  impl_->stopping = true;
  impl_->wake();
  impl_->thread.join();
  ::close(impl_->listen_fd);
  ::close(impl_->wake_fd);
}

int StoreServer::port() const { return impl_->port; }

std::string StoreServer::url() const {
  std::string host = impl_->host;
  if (host.empty() || host == "0.0.0.0" || host == "::") {
    char name[256] = {};
    host = ::gethostname(name, sizeof(name) - 1) == 0 ? name : "localhost";
  }
  if (host.find(':') != std::string::npos) host = "[" + host + "]";
  return "tcp://" + host + ":" + std::to_string(impl_->port);
}

int StoreServer::refused() const { return impl_->refused; }

}  // namespace tutti::bootstrap
