// Process primitives of tutti-run: starting one rank, finding the processes the ranks left
// behind or the job's processes wherever they went, and describing how a process ended.
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

/// A process, named so that a reused pid cannot be taken for it: its pid and its start time.
struct ProcessId {
  pid_t pid = 0;
  unsigned long long start_time = 0;  // clock ticks after boot (/proc/PID/stat, field 22)
  auto operator<=>(const ProcessId&) const = default;
};

/// The processes of the job whose secret is `token` (from /proc): every process whose environment
/// holds TUTTI_TOKEN=`token`, and every descendant of one. Never the calling process.
std::vector<ProcessId> find_job_processes(const std::string& token);

/// Sends `signo` to `process` if it is still running (through a pidfd, so not to a later process
/// that got its pid).
void signal_process(const ProcessId& process, int signo);

/// The status a shell would report: the exit status, or 128 + signal number.
int exit_code(int wait_status);

/// "rank 2 (pid 1234) exited with status 3" or "... killed by signal 9 (Killed)".
std::string describe_exit(int rank, pid_t pid, int wait_status);

/// "SIGTERM" for SIGTERM.
std::string signal_name(int signo);

/// Throws std::system_error for errno, naming `what` (the call that failed).
[[noreturn]] void throw_errno(const char* what);

}  // namespace tutti::launcher
