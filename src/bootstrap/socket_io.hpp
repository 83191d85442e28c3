// Deadline-bounded socket I/O shared by the handshake and the TCP store. Works on blocking and
// nonblocking descriptors alike: every read and write is preceded by poll(), so a blocking fd
// never blocks past the deadline.
#pragma once

#include <chrono>
#include <cstddef>
#include <string>

namespace tutti::bootstrap::detail {

using Clock = std::chrono::steady_clock;

/// Milliseconds left until `deadline` for poll(): 0 when passed, rounded up, capped at INT_MAX.
int poll_timeout_ms(Clock::time_point deadline);

/// Waits until `fd` has one of `events` (POLLIN/POLLOUT). Returns 1 when ready, 0 when the
/// deadline passed, -1 on a poll error (reason in *why).
int wait_fd(int fd, short events, Clock::time_point deadline, std::string* why);

/// Sends all `size` bytes before `deadline`. False (reason in *why) on error, closed peer or deadline.
/// Never raises SIGPIPE.
bool send_all(int fd, const void* data, std::size_t size, Clock::time_point deadline, std::string* why);

/// Receives exactly `size` bytes before `deadline`. False (reason in *why) on error, EOF or deadline.
bool recv_all(int fd, void* data, std::size_t size, Clock::time_point deadline, std::string* why);

/// Sets O_NONBLOCK on `fd`; false on failure.
bool set_nonblocking(int fd);

/// "strerror(errno)" for messages.
std::string errno_text(int error);

}  // namespace tutti::bootstrap::detail
