#include "supervisor.hpp"

#include <fcntl.h>
#include <poll.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <system_error>
#include <unordered_set>
#include <utility>

#include "process.hpp"

namespace tutti::launcher {

namespace {

// How long the pipes may stay open after the last rank exited and its leftovers were killed;
// only a process outside the job that got hold of a pipe could keep them open longer.
constexpr std::chrono::seconds drain_limit{5};
// How long killing the leftovers of the ranks may take (each round finds the orphans of the
// processes killed in the round before).
constexpr std::chrono::seconds leftover_limit{3};

sigset_t job_signals() {
  sigset_t set;
  sigemptyset(&set);
  for (int signo : {SIGINT, SIGTERM, SIGHUP, SIGCHLD, SIGUSR1}) sigaddset(&set, signo);
  return set;
}

void make_pipe(int fds[2]) {
  if (::pipe2(fds, O_CLOEXEC) != 0) throw_errno("pipe");
  ::fcntl(fds[0], F_SETFL, ::fcntl(fds[0], F_GETFL) | O_NONBLOCK);
}

struct WriteEnd {
  int fd = -1;
  ~WriteEnd() {
    if (fd >= 0) ::close(fd);
  }
};

std::string format_seconds(double s) {
  char text[32];
  std::snprintf(text, sizeof text, "%g s", s);
  return text;
}

std::string plural(int n, const std::string& word) {
  return std::to_string(n) + " " + word + (n == 1 ? "" : word.back() == 's' ? "es" : "s");
}

// Reaps every child that has exited, without waiting; returns how many.
int reap_orphans() {
  int reaped = 0;
  int status;
  while (::waitpid(-1, &status, WNOHANG) > 0) ++reaped;
  return reaped;
}

}  // namespace

sigset_t block_job_signals() {
  const sigset_t set = job_signals();
  sigset_t original;
  ::sigprocmask(SIG_BLOCK, &set, &original);
  return original;
}

Supervisor::Supervisor(LaunchSpec spec, const sigset_t& original_mask)
    : spec_(std::move(spec)), original_mask_(original_mask) {
  // An inherited SIG_IGN for SIGCHLD would make the kernel reap the ranks before we see them.
  ::signal(SIGCHLD, SIG_DFL);
  // Our stdout may be a pipe whose reader went away; the ranks must still be supervised.
  ::signal(SIGPIPE, SIG_IGN);
  const sigset_t set = job_signals();
  signal_fd_ = ::signalfd(-1, &set, SFD_NONBLOCK | SFD_CLOEXEC);
  if (signal_fd_ < 0) throw_errno("signalfd");
  // Orphans of the ranks become our children, so that none survives the job.
  if (::prctl(PR_SET_CHILD_SUBREAPER, 1) != 0) throw_errno("prctl(PR_SET_CHILD_SUBREAPER)");
  dev_null_ = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  if (dev_null_ < 0) throw_errno("/dev/null");
  raise_open_file_limit(2 * spec_.environments.size() + 32);
}

Supervisor::~Supervisor() {
  for (Rank& rank : ranks_) {
    if (!rank.running) continue;
    ::kill(rank.pid, SIGKILL);
    int status;
    while (::waitpid(rank.pid, &status, 0) < 0 && errno == EINTR) {
    }
  }
  kill_leftovers();
  for (Stream& stream : streams_) {
    if (stream.fd >= 0) close_stream(stream);
  }
  if (signal_fd_ >= 0) ::close(signal_fd_);
  if (dev_null_ >= 0) ::close(dev_null_);
}

void Supervisor::raise_open_file_limit(std::size_t needed) {
  if (::getrlimit(RLIMIT_NOFILE, &original_open_files_) != 0) throw_errno("getrlimit");
  if (original_open_files_.rlim_cur >= needed) return;
  rlimit raised = original_open_files_;
  raised.rlim_cur = std::min<rlim_t>(needed, raised.rlim_max);
  if (raised.rlim_cur < needed || ::setrlimit(RLIMIT_NOFILE, &raised) != 0) {
    throw std::runtime_error("too many ranks: " + std::to_string(needed) +
                             " open files needed, the limit (ulimit -n) allows " + std::to_string(raised.rlim_max));
  }
}

int Supervisor::run() {
  if (const int code = spawn_all(); code != 0) return code;
  while (running_ > 0 || open_streams_ > 0) {
    poll_once();
    check_deadlines();
  }
  if (first_failure_ && !(some_rank_succeeded_ && !spec_.joiner.empty())) return *first_failure_;
  return received_signal_ != 0 ? 128 + received_signal_ : 0;
}

void Supervisor::spawn_joiner() {
  if (spec_.joiner.empty()) {
    report("received SIGUSR1, which starts a rank only in an elastic job (--elastic); ignored");
    return;
  }
  if (received_signal_ != 0 || running_ == 0) return;  // the job is ending
  const int r = static_cast<int>(ranks_.size());
  spec_.environments.push_back(spec_.joiner);
  int exec_errno = 0;
  const pid_t pid = spawn_rank(r, &exec_errno);
  spawned_ = true;
  if (pid < 0) {
    ranks_.push_back({});  // its streams are there (they end at once): index r stays taken
    report("cannot start a rank that joins: " + std::string(std::strerror(exec_errno)));
    return;
  }
  ranks_.push_back({pid, true, false});
  rank_of_pid_[pid] = r;
  ++running_;
  report("started a rank that joins the job (output tagged [" + std::to_string(r) + "], pid " + std::to_string(pid) +
         ")");
}

int Supervisor::spawn_all() {
  const std::size_t n = spec_.environments.size();
  ranks_.resize(n);
  streams_.reserve(2 * n);
  for (std::size_t r = 0; r < n; ++r) {
    int exec_errno = 0;
    const pid_t pid = spawn_rank(static_cast<int>(r), &exec_errno);
    if (pid < 0) {
      // find_program saw the file, so ENOENT here means its "#!" interpreter is missing.
      const std::string hint = exec_errno == ENOENT ? " (is the interpreter on its #! line missing?)" : "";
      report("cannot run '" + spec_.command[0] + "' (rank " + std::to_string(r) + "): " + std::strerror(exec_errno) +
             hint);
      return 127;  // the destructor kills the ranks already started
    }
    ranks_[r] = {pid, true, false};
    rank_of_pid_[pid] = static_cast<int>(r);
    ++running_;
  }
  return 0;
}

pid_t Supervisor::spawn_rank(int r, int* exec_errno) {
  std::vector<char*> argv;
  for (std::string& arg : spec_.command) argv.push_back(arg.data());
  argv.push_back(nullptr);
  std::vector<char*> envp;
  for (std::string& entry : spec_.environments[r]) envp.push_back(entry.data());
  envp.push_back(nullptr);
  const std::string prefix = spec_.tag_output ? "[" + std::to_string(r) + "] " : "";
  // The write ends are the rank's; ours are closed on every path, so that EOF comes when it ends.
  WriteEnd out, err;
  for (auto [write_end, out_fd] : {std::pair{&out, STDOUT_FILENO}, std::pair{&err, STDERR_FILENO}}) {
    int fds[2];
    make_pipe(fds);
    write_end->fd = fds[1];
    streams_.push_back({r, fds[0], LineForwarder(prefix, out_fd)});
    ++open_streams_;
  }
  const ExecSpec exec{.program = spec_.command[0].c_str(),
                      .argv = argv.data(),
                      .envp = envp.data(),
                      .stdin_fd = r == 0 ? -1 : dev_null_,
                      .stdout_fd = out.fd,
                      .stderr_fd = err.fd,
                      .signal_mask = original_mask_,
                      .open_files = original_open_files_};
  return spawn(exec, exec_errno);
}

int Supervisor::poll_timeout_ms() const {
  std::optional<Clock::time_point> deadline;
  if (running_ > 0)
    deadline = grace_deadline_;
  else
    deadline = drain_deadline_;
  if (!deadline) return -1;
  const auto left = std::chrono::ceil<std::chrono::milliseconds>(*deadline - Clock::now()).count();
  return static_cast<int>(std::clamp<long long>(left, 0, 60'000));
}

void Supervisor::poll_once() {
  std::vector<pollfd> fds{{signal_fd_, POLLIN, 0}};
  std::vector<Stream*> streams;
  for (Stream& stream : streams_) {
    if (stream.fd < 0) continue;
    fds.push_back({stream.fd, POLLIN, 0});
    streams.push_back(&stream);
  }
  if (::poll(fds.data(), fds.size(), poll_timeout_ms()) < 0) {
    if (errno == EINTR) return;
    throw_errno("poll");
  }
  spawned_ = false;
  if (fds[0].revents != 0) handle_signals();
  if (spawned_) return;  // streams_ grew: the pointers above may be stale; the next poll reads
  for (std::size_t i = 0; i < streams.size(); ++i) {
    // A stream handle_signals drained to its end is closed already (fd -1).
    if (fds[i + 1].revents != 0 && streams[i]->fd >= 0) read_stream(*streams[i]);
  }
}

void Supervisor::handle_signals() {
  signalfd_siginfo info;
  bool child_exited = false;
  while (::read(signal_fd_, &info, sizeof info) == static_cast<ssize_t>(sizeof info)) {
    if (info.ssi_signo == SIGCHLD) {
      child_exited = true;
      continue;
    }
    if (info.ssi_signo == SIGUSR1) {
      spawn_joiner();
      continue;
    }
    on_signal(static_cast<int>(info.ssi_signo), info.ssi_code == SI_KERNEL);
  }
  if (child_exited) reap();
}

void Supervisor::on_signal(int signo, bool from_terminal) {
  if (running_ == 0) {
    drain_deadline_ = Clock::now();  // the user does not want to wait for stray output
    return;
  }
  if (received_signal_ != 0) {
    report("received " + signal_name(signo) + " again; killing the " + plural(running_, "running rank") + " (SIGKILL)");
    kill_running(SIGKILL);
    return;
  }
  received_signal_ = signo;
  report("received " + signal_name(signo) +
         (from_terminal ? " from the terminal, as did the " : "; forwarding it to the ") +
         plural(running_, "running rank") + " (send it again to kill them)");
  // The terminal (Ctrl-C) signals tutti-run's whole process group, the ranks included: only
  // ranks that left the group need it from us, or they would get it twice.
  const pid_t own_group = ::getpgrp();
  for (const Rank& rank : ranks_) {
    if (rank.running && (!from_terminal || ::getpgid(rank.pid) != own_group)) ::kill(rank.pid, signo);
  }
}

void Supervisor::reap() {
  // Collect every rank that has ended, then report those a signal ended first: a killed rank dies
  // before the others notice and exit, but waitpid returns ended children in no particular order,
  // and the first failure reported decides tutti-run's exit status.
  std::vector<std::pair<int, int>> ended;  // rank, wait status
  int status;
  pid_t pid;
  while ((pid = ::waitpid(-1, &status, WNOHANG)) > 0) {
    const auto it = rank_of_pid_.find(pid);
    if (it != rank_of_pid_.end()) ended.emplace_back(it->second, status);
    // Any other pid is an orphan of a rank, reparented to us: reaped, nothing to say.
  }
  std::stable_partition(ended.begin(), ended.end(), [](const auto& rank) { return WIFSIGNALED(rank.second); });
  for (const auto& [r, wait_status] : ended) on_rank_exit(r, wait_status);
}

void Supervisor::on_rank_exit(int r, int wait_status) {
  Rank& rank = ranks_[r];
  rank.running = false;
  --running_;
  // Forward what the rank wrote before it ended first, so that its last words precede the news.
  drain_stream(streams_[2 * r]);
  drain_stream(streams_[2 * r + 1]);
  const int code = exit_code(wait_status);
  if (code == 0) some_rank_succeeded_ = true;
  if (code != 0 && !rank.killed_by_us)
    report(describe_exit(r, rank.pid, wait_status) +
           (spec_.joiner.empty() || running_ == 0 ? "" : "; the elastic job goes on without it"));
  if (code != 0 && !first_failure_) {
    first_failure_ = code;
    if (spec_.joiner.empty()) start_grace_period(r);
  }
  if (running_ == 0) {
    grace_deadline_.reset();
    kill_leftovers();
    drain_deadline_ = Clock::now() + drain_limit;
  }
}

void Supervisor::start_grace_period(int failed_rank) {
  if (running_ == 0) return;
  report("rank " + std::to_string(failed_rank) + " failed; giving " + plural(running_, "other rank") + " " +
         format_seconds(spec_.grace_period_s) + " to finish (--grace-period)");
  grace_deadline_ =
      Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(spec_.grace_period_s));
}

void Supervisor::check_deadlines() {
  const Clock::time_point now = Clock::now();
  if (running_ > 0 && grace_deadline_ && now >= *grace_deadline_) {
    grace_deadline_.reset();
    std::string list;
    for (std::size_t r = 0; r < ranks_.size(); ++r) {
      if (ranks_[r].running) list += (list.empty() ? "" : ", ") + std::to_string(r);
    }
    report("killing (SIGKILL) the " + plural(running_, "rank") + " still running after the grace period: " + list);
    kill_running(SIGKILL);
  }
  if (running_ == 0 && drain_deadline_ && now >= *drain_deadline_ && open_streams_ > 0) {
    report("closing the ranks' output, still held open after the last rank exited");
    for (Stream& stream : streams_) {
      if (stream.fd >= 0) close_stream(stream);
    }
  }
}

void Supervisor::kill_running(int signo) {
  for (Rank& rank : ranks_) {
    if (!rank.running) continue;
    if (signo == SIGKILL) rank.killed_by_us = true;
    ::kill(rank.pid, signo);
  }
}

void Supervisor::kill_leftovers() {
  std::unordered_set<pid_t> killed;
  const Clock::time_point deadline = Clock::now() + leftover_limit;
  for (;;) {
    reap_orphans();
    const std::vector<pid_t> children = list_children();
    if (children.empty() || Clock::now() >= deadline) break;
    for (pid_t pid : children) {
      if (::kill(pid, SIGKILL) == 0) killed.insert(pid);
    }
    ::poll(nullptr, 0, 2);  // let the kernel finish the exits before reaping
  }
  if (!killed.empty())
    report("killed " + plural(static_cast<int>(killed.size()), "process") + " the ranks left behind");
}

bool Supervisor::read_stream(Stream& stream) {
  char buffer[64 * 1024];
  for (;;) {
    const ssize_t n = ::read(stream.fd, buffer, sizeof buffer);
    if (n > 0) {
      if (!stream.forwarder.append(buffer, static_cast<std::size_t>(n)) && errno == EPIPE) {
        close_output(static_cast<int>(&stream - streams_.data()) % 2);
        return false;
      }
      return true;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return false;
    close_stream(stream);  // end of stream, or an error that ends it just as well
    return false;
  }
}

void Supervisor::drain_stream(Stream& stream) {
  // Bounded: a leftover process may hold the pipe and keep writing.
  for (int i = 0; i < 32 && stream.fd >= 0 && read_stream(stream); ++i) {
  }
}

void Supervisor::close_output(int parity) {
  // Nobody reads our stdout (or stderr) any more, as in "tutti-run ... | head": pass the broken
  // pipe on to the ranks, whose next write then fails as it would without tutti-run between.
  for (std::size_t i = static_cast<std::size_t>(parity); i < streams_.size(); i += 2) {
    if (streams_[i].fd < 0) continue;
    ::close(streams_[i].fd);
    streams_[i].fd = -1;
    --open_streams_;
  }
}

void Supervisor::close_stream(Stream& stream) {
  stream.forwarder.flush();
  ::close(stream.fd);
  stream.fd = -1;
  --open_streams_;
}

}  // namespace tutti::launcher
