// The Work of the torch.distributed backend "tutti": one Tutti request, completed asynchronously.
//
// A WorkTutti completes once, by whichever thread sees its request finish first: the caller in
// wait() or isCompleted(), or the process group's WorkProgress thread, which marks the futures
// that DDP and torch.futures wait on. Completing runs the work's finalize step (copies from a
// contiguous staging buffer back into the caller's tensors), then completes the future with the
// outputs (or the error), then the Work itself.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include <ATen/core/ivalue.h>
#include <torch/version.h>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include "common/storage_pin.hpp"
#include "tutti/tutti.hpp"

namespace tutti::c10d_backend {

/// The name of an operation of type `type` in profiler traces, "tutti:all_reduce" as Gloo's
/// "gloo:all_reduce": c10d::Work records it (a RecordFunction begun when the work is created, while
/// a profiler is on, and ended by finish()).
const char* profiling_title(::c10d::OpType type);

class WorkTutti : public ::c10d::Work {
 public:
  /// The `source_rank` of a receive from any source: the sender is the request's once it completed.
  static constexpr int source_of_request = -2;
  /// `outputs` become the future's value; the storages of `keep` (the buffers `request` uses:
  /// staging buffers, or the caller's tensors themselves) are pinned until the work completes, so
  /// that their memory stays valid whatever the caller does to the tensors meanwhile (set_, del;
  /// resize_ raises); `finalize` runs once the request has succeeded. `source_rank` is the peer of
  /// a receive (-1 otherwise; source_of_request for a receive from any source).
  WorkTutti(int rank, ::c10d::OpType type, tutti::Request request, std::vector<at::Tensor> outputs,
            std::vector<at::Tensor> keep, std::function<void()> finalize, int source_rank = -1);
  /// What a work waits on when it is not one tutti::Request (a sparse allreduce, which runs on a
  /// thread of its own): true once the operation is done, after waiting at most `limit` (0: a
  /// test); raises the operation's error. Called by several threads at once.
  using Wait = std::function<bool(std::chrono::milliseconds limit)>;
  /// The work of an operation `wait` reports on; the rest as above.
  WorkTutti(int rank, ::c10d::OpType type, Wait wait, std::vector<at::Tensor> outputs, std::vector<at::Tensor> keep,
            std::function<void()> finalize);

  /// Nonblocking: true once the request completed (and this work with it).
  bool isCompleted() override;
  /// Blocks until the request completes, then raises its error if any. A `timeout` other than
  /// kNoTimeout bounds the wait: past it, raises tutti's timeout error (the request goes on).
  bool wait(std::chrono::milliseconds timeout = kNoTimeout) override;
  /// CPU tensors: nothing to synchronize.
  void synchronize() override {}
  std::vector<at::Tensor> result() override { return outputs_; }
  int sourceRank() const override;
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return future_; }

  /// For WorkProgress: waits at most `limit` for the request; true once this work is complete.
  bool progress_for(std::chrono::milliseconds limit);

 private:
  /// Completes the work exactly once; a second caller waits for the first to finish it.
  void complete(std::exception_ptr error);
  /// True when complete: at once if it already was, else when `poll` says the request finished
  /// (then completes the work) or throws (then fails it with that error).
  bool settle(const std::function<bool()>& poll);

  tutti::Request request_;
  Wait wait_;  // instead of request_, where set
  std::vector<at::Tensor> outputs_;
  std::vector<tutti_python::StoragePin> keep_;
  std::function<void()> finalize_;
  int source_rank_;
  std::chrono::steady_clock::time_point issued_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
  std::atomic<int> state_{0};  // 0 running, 1 completing, 2 complete
};

/// One thread per process group that completes the works nobody waits on, so that their futures
/// (DDP's buckets, torch.futures callbacks) complete without the caller polling. It sleeps in
/// Tutti's own wait on the oldest work, then sweeps the rest; with no work it sleeps on a
/// condition variable.
///
/// The thread may drop the last reference to a work, and with it to tensors that have Python
/// objects: that takes the GIL. Once the interpreter is finalizing, taking the GIL ends the thread
/// by a forced unwind, which std::terminate()s at the first noexcept frame (a destructor). So
/// tutti.distributed calls stop_all() at exit (Python's atexit, while the interpreter is whole):
/// every thread is joined, and none starts after.
class WorkProgress {
 public:
  WorkProgress();
  ~WorkProgress();
  WorkProgress(const WorkProgress&) = delete;
  WorkProgress& operator=(const WorkProgress&) = delete;

  /// Takes `work` until it completes. Once stopped, it does not: a work is then completed by
  /// whoever waits on it or tests it.
  void add(c10::intrusive_ptr<WorkTutti> work);

  /// Stops and joins every group's thread, and no later group starts one (call it without the GIL:
  /// a thread may need it to finish).
  static void stop_all();

 private:
  void run();
  void stop();

  std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<c10::intrusive_ptr<WorkTutti>> pending_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace tutti::c10d_backend
