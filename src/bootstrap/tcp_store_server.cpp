// StoreServer: one thread polls the listening socket, a wake-up eventfd and every authenticated
// connection. A new connection first passes handshake() on a short-lived thread of its own (a
// silent client must not stall the others), bounded by handshake_limit; then the poll thread
// serves its requests. A get of an absent key is parked and answered by the set or add that
// creates the key, so no request ever blocks the thread.
#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <list>
#include <map>
#include <mutex>
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

constexpr auto handshake_limit = std::chrono::seconds(5);
constexpr std::size_t max_handshakes = 64;  // in flight at once; more are refused (a flood)

std::string peer_address(const sockaddr_storage& address) {
  char host[NI_MAXHOST] = "?", port[NI_MAXSERV] = "?";
  ::getnameinfo(reinterpret_cast<const sockaddr*>(&address), sizeof(address), host, sizeof(host), port, sizeof(port),
                NI_NUMERICHOST | NI_NUMERICSERV);
  return std::string(host) + ":" + port;
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
  struct Handshake {
    int fd = -1;
    std::string address;
    std::thread thread;
    bool done = false;  // guarded by handshakes_mutex
    bool passed = false;
  };
  struct Connection {
    int fd = -1;
    std::string address;
    std::string inbox, outbox;
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

  std::mutex handshakes_mutex;
  std::list<Handshake> handshakes;

  // Touched by the poll thread only.
  std::uint64_t next_connection = 1;
  std::map<std::uint64_t, Connection> connections;
  std::unordered_map<std::string, std::string> values;
  std::unordered_map<std::string, std::vector<Waiter>> waiting_gets;

  void wake() {
    const std::uint64_t one = 1;
    [[maybe_unused]] const ssize_t wrote = ::write(wake_fd, &one, sizeof(one));
  }

  void refuse(const std::string& address, const std::string& why) {
    ++refused;
    core::log(core::LogLevel::warn, -1, "store: refused a connection from " + address + ": " + why);
  }

  void run();
  void accept_all();
  void start_handshake(int fd, const std::string& address);
  void adopt_handshakes(bool all);
  bool read_from(Connection& connection);
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
    entries.assign({{wake_fd, POLLIN, 0}, {listen_fd, POLLIN, 0}});
    ids.assign(2, 0);
    for (const auto& [id, connection] : connections) {
      entries.push_back({connection.fd, static_cast<short>(POLLIN | (connection.outbox.empty() ? 0 : POLLOUT)), 0});
      ids.push_back(id);
    }
    if (::poll(entries.data(), entries.size(), -1) < 0) continue;  // EINTR
    if (entries[0].revents != 0) {
      std::uint64_t count = 0;
      [[maybe_unused]] const ssize_t got = ::read(wake_fd, &count, sizeof(count));
      adopt_handshakes(false);
    }
    if (entries[1].revents != 0) accept_all();
    for (std::size_t i = 2; i < entries.size(); ++i) {
      if (entries[i].revents == 0) continue;
      auto at = connections.find(ids[i]);
      bool alive = true;
      if (entries[i].revents & (POLLIN | POLLHUP | POLLERR)) alive = read_from(at->second);
      if (alive) {
        detail::StoreMessage request;
        while (alive) {
          const auto status = detail::take_message(at->second.inbox, true, &request);
          if (status == detail::FrameStatus::incomplete) break;
          if (status == detail::FrameStatus::malformed) {
            core::log(core::LogLevel::warn, -1, "store: malformed request from " + at->second.address + "; closing");
            alive = false;
          } else {
            serve(ids[i], request);
          }
        }
      }
      if (alive) alive = flush(at->second);
      if (!alive) {
        ::close(at->second.fd);
        connections.erase(at);  // its parked gets are dropped when their key is set
      }
    }
  }
  close_all();
}

void StoreServer::Impl::accept_all() {
  for (;;) {
    sockaddr_storage address{};
    socklen_t size = sizeof(address);
    const int fd = ::accept4(listen_fd, reinterpret_cast<sockaddr*>(&address), &size, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) return;  // EAGAIN: no more; other errors (EMFILE…) are retried on the next poll
    start_handshake(fd, peer_address(address));
  }
}

void StoreServer::Impl::start_handshake(int fd, const std::string& address) {
  std::lock_guard lock(handshakes_mutex);
  if (handshakes.size() >= max_handshakes) {
    ::close(fd);
    refuse(address, "too many connections in handshake");
    return;
  }
  Handshake& entry = handshakes.emplace_back();
  entry.fd = fd;
  entry.address = address;
  entry.thread = std::thread([this, &entry] {
    std::string why;
    bool passed = false;
    try {
      passed = handshake(entry.fd, token, false, Clock::now() + handshake_limit, &why);
    } catch (const std::exception& e) {  // getrandom failed: refuse rather than end the process
      why = e.what();
    }
    if (!passed && !stopping) refuse(entry.address, why);
    std::lock_guard done_lock(handshakes_mutex);
    entry.passed = passed;
    entry.done = true;
    wake();
  });
}

// Joins finished handshake threads; the connections that passed join the poll set. With `all`
// (shutting down) waits for every thread: their sockets were shut down, so they end at once.
void StoreServer::Impl::adopt_handshakes(bool all) {
  std::list<Handshake> finished;
  {
    std::lock_guard lock(handshakes_mutex);
    for (auto it = handshakes.begin(); it != handshakes.end();) {
      auto next = std::next(it);
      if (it->done || all) finished.splice(finished.end(), handshakes, it);
      it = next;
    }
  }
  for (Handshake& entry : finished) {
    entry.thread.join();
    if (entry.passed && !all) {
      const int one = 1;
      ::setsockopt(entry.fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
      connections[next_connection++] = Connection{entry.fd, entry.address, {}, {}};
    } else {
      ::close(entry.fd);
    }
  }
}

bool StoreServer::Impl::read_from(Connection& connection) {
  char chunk[65536];
  for (;;) {
    const ssize_t got = ::recv(connection.fd, chunk, sizeof(chunk), MSG_DONTWAIT);
    if (got > 0) {
      connection.inbox.append(chunk, static_cast<std::size_t>(got));
      continue;
    }
    if (got < 0 && errno == EINTR) continue;
    return got < 0 && (errno == EAGAIN || errno == EWOULDBLOCK);  // 0 = the client left
  }
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
      waiting_gets[key].push_back({connection_id, request.id});
      return;
    }
    case 'A': {
      const auto delta = detail::decode_i64(request.payload);
      std::int64_t value = 0;
      const auto found = values.find(key);
      if (!delta || (found != values.end() && !detail::parse_store_int(found->second, &value)))
        return reply(connection_id, request.id, 'E', "store: add: key '" + key + "' does not hold an integer");
      value += *delta;
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
  for (const Waiter& waiter : waiters) reply(waiter.connection, waiter.id, 'O', value);
}

// Queues a reply; it leaves in flush() (now or when the socket has room). Replies to
// connections that have closed are dropped.
void StoreServer::Impl::reply(std::uint64_t connection_id, std::uint32_t id, char status, const std::string& payload) {
  const auto at = connections.find(connection_id);
  if (at == connections.end()) return;
  at->second.outbox += detail::encode_message({id, status, "", payload}, false);
  flush(at->second);  // a failure shows up as POLLERR/POLLHUP on the next poll
}

void StoreServer::Impl::close_all() {
  {
    std::lock_guard lock(handshakes_mutex);
    for (Handshake& entry : handshakes) ::shutdown(entry.fd, SHUT_RDWR);  // ends their handshake now
  }
  adopt_handshakes(true);
  for (auto& [id, connection] : connections) ::close(connection.fd);
  connections.clear();
}

StoreServer::StoreServer(const std::string& host, int port, const std::string& token) : impl_(new Impl) {
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
