// Socket set-up for the TCP transport: listening, dialing with retries, socket options.
// Deadline-bounded reads and writes come from bootstrap/socket_io.hpp.
#pragma once

#include <chrono>
#include <string>

namespace tutti::transport::tcp {

using Clock = std::chrono::steady_clock;

/// Owns a file descriptor; closes it on destruction.
class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  Fd(Fd&& other) noexcept : fd_(other.release()) {}
  Fd& operator=(Fd&& other) noexcept;
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() { reset(); }
  int get() const { return fd_; }
  int release() {
    const int fd = fd_;
    fd_ = -1;
    return fd;
  }
  void reset();

 private:
  int fd_ = -1;
};

/// A listening IPv4 TCP socket on `host` (empty = any address) with an OS-chosen port, stored
/// in *port. Throws Error(system) naming the host on failure.
Fd listen_on(const std::string& host, int* port);

/// "host:port" split; throws Error(invalid_argument) for a malformed address.
void split_address(const std::string& address, std::string* host, int* port);

/// Connects to host:port, retrying while the peer is not listening yet, until `deadline`.
/// Returns an invalid Fd on timeout (reason in *why); throws Error(system) if the host cannot
/// be resolved. The socket is nonblocking.
Fd dial(const std::string& host, int port, Clock::time_point deadline, std::string* why);

/// Nonblocking, close-on-exec, TCP_NODELAY: how every mesh connection runs.
void tune_connection(int fd);

/// The address others should dial to reach `bind_host` (the host name for a wildcard).
std::string advertised_host(const std::string& bind_host);

/// "ip:port" of the remote end of `fd`, for logs.
std::string peer_name(int fd);

}  // namespace tutti::transport::tcp
