// The file store: one file per key in a directory every rank can see (tutti-run creates it).
// set() writes a temporary file in the same directory and renames it over the key's file, so a
// reader sees either no file or the whole value, never a partial one — also on NFS, where rename
// is atomic. add() serialises its read-modify-write with flock() on a per-key lock file.
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <mutex>
#include <optional>
#include <set>
#include <thread>

#include "bootstrap/auth.hpp"
#include "bootstrap/socket_io.hpp"
#include "bootstrap/store_backends.hpp"
#include "core/log.hpp"
#include "tutti/types.hpp"

namespace tutti::bootstrap::detail {
namespace {

// Keys may hold '/' and anything else; file names get [A-Za-z0-9_-.] only, the rest as %XX. A
// leading '.' is escaped too, so no key collides with the ".tmp-" and ".lock-" files (or "..").
std::string escape_key(const std::string& key) {
  static constexpr char digits[] = "0123456789ABCDEF";
  std::string name;
  for (std::size_t i = 0; i < key.size(); ++i) {
    const auto c = static_cast<unsigned char>(key[i]);
    const bool plain = std::isalnum(c) || c == '_' || c == '-' || (c == '.' && i > 0);
    if (plain) {
      name.push_back(static_cast<char>(c));
    } else {
      name.push_back('%');
      name.push_back(digits[c >> 4]);
      name.push_back(digits[c & 0xf]);
    }
  }
  return name.empty() ? "%" : name;  // the empty key still needs a file name
}

class FdGuard {
 public:
  explicit FdGuard(int fd) : fd_(fd) {}
  ~FdGuard() {
    if (fd_ >= 0) ::close(fd_);
  }
  FdGuard(const FdGuard&) = delete;
  FdGuard& operator=(const FdGuard&) = delete;
  int get() const { return fd_; }

 private:
  int fd_;
};

class FileStore final : public Store {
 public:
  FileStore(std::string url, std::string dir) : url_(std::move(url)), dir_(std::move(dir)) {}

  void set(const std::string& key, const std::string& value) override {
    const std::string final_path = dir_ + "/" + escape_key(key);
    const std::string temp_path = dir_ + "/.tmp-" + escape_key(key) + "-" + random_hex(8);
    {
      FdGuard fd(::open(temp_path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644));
      if (fd.get() < 0) fail("set", key, "creating " + temp_path);
      std::size_t done = 0;
      while (done < value.size()) {
        const ssize_t wrote = ::write(fd.get(), value.data() + done, value.size() - done);
        if (wrote < 0 && errno == EINTR) continue;
        if (wrote < 0) {
          const int error = errno;
          ::unlink(temp_path.c_str());
          errno = error;
          fail("set", key, "writing " + temp_path);
        }
        done += static_cast<std::size_t>(wrote);
      }
    }
    if (::rename(temp_path.c_str(), final_path.c_str()) != 0) {
      const int error = errno;
      ::unlink(temp_path.c_str());
      errno = error;
      fail("set", key, "renaming to " + final_path);
    }
  }

  std::string get(const std::string& key, std::chrono::milliseconds timeout) override {
    const auto deadline = Clock::now() + timeout;
    auto pause = std::chrono::milliseconds(1);
    for (;;) {
      if (auto value = read_value(key)) return *value;
      const auto now = Clock::now();
      if (now >= deadline)
        throw Error(ErrorCode::timeout,
                    "store: key '" + key + "' not set after " + std::to_string(timeout.count()) + " ms (" + url_ + ")");
      std::this_thread::sleep_for(std::min<Clock::duration>(pause, deadline - now));
      pause = std::min(pause * 2, std::chrono::milliseconds(50));
    }
  }

  std::int64_t add(const std::string& key, std::int64_t delta) override {
    if (delta == 0) return read_int(key);  // a read: set() replaces the file whole, no lock needed
    const std::string lock_path = dir_ + "/.lock-" + escape_key(key);
    FdGuard lock(::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644));
    if (lock.get() < 0) fail("add", key, "opening " + lock_path);
    while (::flock(lock.get(), LOCK_EX) != 0)
      if (errno != EINTR) fail("add", key, "locking " + lock_path);
    std::int64_t value = read_int(key);
    if (__builtin_add_overflow(value, delta, &value))
      throw Error(ErrorCode::invalid_argument, "store: add: key '" + key + "' would overflow");
    set(key, std::to_string(value));
    return value;  // the lock is released when `lock` closes
  }

 private:
  // The integer add() keeps at `key` (absent: 0).
  std::int64_t read_int(const std::string& key) const {
    std::int64_t value = 0;
    if (const auto text = read_value(key); text && !parse_store_int(*text, &value))
      throw Error(ErrorCode::invalid_argument, "store: add: key '" + key + "' holds '" + *text + "', not an integer");
    return value;
  }

  // The value, or nullopt while the key's file does not exist.
  std::optional<std::string> read_value(const std::string& key) const {
    const std::string path = dir_ + "/" + escape_key(key);
    FdGuard fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
    if (fd.get() < 0) {
      if (errno == ENOENT) return std::nullopt;
      fail("get", key, "opening " + path);
    }
    std::string value;
    char buffer[4096];
    for (;;) {
      const ssize_t got = ::read(fd.get(), buffer, sizeof(buffer));
      if (got < 0 && errno == EINTR) continue;
      if (got < 0) fail("get", key, "reading " + path);
      if (got == 0) return value;
      value.append(buffer, static_cast<std::size_t>(got));
    }
  }

  [[noreturn]] void fail(const char* op, const std::string& key, const std::string& what) const {
    throw Error(ErrorCode::system,
                "store: " + std::string(op) + " '" + key + "' (" + url_ + "): " + what + ": " + errno_text(errno));
  }

  std::string url_;
  std::string dir_;
};

// Nothing authenticates a file store's keys but the directory's permissions: whoever can write
// there can plant or replace a key (a rank's address, a segment name) and so join or disrupt
// the job. Said once per directory and process.
void check_private(const std::string& dir, const struct stat& info) {
  std::string problem;
  if ((info.st_mode & (S_IWGRP | S_IWOTH)) != 0) {
    char mode[8];
    std::snprintf(mode, sizeof(mode), "%04o", static_cast<unsigned>(info.st_mode & 07777));
    problem = std::string("has mode ") + mode + " (writable by " +
              ((info.st_mode & S_IWOTH) != 0 ? ((info.st_mode & S_IWGRP) != 0 ? "its group and others" : "others")
                                             : "its group") +
              ")";
  }
  if (info.st_uid != ::geteuid()) {
    if (!problem.empty()) problem += " and ";
    problem += "is owned by uid " + std::to_string(info.st_uid) + ", not by this user (uid " +
               std::to_string(::geteuid()) + ")";
  }
  if (problem.empty()) return;
  static std::mutex mutex;
  static std::set<std::string> warned;
  std::lock_guard lock(mutex);
  if (!warned.insert(dir).second) return;
  core::log(core::LogLevel::warn, -1,
            "TUTTI_STORE: the file store directory '" + dir + "' " + problem +
                ": the directory's permissions are all that guards a file store, and whoever else can write "
                "there can forge or replace the job's keys (addresses, segment names) and so join or disrupt the "
                "job; use a directory of your own with mode 0700 (chmod go-w), as tutti-run makes");
}

}  // namespace

std::unique_ptr<Store> open_file_store(const std::string& url, const std::string& dir) {
  struct stat info {};
  if (::stat(dir.c_str(), &info) != 0 || !S_ISDIR(info.st_mode))
    throw Error(ErrorCode::invalid_argument, "TUTTI_STORE: " + url + ": '" + dir + "' is not an existing directory");
  check_private(dir, info);
  return std::make_unique<FileStore>(url, dir);
}

}  // namespace tutti::bootstrap::detail

namespace tutti::bootstrap {

bool private_file_store(const std::string& url) {
  const std::string scheme = "file://";
  if (!url.starts_with(scheme)) return false;
  struct stat info {};
  const std::string dir = url.substr(scheme.size());
  return ::lstat(dir.c_str(), &info) == 0 && S_ISDIR(info.st_mode) && info.st_uid == ::geteuid() &&
         (info.st_mode & 077) == 0;
}

}  // namespace tutti::bootstrap
