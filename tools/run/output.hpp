// tutti-run's output: the ranks' lines, forwarded whole, and tutti-run's own messages.
//
// tutti-run is the only writer of its stdout and stderr while the job runs, and it writes whole
// lines with one write() each, so the lines of different ranks never interleave mid-line.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <utility>

namespace tutti::launcher {

/// Writes all of `data` to `fd`, retrying on EINTR, partial writes and EAGAIN. Returns false
/// (errno set) on another error, such as EPIPE when nobody reads our output any more.
bool write_all(int fd, std::string_view data);

/// Prints "tutti-run: <message>\n" on stderr in one write.
void report(std::string_view message);

/// The line buffer of one stream (stdout or stderr) of one rank: collects bytes, and forwards
/// every complete line to `out_fd` with `prefix` in front.
class LineForwarder {
 public:
  LineForwarder(std::string prefix, int out_fd) : prefix_(std::move(prefix)), out_fd_(out_fd) {}

  /// Forwards the complete lines in pending bytes + `data`; keeps the unfinished last line.
  /// Returns false if the output could not be written (see write_all).
  bool append(const char* data, std::size_t size);
  /// Forwards an unfinished last line, with a newline added (at end of stream).
  void flush();

 private:
  // A rank that never ends its line (a progress bar using '\r') must not make tutti-run hold
  // unbounded memory: past this size the pending bytes go out as a line of their own.
  static constexpr std::size_t max_line_ = 64 * 1024;

  void add_line(std::string& out, std::string_view line) const;

  std::string prefix_;
  int out_fd_;
  std::string pending_;
};

}  // namespace tutti::launcher
