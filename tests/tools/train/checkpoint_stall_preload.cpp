// Loaded with LD_PRELOAD into the ranks of a job by train_checkpoint_test.sh: in the rank named by
// TUTTI_STALL_RANK, a write() to a file whose path ends in TUTTI_STALL_FILE writes half its bytes
// and then never returns, so that the test can kill the rank while its shard is half written.
// (A file the test planted at the temporary name could not hold the writer up: the writer
// unlinks whatever is there and creates the file anew.) Every other write() passes through.
#include <dlfcn.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace {

bool is_stalled_file(int fd) {
  static const char* const rank = std::getenv("TUTTI_RANK");
  static const char* const stall_rank = std::getenv("TUTTI_STALL_RANK");
  static const char* const stall_file = std::getenv("TUTTI_STALL_FILE");
  if (rank == nullptr || stall_rank == nullptr || stall_file == nullptr || std::strcmp(rank, stall_rank) != 0)
    return false;
  char link[64], target[4096];
  std::snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
  const ssize_t n = ::readlink(link, target, sizeof target - 1);
  const std::size_t suffix = std::strlen(stall_file);
  if (n <= 0 || static_cast<std::size_t>(n) < suffix) return false;
  target[n] = '\0';
  return std::strcmp(target + n - static_cast<ssize_t>(suffix), stall_file) == 0;
}

}  // namespace

extern "C" ssize_t write(int fd, const void* data, std::size_t bytes) {
  using Write = ssize_t (*)(int, const void*, std::size_t);
  static const auto real = reinterpret_cast<Write>(::dlsym(RTLD_NEXT, "write"));
  if (bytes > 1 && is_stalled_file(fd)) {
    real(fd, data, bytes / 2);
    for (;;) ::pause();
  }
  return real(fd, data, bytes);
}
