#include "process.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <map>
#include <optional>
#include <sstream>
#include <system_error>

namespace tutti::launcher {

namespace {

[[noreturn]] void exec_child(const ExecSpec& spec, pid_t parent, int status_fd) {
  // A rank must not outlive tutti-run, even when tutti-run is killed with SIGKILL.
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (::getppid() != parent) ::_exit(127);  // tutti-run died before prctl took effect
  if (spec.stdin_fd >= 0) ::dup2(spec.stdin_fd, STDIN_FILENO);
  ::dup2(spec.stdout_fd, STDOUT_FILENO);  // dup2 clears O_CLOEXEC on the copy
  ::dup2(spec.stderr_fd, STDERR_FILENO);
  ::signal(SIGPIPE, SIG_DFL);
  ::setrlimit(RLIMIT_NOFILE, &spec.open_files);
  ::sigprocmask(SIG_SETMASK, &spec.signal_mask, nullptr);
  ::execvpe(spec.program, spec.argv, spec.envp);
  const int error = errno;
  [[maybe_unused]] ssize_t n = ::write(status_fd, &error, sizeof error);
  ::_exit(127);
}

}  // namespace

pid_t spawn(const ExecSpec& spec, int* exec_errno) {
  // The status pipe is closed by a successful exec (O_CLOEXEC) and carries errno otherwise, so
  // the parent knows, before starting the next rank, whether this one runs.
  int status[2];
  if (::pipe2(status, O_CLOEXEC) != 0) throw std::system_error(errno, std::generic_category(), "pipe");
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid < 0) {
    const int error = errno;
    ::close(status[0]);
    ::close(status[1]);
    throw std::system_error(error, std::generic_category(), "fork");
  }
  if (pid == 0) exec_child(spec, parent, status[1]);
  ::close(status[1]);
  int error = 0;
  ssize_t n;
  do {
    n = ::read(status[0], &error, sizeof error);
  } while (n < 0 && errno == EINTR);
  ::close(status[0]);
  if (n != static_cast<ssize_t>(sizeof error)) return pid;
  int wait_status;
  while (::waitpid(pid, &wait_status, 0) < 0 && errno == EINTR) {
  }
  *exec_errno = error;
  return -1;
}

namespace {

// A /proc file's contents, or less (empty) when the process exits while it is read: a read then
// fails with ESRCH, which an ifstream would throw as an exception.
std::string read_proc_file(const std::string& path) {
  std::string text;
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return text;
  char buffer[4096];
  for (;;) {
    const ssize_t n = ::read(fd, buffer, sizeof buffer);
    if (n > 0) {
      text.append(buffer, static_cast<std::size_t>(n));
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else {
      if (n < 0) text.clear();  // what was read may be cut anywhere
      break;
    }
  }
  ::close(fd);
  return text;
}

}  // namespace

namespace {

struct ProcessStat {
  pid_t ppid = 0;
  unsigned long long start_time = 0;
};

// The parent and start time of process `pid`, or nothing if it is gone.
std::optional<ProcessStat> read_stat(const std::string& pid) {
  const std::string stat = read_proc_file("/proc/" + pid + "/stat");
  // The command name in parentheses may contain anything, the fields after the last ')' not.
  const std::size_t close = stat.rfind(')');
  if (close == std::string::npos) return std::nullopt;
  std::istringstream fields(stat.substr(close + 1));
  std::string state, skipped;
  ProcessStat result;
  fields >> state >> result.ppid;
  for (int field = 5; field < 22; ++field) fields >> skipped;  // pgrp ... itrealvalue
  if (!(fields >> result.start_time)) return std::nullopt;
  return result;
}

// Calls fn(name) for the name of every process in /proc ("1234").
template <class Fn>
void for_each_process(Fn&& fn) {
  DIR* proc = ::opendir("/proc");
  if (proc == nullptr) return;
  while (const dirent* entry = ::readdir(proc)) {
    char* end = nullptr;
    const long pid = std::strtol(entry->d_name, &end, 10);
    if (*end == '\0' && pid > 0) fn(std::string(entry->d_name));
  }
  ::closedir(proc);
}

bool holds_entry(const std::string& environment, const std::string& entry) {
  for (std::size_t at = environment.find(entry); at != std::string::npos; at = environment.find(entry, at + 1)) {
    const std::size_t end = at + entry.size();
    if ((at == 0 || environment[at - 1] == '\0') && (end == environment.size() || environment[end] == '\0')) {
      return true;
    }
  }
  return false;
}

}  // namespace

std::vector<pid_t> list_children() {
  std::vector<pid_t> children;
  const pid_t self = ::getpid();
  for_each_process([&](const std::string& pid) {
    const std::optional<ProcessStat> stat = read_stat(pid);
    if (stat && stat->ppid == self) children.push_back(static_cast<pid_t>(std::stol(pid)));
  });
  return children;
}

std::vector<ProcessId> find_job_processes(const std::string& token) {
  const std::string entry = "TUTTI_TOKEN=" + token;
  const pid_t self = ::getpid();
  std::map<pid_t, std::pair<ProcessStat, bool>> all;  // pid -> stat, and whether of the job
  for_each_process([&](const std::string& name) {
    const pid_t pid = static_cast<pid_t>(std::stol(name));
    const std::optional<ProcessStat> stat = read_stat(name);
    // A zombie's environment reads empty: it is ended already.
    if (stat && pid != self) all[pid] = {*stat, holds_entry(read_proc_file("/proc/" + name + "/environ"), entry)};
  });
  // A descendant that cleared its environment still belongs to the job, while its parent lives.
  for (bool grew = true; grew;) {
    grew = false;
    for (auto& [pid, process] : all) {
      const auto parent = all.find(process.first.ppid);
      if (!process.second && parent != all.end() && parent->second.second) process.second = grew = true;
    }
  }
  std::vector<ProcessId> job;
  for (const auto& [pid, process] : all) {
    if (process.second) job.push_back({pid, process.first.start_time});
  }
  return job;
}

void signal_process(const ProcessId& process, int signo) {
  // The pidfd holds on to the process it names: once the start time read after opening it
  // matches, the signal cannot go to a process that got the pid later. (Called through syscall:
  // glibc 2.36's <sys/pidfd.h> declares its wrappers without extern "C".)
  const int fd = static_cast<int>(::syscall(SYS_pidfd_open, process.pid, 0));
  if (fd < 0 && errno != ENOSYS) return;  // gone
  const std::optional<ProcessStat> stat = read_stat(std::to_string(process.pid));
  const bool same = stat && stat->start_time == process.start_time;
  if (fd < 0) {
    if (same) ::kill(process.pid, signo);  // a kernel before 5.3: only as sure as the check just made
    return;
  }
  if (same) ::syscall(SYS_pidfd_send_signal, fd, signo, nullptr, 0);
  ::close(fd);
}

int exit_code(int wait_status) {
  if (WIFEXITED(wait_status)) return WEXITSTATUS(wait_status);
  if (WIFSIGNALED(wait_status)) return 128 + WTERMSIG(wait_status);
  return 1;
}

std::string describe_exit(int rank, pid_t pid, int wait_status) {
  std::string text = "rank " + std::to_string(rank) + " (pid " + std::to_string(pid) + ") ";
  if (WIFSIGNALED(wait_status)) {
    const int signo = WTERMSIG(wait_status);
    text += "killed by signal " + std::to_string(signo) + " (" + ::strsignal(signo) + ")";
    if (WCOREDUMP(wait_status)) text += ", core dumped";
  } else {
    text += "exited with status " + std::to_string(exit_code(wait_status));
  }
  return text;
}

std::string signal_name(int signo) {
  const char* abbrev = ::sigabbrev_np(signo);
  return abbrev != nullptr ? std::string("SIG") + abbrev : "signal " + std::to_string(signo);
}

void throw_errno(const char* what) { throw std::system_error(errno, std::generic_category(), what); }

}  // namespace tutti::launcher
