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
//
// This file holds that lifecycle (listening, the poll loop, admission, handshakes, eviction,
// closing) and the public StoreServer; tcp_store_requests.cpp serves the requests.
#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <iterator>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "bootstrap/auth.hpp"
#include "bootstrap/socket_io.hpp"
#include "bootstrap/store.hpp"
#include "bootstrap/tcp_store_protocol.hpp"
#include "bootstrap/tcp_store_server_impl.hpp"
#include "core/log.hpp"
#include "tutti/types.hpp"

namespace tutti::bootstrap {

using detail::Clock;
using detail::Peer;

namespace {

constexpr auto handshake_limit = std::chrono::seconds(2);
constexpr std::size_t max_handshakes_per_source = 8;
constexpr std::size_t max_handshakes = 256;
constexpr int accepts_per_round = 64;  // then the connections already accepted get their turn
constexpr int logged_refusals = 16;    // then a summary at each power of two

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
