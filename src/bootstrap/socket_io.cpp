#include "bootstrap/socket_io.hpp"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstring>

namespace tutti::bootstrap::detail {

namespace {
void set_why(std::string* why, std::string text) {
  if (why != nullptr) *why = std::move(text);
}
}  // namespace

std::string errno_text(int error) { return std::strerror(error); }

int poll_timeout_ms(Clock::time_point deadline) {
  const auto left = deadline - Clock::now();
  if (left <= Clock::duration::zero()) return 0;
  const auto ms = std::chrono::ceil<std::chrono::milliseconds>(left).count();
  return ms > INT_MAX ? INT_MAX : static_cast<int>(ms);
}

int wait_fd(int fd, short events, Clock::time_point deadline, std::string* why) {
  for (;;) {
    pollfd entry{fd, events, 0};
    const int ready = ::poll(&entry, 1, poll_timeout_ms(deadline));
    if (ready > 0) return 1;  // POLLERR/POLLHUP count as ready: the next read or write reports them
    if (ready == 0) {
      if (Clock::now() >= deadline) return 0;
      continue;  // poll rounds down on some kernels; wait out the rest
    }
    if (errno == EINTR) continue;
    set_why(why, "poll: " + errno_text(errno));
    return -1;
  }
}

bool send_all(int fd, const void* data, std::size_t size, Clock::time_point deadline, std::string* why) {
  const auto* bytes = static_cast<const char*>(data);
  while (size > 0) {
    const int ready = wait_fd(fd, POLLOUT, deadline, why);
    if (ready == 0) set_why(why, "deadline passed while sending");
    if (ready <= 0) return false;
    ssize_t sent = ::send(fd, bytes, size, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (sent < 0 && errno == ENOTSOCK) sent = ::write(fd, bytes, size);  // a pipe in tests
    if (sent < 0) {
      if (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK) continue;
      set_why(why, "send: " + errno_text(errno));
      return false;
    }
    bytes += sent;
    size -= static_cast<std::size_t>(sent);
  }
  return true;
}

bool recv_all(int fd, void* data, std::size_t size, Clock::time_point deadline, std::string* why) {
  auto* bytes = static_cast<char*>(data);
  while (size > 0) {
    const int ready = wait_fd(fd, POLLIN, deadline, why);
    if (ready == 0) set_why(why, "deadline passed while receiving");
    if (ready <= 0) return false;
    ssize_t got = ::recv(fd, bytes, size, MSG_DONTWAIT);
    if (got < 0 && errno == ENOTSOCK) got = ::read(fd, bytes, size);
    if (got == 0) {
      set_why(why, "peer closed the connection");
      return false;
    }
    if (got < 0) {
      if (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK) continue;
      set_why(why, "recv: " + errno_text(errno));
      return false;
    }
    bytes += got;
    size -= static_cast<std::size_t>(got);
  }
  return true;
}

bool set_nonblocking(int fd) {
  const int flags = ::fcntl(fd, F_GETFL);
  return flags >= 0 && ::fcntl(fd, F_SETFL, flags | O_NONBLOCK) == 0;
}

}  // namespace tutti::bootstrap::detail
