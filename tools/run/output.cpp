#include "output.hpp"

#include <poll.h>
#include <unistd.h>

#include <cerrno>

namespace tutti::launcher {

bool write_all(int fd, std::string_view data) {
  while (!data.empty()) {
    const ssize_t n = ::write(fd, data.data(), data.size());
    if (n >= 0) {
      data.remove_prefix(static_cast<std::size_t>(n));
    } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
      // Someone made our stdout non-blocking (a shared terminal or pipe): wait until it drains.
      pollfd p{fd, POLLOUT, 0};
      ::poll(&p, 1, 1000);
    } else if (errno != EINTR) {
      return false;
    }
  }
  return true;
}

void report(std::string_view message) {
  std::string line = "tutti-run: ";
  line.append(message);
  line.push_back('\n');
  write_all(STDERR_FILENO, line);
}

void LineForwarder::add_line(std::string& out, std::string_view line) const {
  out.append(prefix_);
  out.append(line);
  out.push_back('\n');
}

bool LineForwarder::append(const char* data, std::size_t size) {
  pending_.append(data, size);
  std::string out;
  std::size_t start = 0;
  for (;;) {
    const std::size_t newline = pending_.find('\n', start);
    if (newline == std::string::npos) break;
    add_line(out, std::string_view(pending_).substr(start, newline - start));
    start = newline + 1;
  }
  while (pending_.size() - start >= max_line_) {
    add_line(out, std::string_view(pending_).substr(start, max_line_));
    start += max_line_;
  }
  pending_.erase(0, start);
  // One write for all the lines of this chunk: cheaper, and still whole lines only.
  return out.empty() || write_all(out_fd_, out);
}

void LineForwarder::flush() {
  if (pending_.empty()) return;
  std::string out;
  add_line(out, pending_);
  pending_.clear();
  write_all(out_fd_, out);
}

}  // namespace tutti::launcher
