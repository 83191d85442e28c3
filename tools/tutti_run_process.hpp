// Process primitives of tutti-run: starting one rank, finding the processes the ranks left
// behind, and describing how a process ended.
#pragma once

#include <signal.h>
#include <sys/resource.h>
#include <sys/types.h>

#include <string>
#include <vector>

namespace tutti::launcher {

/// Everything a rank's child process needs, prepared before fork() (the child only calls
/// async-signal-safe functions between fork and exec).
struct ExecSpec {
  const char* program = nullptr;  // searched in PATH like execvp
  char* const* argv = nullptr;
  char* const* envp = nullptr;
  int stdin_fd = -1;  // -1: keep tutti-run's standard input
  int stdout_fd = -1;
  int stderr_fd = -1;
  sigset_t signal_mask{};  // the mask tutti-run was started with
  rlimit open_files{};     // the limit tutti-run was started with
};

/// Forks and executes `spec`. The child dies with SIGKILL if tutti-run dies. Returns the child's
/// pid once it has executed the program; on an exec failure returns -1 with *exec_errno set (the
/// child is already reaped). Throws std::system_error if fork or pipe fails.
pid_t spawn(const ExecSpec& spec, int* exec_errno);

/// The pids of this process's children (from /proc): with tutti-run a child subreaper, that
/// includes every orphan the ranks left behind.
std::vector<pid_t> list_children();

/// The status a shell would report: the exit status, or 128 + signal number.
int exit_code(int wait_status);

/// "rank 2 (pid 1234) exited with status 3" or "... killed by signal 9 (Killed)".
std::string describe_exit(int rank, pid_t pid, int wait_status);

/// "SIGTERM" for SIGTERM.
std::string signal_name(int signo);

}  // namespace tutti::launcher
