#include "watchdog.hpp"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <exception>
#include <set>
#include <stdexcept>
#include <system_error>
#include <utility>

#include "output.hpp"
#include "process.hpp"

namespace tutti::launcher {

namespace {

using Clock = std::chrono::steady_clock;

// SIGTERM first, so that the job's programs may end cleanly; SIGKILL to those left after this.
constexpr std::chrono::seconds term_grace{2};
// How long SIGKILL may be repeated (each round finds what the victims of the last one started).
constexpr std::chrono::seconds kill_limit{3};
// At a normal end, how long the job's processes still running (a rank started by hand that joined
// an elastic job, finishing as tutti-run's own did) have to end by themselves before any signal.
constexpr std::chrono::seconds settle{3};
// How long tutti-run waits for the watchdog at its normal end: longer than the watchdog's work.
constexpr int done_wait_ms = 10'000;
static_assert(settle + term_grace + kill_limit < std::chrono::milliseconds(done_wait_ms));
// What tutti-run writes before closing the pipe when it ends normally.
constexpr char normal_end = 'x';

void close_between(int low, int high) {  // closes low+1 .. high-1
  if (high - low > 1) ::close_range(static_cast<unsigned>(low) + 1, static_cast<unsigned>(high) - 1, 0);
}

// Leaves the watchdog with `a`, `b` and stderr (for its report): nothing else of tutti-run's, so
// that it holds open no pipe that someone waits to see closed, such as tutti-run's stdout.
void keep_only(int a, int b) {
  const int null_fd = ::open("/dev/null", O_RDWR);
  if (null_fd >= 0) {
    ::dup2(null_fd, STDIN_FILENO);
    ::dup2(null_fd, STDOUT_FILENO);
    if (null_fd > STDERR_FILENO) ::close(null_fd);
  }
  const auto [low, high] = std::minmax(a, b);
  close_between(STDERR_FILENO, low);
  close_between(low, high);
  ::close_range(static_cast<unsigned>(high) + 1, ~0U, 0);
}

// Blocks until tutti-run has ended; true if it ended normally (it said so before closing).
bool wait_for_launcher(int fd) {
  bool normal = false;
  char byte;
  for (;;) {
    const ssize_t n = ::read(fd, &byte, 1);
    if (n == 1) {
      normal = byte == normal_end;
    } else if (n == 0 || errno != EINTR) {
      return normal;
    }
  }
}

std::string processes(int n) { return std::to_string(n) + (n == 1 ? " process" : " processes"); }

[[noreturn]] void watch(int launcher_fd, int done_fd, const Job& job) {
  try {
    ::prctl(PR_SET_NAME, "tutti-watchdog");
    for (int signo : {SIGINT, SIGTERM, SIGHUP, SIGPIPE, SIGTTOU}) ::signal(signo, SIG_IGN);
    keep_only(launcher_fd, done_fd);
    const bool normal = wait_for_launcher(launcher_fd);
    if (normal) {
      const Clock::time_point until = Clock::now() + settle;
      while (!find_job_processes(job.token()).empty() && Clock::now() < until) ::poll(nullptr, 0, 20);
    }
    const int ended = end_job_processes(job.token());
    if (!normal) {
      remove_job_files(job.id(), job.store_dir());
      report("job " + job.id() + ": tutti-run ended without cleaning up (killed?); its watchdog ended " +
             processes(ended) + " of the job and removed the job's files");
    } else if (ended > 0) {
      report("job " + job.id() + ": the watchdog ended " + processes(ended) + " of the job left running");
    }
  } catch (const std::exception& e) {
    report(std::string("watchdog: ") + e.what());
  }
  ::_exit(0);
}

}  // namespace

int end_job_processes(const std::string& token) {
  const Clock::time_point start = Clock::now();
  std::set<ProcessId> signalled;
  for (;;) {
    const std::vector<ProcessId> job = find_job_processes(token);
    const Clock::duration elapsed = Clock::now() - start;
    if (job.empty() || elapsed >= term_grace + kill_limit) break;
    for (const ProcessId& process : job) {
      // Each gets SIGTERM once; after the grace, SIGKILL in every round until it is gone.
      if (elapsed >= term_grace) {
        signal_process(process, SIGKILL);
        signalled.insert(process);
      } else if (signalled.insert(process).second) {
        signal_process(process, SIGTERM);
      }
    }
    ::poll(nullptr, 0, 20);
  }
  return static_cast<int>(signalled.size());
}

Watchdog::Watchdog(const Job& job) {
  int to[2], from[2];
  if (::pipe2(to, O_CLOEXEC) != 0) throw_errno("pipe");
  if (::pipe2(from, O_CLOEXEC) != 0) {
    ::close(to[0]);
    ::close(to[1]);
    throw_errno("pipe");
  }
  // An inherited SIG_IGN would let the kernel reap the intermediate child before we wait for it.
  ::signal(SIGCHLD, SIG_DFL);
  // A watchdog killed by hand must not make the destructor's word to it kill tutti-run.
  ::signal(SIGPIPE, SIG_IGN);
  const pid_t pid = ::fork();
  if (pid == 0) {
    // Forked twice, and in a new session: no child of tutti-run, no member of its process group.
    ::setsid();
    const pid_t watchdog = ::fork();
    if (watchdog == 0) watch(to[0], from[1], job);
    ::_exit(watchdog < 0 ? 1 : 0);
  }
  const int fork_errno = errno;
  ::close(to[0]);
  ::close(from[1]);
  int status = 0;
  while (pid > 0 && ::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (pid < 0 || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    ::close(to[1]);
    ::close(from[0]);
    if (pid < 0) throw std::system_error(fork_errno, std::generic_category(), "fork");
    throw std::runtime_error("cannot start the watchdog");
  }
  to_watchdog_ = to[1];
  from_watchdog_ = from[0];
}

Watchdog::~Watchdog() {
  [[maybe_unused]] const ssize_t n = ::write(to_watchdog_, &normal_end, 1);
  ::close(to_watchdog_);
  const Clock::time_point deadline = Clock::now() + std::chrono::milliseconds(done_wait_ms);
  for (;;) {
    const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) break;
    pollfd p{from_watchdog_, POLLIN, 0};
    const int ready = ::poll(&p, 1, static_cast<int>(left));
    char byte;
    if (ready > 0 && ::read(from_watchdog_, &byte, 1) <= 0) break;  // EOF: the watchdog has exited
  }
  ::close(from_watchdog_);
}

}  // namespace tutti::launcher
