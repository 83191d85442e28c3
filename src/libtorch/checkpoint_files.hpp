// libtorch glue: the POSIX file steps of checkpoints (torch_checkpoint.hpp), for directories that
// others may be able to write into (docs/security.md, "Checkpoint directory"). No libtorch here.
// Private to Tutti::torch (checkpoint_files.cpp).
//
// Writing: the directory is opened without following a link and must belong to this user and
// not be writable by every user (unless sticky); each file is created exclusively
// (O_EXCL|O_NOFOLLOW) under a temporary name relative to that open directory, a leftover of that
// name (a crashed attempt's partial file, or a planted link) is unlinked first, never followed;
// then fsync, rename, fsync of the directory, so a crash leaves the name absent or complete.
// Reading: only regular files, opened without following a link and without blocking (a FIFO
// would otherwise block open() forever), their size checked before a byte is read.
#pragma once

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <new>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include "tutti/types.hpp"

namespace tutti::libtorch::detail {

[[noreturn]] inline void throw_system(const std::string& what, const std::string& path, int error) {
  throw Error(ErrorCode::system, what + " " + path + ": " + std::strerror(error));
}

/// An open file descriptor, closed once.
class CheckpointFd {
 public:
  explicit CheckpointFd(int fd) : fd_(fd) {}
  ~CheckpointFd() {
    if (fd_ >= 0) ::close(fd_);
  }
  CheckpointFd(CheckpointFd&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  CheckpointFd(const CheckpointFd&) = delete;
  CheckpointFd& operator=(const CheckpointFd&) = delete;
  int get() const { return fd_; }
  /// Closes it now; the close's errno, or 0.
  int close() {
    const int rc = ::close(std::exchange(fd_, -1));
    return rc == 0 ? 0 : errno;
  }

 private:
  int fd_;
};

/// `dir`, opened for writing a checkpoint into: not a link, a directory, owned by this user, not
/// writable by every user unless sticky. Error(invalid_argument) naming it otherwise;
/// Error(system) if it cannot be opened.
CheckpointFd open_checkpoint_dir(const std::string& dir);

void write_all(int fd, std::string_view bytes, const std::string& path);

/// Writes `bytes` to dir/name atomically (see the top of this file). Throws Error naming the
/// path and the cause: invalid_argument for a directory refused by open_checkpoint_dir, system
/// for a missing or unwritable directory, a full disk, or a temporary name someone else created
/// between the unlink and the exclusive create.
void write_file_atomically(const std::string& dir, const std::string& name, std::string_view bytes);

/// The largest MANIFEST read: far more than a model with 10^5 parameters needs.
inline constexpr std::uint64_t max_manifest_bytes = std::uint64_t{64} << 20;

/// Whether `path` exists as a name (a link counts, followed or not).
bool name_exists(const std::string& path);

/// The whole regular file at `path`, which must have exactly `expected` bytes if given, and at
/// most `limit`. Throws Error(invalid_argument) naming it for a missing file, a link, anything not
/// a regular file (a FIFO, a device), the wrong size, or a file that changes size while read;
/// Error(system) for a read error or a size no memory holds.
std::string read_checkpoint_file(const std::string& path, std::uint64_t limit,
                                 std::optional<std::uint64_t> expected = std::nullopt);

}  // namespace tutti::libtorch::detail
