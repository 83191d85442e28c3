// The watchdog of the backends that run on the streams alone (ipc, nccl): one thread per rank
// that, for each operation in issue order,
//   1. compares the call across ranks as soon as it is posted (check_same_call over the backend's
//      private host communicator: a mismatch is named, a silent rank times out there). The
//      comparisons are owed to the peers, so they are made even while the watchdog stops; once a
//      failure is known here they end (a peer may never issue the operation). The backend hears
//      each verdict (ipc's streams wait for it);
//   2. then follows the operation on this rank's stream until the backend says it is done: a
//      stream that does not finish it within the operation's timeout after reaching it, a peer
//      process of this host that died (looked at every liveness_period), or a failure the backend
//      notices itself (a failure a peer published; NCCL's asynchronous error) fails it.
// Failing records the first failure (check() raises it from then on, on the caller's thread) and
// has the backend release every stream that may wait on its operations.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "gpu/backend.hpp"
#include "gpu/host_transfer.hpp"

namespace tutti::gpu::detail {

class Watchdog {
 public:
  struct Operation {
    std::uint32_t n = 0;  // the operation's number, from 1 in issue order
    DeviceCall call;
    std::uint32_t first = 0, last = 0;  // the backend's marks of it on the stream (ipc: its steps)
  };

  /// What a backend tells its watchdog; called on the watchdog's thread unless said otherwise.
  class Watched {
   public:
    virtual ~Watched() = default;
    /// "ipc allreduce (operation 3)"
    virtual std::string describe(const Operation& op) const = 0;
    /// Whether this rank's stream reached `op`, and whether it finished it.
    virtual bool stream_reached(const Operation& op) const = 0;
    virtual bool stream_done(const Operation& op) const = 0;
    /// A failure the backend finds by itself, or none; `op` is the operation followed (nullptr
    /// when asked from check() or between operations). Also called on the caller's thread.
    virtual std::optional<Error> noticed(const Operation* op) = 0;
    /// After `op`'s comparison across ranks, whatever its verdict (`failed`: a failure is known).
    virtual void compared(const Operation& op, bool failed) = 0;
    /// Text added to a timeout's message (the late ranks), or "".
    virtual std::string late(const Operation& op) const = 0;
    /// A failure was recorded (this one or an earlier one): release every stream that may wait on
    /// this backend's operations. Called on whichever thread failed, possibly more than once.
    virtual void release(const Error& error) = 0;
    /// Whether to keep following an operation after a failure until this rank's stream is done
    /// with it (releasing again at each look), rather than leave it at once.
    virtual bool follow_after_failure() const = 0;
  };

  /// `pids`: every rank's process id where it is on this host, else 0 (not looked at).
  Watchdog(Watched& backend, tutti::Communicator& host, std::vector<std::int64_t> pids);
  /// Stops the thread (see stop).
  ~Watchdog();
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

  /// Hands an issued operation to the thread (caller's thread, in issue order).
  void post(Operation op);
  /// Makes the comparisons still owed, then ends the thread: operations posted are no longer
  /// followed. Idempotent.
  void stop();

  /// Records `error` (the first recorded wins), prefixed "tutti::gpu: ", and has the backend
  /// release its streams.
  void fail(const Error& error);
  /// Whether a failure is recorded, taking up one the backend noticed first.
  bool failed();
  /// Whether a failure is recorded (nothing else is looked at).
  bool recorded() const { return failures_.failed(); }
  /// Raises the recorded failure, taking up one the backend noticed first (never blocks for long).
  void check();

 private:
  struct Watch {
    Operation op;
    std::optional<std::chrono::steady_clock::time_point> reached_at;  // when the stream got to it
    std::chrono::steady_clock::time_point next_liveness = std::chrono::steady_clock::now();
  };
  void run();
  void compare(const Operation& op);
  /// One look at `w`: true once the watchdog is through with it.
  bool look(Watch& w);

  Watched& backend_;
  tutti::Communicator& host_;
  const std::vector<std::int64_t> pids_;
  const int rank_;
  FailureRecord failures_;
  std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<Operation> posted_;  // under mutex_
  bool stopping_ = false;         // under mutex_
  std::thread thread_;            // last: starts once the rest is built
};

}  // namespace tutti::gpu::detail
