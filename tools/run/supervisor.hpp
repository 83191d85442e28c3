// The supervisor of a tutti-run job: starts the ranks, forwards their output and tutti-run's
// signals, ends the job when a rank fails, and leaves no process behind.
//
// Everything happens in one poll() loop over a signalfd (SIGINT, SIGTERM, SIGHUP, SIGCHLD) and
// one pipe per rank and stream. The life of a job:
//   1. start the ranks one after the other; if one cannot execute, kill the others (exit 127);
//   2. run until every rank has exited. The first rank that fails (non-zero status or a
//      signal) starts the grace period; when it ends, the ranks still running get SIGKILL (an
//      elastic job goes on instead, and SIGUSR1 starts a rank that joins it).
//      A first SIGINT/SIGTERM/SIGHUP is forwarded to the ranks; a second one kills them;
//   3. kill whatever the ranks left behind (tutti-run is a child subreaper, so orphans of the
//      ranks become its children), then drain the pipes (bounded) and reap every child.
#pragma once

#include <signal.h>
#include <sys/resource.h>
#include <sys/types.h>

#include <chrono>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "output.hpp"

namespace tutti::launcher {

struct LaunchSpec {
  std::vector<std::string> command;                    // PROGRAM ARGS...
  std::vector<std::vector<std::string>> environments;  // one per rank
  double grace_period_s = 10;
  bool tag_output = true;
  /// An elastic job's joiner environment (empty: not elastic). A failed rank then does not end the
  /// job, and SIGUSR1 starts a rank with this environment.
  std::vector<std::string> joiner;
};

/// Blocks SIGINT, SIGTERM, SIGHUP, SIGCHLD and SIGUSR1, so that they wait for the supervisor's signalfd
/// instead of killing tutti-run before it cleans up. Returns the mask tutti-run started with.
sigset_t block_job_signals();

class Supervisor {
 public:
  /// Opens the signalfd and makes tutti-run a child subreaper; `original_mask` is what
  /// block_job_signals returned (the ranks get it back). Throws std::system_error.
  Supervisor(LaunchSpec spec, const sigset_t& original_mask);
  /// Kills (SIGKILL) and reaps every process still running, on every path, errors included.
  ~Supervisor();
  Supervisor(const Supervisor&) = delete;
  Supervisor& operator=(const Supervisor&) = delete;

  /// Runs the job to its end; returns tutti-run's exit status (see --help).
  int run();

 private:
  using Clock = std::chrono::steady_clock;

  struct Rank {
    pid_t pid = -1;
    bool running = false;
    bool killed_by_us = false;  // SIGKILL after the grace period or a second signal
  };
  struct Stream {
    int rank = 0;
    int fd = -1;  // read end of the rank's pipe; -1 at EOF
    LineForwarder forwarder;
  };

  void setup_signals();
  void drain_stream(Stream& stream);
  void raise_open_file_limit(std::size_t needed);
  int spawn_all();
  void spawn_joiner();
  /// Starts rank `rank` of the command with its environment; -1 and *exec_errno if it cannot.
  pid_t spawn_rank(int rank, int* exec_errno);
  void poll_once();
  int poll_timeout_ms() const;
  void handle_signals();
  void on_signal(int signo, bool from_terminal);
  void reap();
  void on_rank_exit(int rank, int wait_status);
  void start_grace_period(int failed_rank);
  void check_deadlines();
  void kill_running(int signo);
  void kill_leftovers();
  bool read_stream(Stream& stream);
  void close_stream(Stream& stream);
  void close_output(int parity);  // 0: every rank's stdout, 1: stderr

  LaunchSpec spec_;
  int signal_fd_ = -1;
  int dev_null_ = -1;
  sigset_t original_mask_{};
  rlimit original_open_files_{};
  std::vector<Rank> ranks_;
  std::vector<Stream> streams_;  // 2 * rank: stdout, 2 * rank + 1: stderr
  std::unordered_map<pid_t, int> rank_of_pid_;
  int running_ = 0;
  int open_streams_ = 0;
  std::optional<int> first_failure_;  // exit code of the first rank that failed
  bool some_rank_succeeded_ = false;  // an elastic job succeeds when some rank does
  bool spawned_ = false;              // streams_ grew while handling signals
  int received_signal_ = 0;           // first SIGINT/SIGTERM/SIGHUP received, 0 if none
  std::optional<Clock::time_point> grace_deadline_;
  std::optional<Clock::time_point> drain_deadline_;
};

}  // namespace tutti::launcher
