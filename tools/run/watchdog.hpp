// The watchdog of a tutti-run job: a small process that ends what the job left running, and
// removes its files, when tutti-run ends without doing so itself (killed with SIGKILL, a crash).
//
// PR_SET_PDEATHSIG reaches the ranks only, not their children: a rank that is a wrapper script
// would leave the real program running. The watchdog finds the job's processes by the secret
// TUTTI_TOKEN in their environment (every rank has it, and every descendant that kept its
// environment), and their descendants. Being a secret, it names no stranger, not even one that got
// a pid of the job again. (Not a process group per rank: ranks outside tutti-run's group would stop
// on reading the terminal and miss Ctrl-Z, and a program may leave its group anyway.)
//
// tutti-run holds the write end of a pipe, the watchdog its read end: when the pipe reaches EOF
// without a word from tutti-run first, whatever ended tutti-run, the watchdog sends SIGTERM to the
// job's processes, SIGKILL to those left after 2 s, removes the store directory and the /dev/shm
// entries, and exits. At a normal end it first gives the job's processes still running up to 3 s
// to end by themselves (a rank started by hand that joined an elastic job finishes with the
// others, a moment later), then ends what is left the same way. It runs in a session of its own
// and ignores SIGINT, SIGTERM and SIGHUP, so that Ctrl-C, or a kill of tutti-run's process group,
// does not take it away before it acts.
#pragma once

#include <string>

#include "job.hpp"

namespace tutti::launcher {

class Watchdog {
 public:
  /// Starts the watchdog of `job` (not a child of tutti-run, so that the supervisor's clean-up of
  /// its children leaves it alone). Throws std::system_error if it cannot start.
  explicit Watchdog(const Job& job);
  /// Tells the watchdog that tutti-run ends normally, and waits (at most 10 s) until it has
  /// checked that no process of the job is left.
  ~Watchdog();
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

 private:
  int to_watchdog_ = -1;    // write end: EOF tells the watchdog that tutti-run has ended
  int from_watchdog_ = -1;  // read end: EOF tells tutti-run that the watchdog has finished
};

/// Ends every process of the job whose secret is `token`: SIGTERM, then SIGKILL to those still
/// running after 2 s, for at most 5 s in all. Returns how many processes it signalled.
int end_job_processes(const std::string& token);

}  // namespace tutti::launcher
