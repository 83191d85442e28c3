// Ranks as forked processes: the runner the multi-process tests of one binary share.
#pragma once

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <exception>
#include <functional>
#include <thread>
#include <vector>

namespace tutti::testing {

/// Waits for `pid` until `deadline`; kills it if still running. Returns its wait status, or -1.
inline int reap(pid_t pid, std::chrono::steady_clock::time_point deadline) {
  using namespace std::chrono_literals;
  int status = 0;
  for (;;) {
    const pid_t done = waitpid(pid, &status, WNOHANG);
    if (done == pid) return status;
    if (done < 0) return -1;
    if (std::chrono::steady_clock::now() >= deadline) {
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      return -1;
    }
    std::this_thread::sleep_for(5ms);
  }
}

/// Runs fn(r) for every rank r in [0, p), each in a forked process that exits with fn's result
/// (2 if it threw, with the message on stderr), and waits for them all until `limit` has passed
/// (killing the rest). Returns each rank's exit code, -1 for one that hung or crashed.
inline std::vector<int> on_processes(int p, const std::function<int(int)>& fn, std::chrono::seconds limit) {
  std::vector<pid_t> pids;
  for (int r = 0; r < p; ++r) {
    const pid_t pid = fork();
    if (pid == 0) {
      int code = 0;
      try {
        code = fn(r);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "rank %d: %s\n", r, e.what());
        code = 2;
      } catch (...) {
        code = 2;
      }
      _exit(code);
    }
    pids.push_back(pid);
  }
  const auto deadline = std::chrono::steady_clock::now() + limit;
  std::vector<int> codes;
  for (const pid_t pid : pids) {
    const int status = pid < 0 ? -1 : reap(pid, deadline);
    codes.push_back(status >= 0 && WIFEXITED(status) ? WEXITSTATUS(status) : -1);
  }
  return codes;
}

}  // namespace tutti::testing
