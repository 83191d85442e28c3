// libtorch glue: the POSIX file steps of checkpoints (torch_checkpoint.hpp), for directories that
// others may be able to write into (docs/security.md, "Checkpoint directory"). No libtorch here.
// Part of <tutti/torch.hpp>; header-only.
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

namespace tutti::torch::detail {

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
inline CheckpointFd open_checkpoint_dir(const std::string& dir) {
  CheckpointFd fd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  if (fd.get() < 0) {
    const int error = errno;
    struct stat link;
    if (::lstat(dir.c_str(), &link) == 0 && S_ISLNK(link.st_mode))
      throw Error(ErrorCode::invalid_argument,
                  "checkpoint: directory " + dir + " is a symbolic link: refused (it could send the files anywhere)");
    throw_system("checkpoint: cannot open the directory", dir, error);
  }
  struct stat st;
  if (::fstat(fd.get(), &st) != 0) throw_system("checkpoint: cannot stat", dir, errno);
  if (st.st_uid != ::geteuid())
    throw Error(ErrorCode::invalid_argument, "checkpoint: directory " + dir + " belongs to uid " +
                                                 std::to_string(st.st_uid) + ", not to this user (uid " +
                                                 std::to_string(::geteuid()) + "): refused");
  if ((st.st_mode & S_IWOTH) && !(st.st_mode & S_ISVTX))
    throw Error(ErrorCode::invalid_argument,
                "checkpoint: directory " + dir + " is writable by every user (and not sticky): refused");
  return fd;
}

inline void write_all(int fd, std::string_view bytes, const std::string& path) {
  std::size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) throw_system("checkpoint: cannot write", path, n < 0 ? errno : ENOSPC);
    done += static_cast<std::size_t>(n);
  }
}

/// Writes `bytes` to dir/name atomically (see the top of this file). Throws Error naming the
/// path and the cause: invalid_argument for a directory refused by open_checkpoint_dir, system
/// for a missing or unwritable directory, a full disk, or a temporary name someone else created
/// between the unlink and the exclusive create.
inline void write_file_atomically(const std::string& dir, const std::string& name, std::string_view bytes) {
  const CheckpointFd dir_fd = open_checkpoint_dir(dir);
  const std::string temporary_name = name + ".tmp", temporary = dir + "/" + temporary_name;
  ::unlinkat(dir_fd.get(), temporary_name.c_str(), 0);  // whatever is there: the create below is exclusive
  CheckpointFd fd(
      ::openat(dir_fd.get(), temporary_name.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644));
  if (fd.get() < 0) throw_system("checkpoint: cannot create", temporary, errno);
  try {
    write_all(fd.get(), bytes, temporary);
    if (::fsync(fd.get()) != 0) throw_system("checkpoint: cannot flush", temporary, errno);
    if (const int error = fd.close()) throw_system("checkpoint: cannot flush", temporary, error);
  } catch (...) {
    ::unlinkat(dir_fd.get(), temporary_name.c_str(), 0);
    throw;
  }
  if (::renameat(dir_fd.get(), temporary_name.c_str(), dir_fd.get(), name.c_str()) != 0)
    throw_system("checkpoint: cannot rename", temporary, errno);
  if (::fsync(dir_fd.get()) != 0) throw_system("checkpoint: cannot fsync", dir, errno);
}

/// The largest MANIFEST read: far more than a model with 10^5 parameters needs.
inline constexpr std::uint64_t max_manifest_bytes = std::uint64_t{64} << 20;

/// Whether `path` exists as a name (a link counts, followed or not).
inline bool name_exists(const std::string& path) {
  struct stat st;
  return ::lstat(path.c_str(), &st) == 0;
}

/// The whole regular file at `path`, which must have exactly `expected` bytes if given, and at
/// most `limit`. Throws Error(invalid_argument) naming it for a missing file, a link, anything not
/// a regular file (a FIFO, a device), the wrong size, or a file that changes size while read;
/// Error(system) for a read error or a size no memory holds.
inline std::string read_checkpoint_file(const std::string& path, std::uint64_t limit,
                                        std::optional<std::uint64_t> expected = std::nullopt) {
  auto refuse = [&](const std::string& why) -> void {
    throw Error(ErrorCode::invalid_argument, "checkpoint: cannot read " + path + ": " + why);
  };
  // O_NONBLOCK: a FIFO's open would otherwise wait for a writer forever (it changes nothing for
  // the regular files read below).
  const CheckpointFd fd(::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC));
  if (fd.get() < 0) {
    const int error = errno;
    if (error == ELOOP) refuse("it is a symbolic link (refused)");
    refuse(std::string(std::strerror(error)) + (error == ENOENT ? " (an incomplete checkpoint?)" : ""));
  }
  struct stat st;
  if (::fstat(fd.get(), &st) != 0) throw_system("checkpoint: cannot stat", path, errno);
  if (!S_ISREG(st.st_mode)) refuse("not a regular file (refused)");
  const auto size = static_cast<std::uint64_t>(st.st_size);
  if (expected && size != *expected)
    throw Error(ErrorCode::invalid_argument, "checkpoint: " + path + " is damaged: it has " + std::to_string(size) +
                                                 " bytes, the file its MANIFEST names has " +
                                                 std::to_string(*expected));
  if (size > limit) refuse(std::to_string(size) + " bytes, more than the " + std::to_string(limit) + " allowed");
  std::string bytes;
  try {
    bytes.resize(size);
  } catch (const std::bad_alloc&) {
    throw Error(ErrorCode::system,
                "checkpoint: cannot read " + path + ": no memory for its " + std::to_string(size) + " bytes");
  }
  std::size_t done = 0;
  while (done <= bytes.size()) {  // one read past the end, to see that it is the end
    char extra;
    char* to = done < bytes.size() ? bytes.data() + done : &extra;
    const ssize_t n = ::read(fd.get(), to, done < bytes.size() ? bytes.size() - done : 1);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw_system("checkpoint: cannot read", path, errno);
    if (n == 0 && done < bytes.size()) refuse("it shrank while being read");
    if (n == 0) break;
    if (done == bytes.size()) refuse("it grew while being read");
    done += static_cast<std::size_t>(n);
  }
  return bytes;
}

}  // namespace tutti::torch::detail
