#include "transport/tcp/socket.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <thread>

#include "bootstrap/socket_io.hpp"
#include "tutti/types.hpp"

namespace tutti::transport::tcp {

using bootstrap::detail::errno_text;

Fd& Fd::operator=(Fd&& other) noexcept {
  if (this != &other) {
    reset();
    fd_ = other.release();
  }
  return *this;
}

void Fd::reset() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

namespace {

// The IPv4 address of `host` (a name or a dotted quad); empty = any.
sockaddr_in resolve(const std::string& host, int port) {
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(static_cast<std::uint16_t>(port));
  if (host.empty() || host == "0.0.0.0" || host == "*") {
    address.sin_addr.s_addr = htonl(INADDR_ANY);
    return address;
  }
  if (::inet_pton(AF_INET, host.c_str(), &address.sin_addr) == 1) return address;
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const int rc = ::getaddrinfo(host.c_str(), nullptr, &hints, &found);
  if (rc != 0 || found == nullptr)
    throw Error(ErrorCode::system, "tcp: cannot resolve host '" + host + "': " + ::gai_strerror(rc));
  address.sin_addr = reinterpret_cast<sockaddr_in*>(found->ai_addr)->sin_addr;
  ::freeaddrinfo(found);
  return address;
}

}  // namespace

Fd listen_on(const std::string& host, int* port) {
  sockaddr_in address = resolve(host, 0);
  Fd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (fd.get() < 0) throw Error(ErrorCode::system, "tcp: socket: " + errno_text(errno));
  if (::bind(fd.get(), reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0)
    throw Error(ErrorCode::system, "tcp: cannot listen on '" + host + "': bind: " + errno_text(errno));
  if (::listen(fd.get(), 1024) != 0) throw Error(ErrorCode::system, "tcp: listen: " + errno_text(errno));
  socklen_t length = sizeof(address);
  if (::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&address), &length) != 0)
    throw Error(ErrorCode::system, "tcp: getsockname: " + errno_text(errno));
  *port = ntohs(address.sin_port);
  return fd;
}

void split_address(const std::string& address, std::string* host, int* port) {
  const std::size_t colon = address.rfind(':');
  const std::string digits = colon == std::string::npos ? "" : address.substr(colon + 1);
  if (colon == std::string::npos || digits.empty() || digits.size() > 5 ||
      digits.find_first_not_of("0123456789") != std::string::npos || std::stoi(digits) > 65535)
    throw Error(ErrorCode::invalid_argument, "tcp: malformed address '" + address + "' (expected host:port)");
  *host = address.substr(0, colon);
  *port = std::stoi(digits);
}

Fd dial(const std::string& host, int port, Clock::time_point deadline, std::string* why) {
  const sockaddr_in address = resolve(host, port);
  for (;;) {
    Fd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
    if (fd.get() < 0) throw Error(ErrorCode::system, "tcp: socket: " + errno_text(errno));
    int error = 0;
    if (::connect(fd.get(), reinterpret_cast<const sockaddr*>(&address), sizeof(address)) != 0) {
      error = errno;
      if (error == EINPROGRESS) {
        const int ready = bootstrap::detail::wait_fd(fd.get(), POLLOUT, deadline, why);
        if (ready <= 0) {
          if (ready == 0 && why != nullptr) *why = "connect timed out";
          return Fd();
        }
        socklen_t length = sizeof(error);
        ::getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &error, &length);
      }
    }
    if (error == 0) return fd;
    if (why != nullptr) *why = "connect: " + errno_text(error);
    // Refused or unreachable: the peer may not listen yet (its address came from the store).
    if (Clock::now() + std::chrono::milliseconds(20) >= deadline) return Fd();
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

void tune_connection(int fd) {
  const int flags = ::fcntl(fd, F_GETFL, 0);
  if (flags < 0 || ::fcntl(fd, F_SETFL, flags | O_NONBLOCK) != 0)
    throw Error(ErrorCode::system, "tcp: fcntl: " + errno_text(errno));
  ::fcntl(fd, F_SETFD, FD_CLOEXEC);
  const int one = 1;
  // Small frames (headers, acks) must leave at once: latency is what collectives pay for.
  if (::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one)) != 0)
    throw Error(ErrorCode::system, "tcp: TCP_NODELAY: " + errno_text(errno));
}

std::string advertised_host(const std::string& bind_host) {
  if (!bind_host.empty() && bind_host != "0.0.0.0" && bind_host != "*") return bind_host;
  char name[256] = {};
  if (::gethostname(name, sizeof(name) - 1) != 0) return "127.0.0.1";
  return name;
}

std::string peer_name(int fd) {
  sockaddr_in address{};
  socklen_t length = sizeof(address);
  if (::getpeername(fd, reinterpret_cast<sockaddr*>(&address), &length) != 0) return "?";
  char text[INET_ADDRSTRLEN] = {};
  ::inet_ntop(AF_INET, &address.sin_addr, text, sizeof(text));
  return std::string(text) + ":" + std::to_string(ntohs(address.sin_port));
}

}  // namespace tutti::transport::tcp
