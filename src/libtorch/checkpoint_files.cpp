// The checkpoint_files.hpp functions.
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

#include "libtorch/checkpoint_files.hpp"
#include "tutti/types.hpp"

namespace tutti::libtorch::detail {

CheckpointFd open_checkpoint_dir(const std::string& dir) {
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

void write_all(int fd, std::string_view bytes, const std::string& path) {
  std::size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) throw_system("checkpoint: cannot write", path, n < 0 ? errno : ENOSPC);
    done += static_cast<std::size_t>(n);
  }
}

void write_file_atomically(const std::string& dir, const std::string& name, std::string_view bytes) {
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

bool name_exists(const std::string& path) {
  struct stat st;
  return ::lstat(path.c_str(), &st) == 0;
}

std::string read_checkpoint_file(const std::string& path, std::uint64_t limit, std::optional<std::uint64_t> expected) {
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

}  // namespace tutti::libtorch::detail
