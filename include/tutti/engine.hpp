// The training engine: named tensors, agreement across ranks, fusion, a timeline, stall checks.
//
// Framework-agnostic (libtorch glue is in <tutti/torch.hpp>). A training step enqueues each
// gradient the moment it is ready, under a name that is the same on every rank:
//
//   tutti::Engine engine(comm);                        // collective: every rank constructs one
//   auto h = engine.enqueue_allreduce("fc1.weight", grad, n, tutti::DataType::f32, tutti::ReduceOp::avg);
//   ...                                                // backward goes on; the allreduce runs meanwhile
//   h.wait();                                          // grad now holds the average over ranks
//
// Every `cycle_time`, a background thread exchanges with the other ranks which names each rank
// has enqueued: names seen before (the response cache) as one count each in one small allreduce
// whose size does not grow with the ranks; new names, new shapes and stalls in a full exchange of
// descriptions, only in the cycles that have them (docs/training.md). A tensor is ready
// when every rank has enqueued it; every rank then sees the same list of ready tensors and runs
// them in the same order, whatever order the ranks enqueued them in. Ready allreduces of the same
// type and op are packed into a fusion buffer and reduced in one call.
//
// The engine uses its own communicator (split from the one it is given), so the caller may go
// on using `comm`. Destroy the engine on every rank: destruction is collective too.
//
// Device tensors: an engine constructed with a gpu::Communicator also takes device buffers
// enqueued on a stream (enqueue_allreduce with a gpu::Stream). The call returns at once, the
// allreduce runs after the work enqueued on the stream before the call, and the work enqueued
// after it sees the result; the tensor is negotiated, fused (with host tensors too) and reduced
// like any other, through pinned staging (docs/training.md, "Device tensors on a stream").
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "tutti/gpu.hpp"
#include "tutti/tutti.hpp"

namespace tutti {

namespace engine {
struct TensorState;
class EngineCore;
}  // namespace engine

struct EngineOptions {
  /// How often the background thread negotiates (TUTTI_CYCLE_TIME_MS, may be fractional).
  std::chrono::microseconds cycle_time{1000};
  /// Largest fused message in bytes (TUTTI_FUSION_THRESHOLD). 0 disables fusion.
  std::size_t fusion_threshold = 64u << 20;
  /// Cap of the first fused message of a step (TUTTI_FIRST_BUCKET_BYTES), so that
  /// communication starts early; a step begins when the engine had nothing ready.
  std::size_t first_bucket_bytes = 1u << 20;
  /// A tensor enqueued by some ranks but not others for this long is reported, with the
  /// ranks that are missing (TUTTI_STALL_WARNING_S). 0 disables the warning.
  std::chrono::milliseconds stall_warning{60'000};
  /// After this long the tensor fails on every rank that enqueued it with ErrorCode::timeout
  /// (TUTTI_STALL_SHUTDOWN_S). 0 (the default) waits for ever, warning every `stall_warning`.
  std::chrono::milliseconds stall_error{0};
  /// Chrome-trace file (TUTTI_TIMELINE). Empty: no timeline. Rank 0 writes it; a path containing
  /// "{rank}" is written by every rank with its rank substituted.
  std::string timeline_path;
  /// The rank the timeline goes by (the "{rank}" of its file, "rank 0 writes it", and its pid);
  /// -1 (the default): the engine's communicator's rank. An engine on a sub-communicator (a
  /// data-parallel group of a model-parallel job) sets the rank in the whole job, so that every
  /// rank's trace is its own.
  int timeline_rank = -1;
  /// Called with each stall report (besides the log line); for tests and frameworks.
  std::function<void(const std::string&)> on_stall;

  /// The defaults above, overridden by the TUTTI_* variables that are set. A malformed value
  /// is an Error(invalid_argument) naming the variable.
  static EngineOptions from_environment();
};

/// The handle of an enqueued tensor. Copies share the same tensor.
class Handle {
 public:
  Handle() = default;  // an empty handle: already complete
  /// Blocks until the tensor's collective has completed and its result is in place (a device
  /// tensor: its stream has copied the result into the device buffer, so the wait also covers the
  /// stream's work enqueued before the tensor); throws the tensor's Error (mismatch, timeout,
  /// peer_failure, aborted) at once, without waiting for a device tensor's stream.
  void wait();
  /// True when complete; throws the tensor's Error. Never blocks.
  bool test();
  /// Like wait, but gives up after `duration` and returns false.
  bool wait_for(std::chrono::milliseconds duration);

  explicit Handle(std::shared_ptr<engine::TensorState> state) : state_(std::move(state)) {}

 private:
  std::shared_ptr<engine::TensorState> state_;
};

/// Cumulative counters of an engine's work (since construction).
struct EngineStats {
  std::uint64_t tensors = 0;       ///< tensors completed
  std::uint64_t collectives = 0;   ///< collective calls made for them (fused messages count once)
  std::uint64_t bytes = 0;         ///< bytes of tensor data those calls reduced, gathered or broadcast
  std::uint64_t cycles = 0;        ///< negotiation rounds
  double collective_seconds = 0;   ///< time spent inside those calls
  double negotiation_seconds = 0;  ///< time spent negotiating
};

/// One collective call the engine made (for overlap accounting).
struct CollectiveRecord {
  std::chrono::steady_clock::time_point start, end;
  std::size_t bytes = 0;
  std::size_t tensors = 0;
};

class Engine {
 public:
  /// Collective over `comm`: every rank must construct its engine.
  explicit Engine(Communicator& comm, EngineOptions options = EngineOptions::from_environment());
  /// The same, and device tensors on streams of `gpu`'s device are accepted (its device only is
  /// used: its staging memory and flags; not its progress thread). `gpu` must outlive the engine,
  /// and handles of device tensors must not be waited on once `gpu` is gone.
  /// Error(invalid_argument) if `gpu` was moved from.
  Engine(Communicator& comm, gpu::Communicator& gpu, EngineOptions options = EngineOptions::from_environment());
  /// Collective: waits for every rank's engine to stop. Tensors still pending fail with
  /// ErrorCode::aborted, and every stream waiting on a device tensor is released (never waits for
  /// a stream; a device buffer whose allreduce did not run keeps undefined contents).
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  int rank() const;
  int size() const;

  /// recv = op over ranks of send (count elements). In place: send == recv. Returns at once;
  /// the buffers must stay valid, and unchanged, until the handle completes. `name` must be
  /// unique among this rank's pending tensors and mean the same tensor on every rank; the
  /// same name with another count, type or op on another rank is an ErrorCode::mismatch on
  /// every rank, naming the ranks and both shapes.
  Handle enqueue_allreduce(std::string_view name, const void* send, void* recv, std::size_t count, DataType type,
                           ReduceOp op);
  Handle enqueue_allreduce(std::string_view name, void* buffer, std::size_t count, DataType type, ReduceOp op) {
    return enqueue_allreduce(name, buffer, buffer, count, type, op);
  }
  /// The same for a tensor of shape `dims` (count: their product; at most 64 dimensions, none
  /// negative, else Error(invalid_argument)): the ranks also agree on the shape, so the same name
  /// with other dims on another rank is an ErrorCode::mismatch even where the counts agree
  /// (Horovod's check: [17, 1311] and [17, 23, 57] are not the same tensor).
  Handle enqueue_allreduce(std::string_view name, const void* send, void* recv, std::span<const std::int64_t> dims,
                           DataType type, ReduceOp op);
  /// A device tensor: as above, with `send` and `recv` in memory of the engine's device and the
  /// allreduce enqueued on `stream` (a cudaStream_t, or a stream of the gpu::Communicator).
  /// Returns at once, never waiting for the stream or the device: the allreduce starts after
  /// everything enqueued on `stream` before the call, and everything enqueued on it after the
  /// call sees the result. The tensor is announced to the other ranks once its stream has reached
  /// it, and may be fused with host tensors. The buffers must stay valid until the stream has
  /// copied the result back (Handle::wait returns then). Errors at once, enqueueing nothing:
  /// invalid_argument for an engine without a device, a buffer outside device memory, or the host
  /// overload's errors. A failure after the call returned (mismatch, stall limit, a peer's
  /// failure, the engine's destruction) still releases the stream, leaves recv undefined, and is
  /// raised by the handle, by check() and by every later call with a stream (which then enqueues
  /// nothing).
  Handle enqueue_allreduce(std::string_view name, const void* send, void* recv, std::size_t count, DataType type,
                           ReduceOp op, gpu::Stream stream);
  Handle enqueue_allreduce(std::string_view name, void* buffer, std::size_t count, DataType type, ReduceOp op,
                           gpu::Stream stream) {
    return enqueue_allreduce(name, buffer, buffer, count, type, op, stream);
  }
  /// Raises the engine's failure (it stopped on an error), or the first failure of a device
  /// tensor, if any. Never blocks.
  void check();

  /// recv (size() * count elements) gets every rank's `count` elements, in rank order.
  Handle enqueue_allgather(std::string_view name, const void* send, void* recv, std::size_t count, DataType type);
  /// Copies root's buffer to every rank's.
  Handle enqueue_broadcast(std::string_view name, void* buffer, std::size_t count, DataType type, int root);

  /// Horovod's join: this rank has no more tensors to enqueue until every rank has joined. Until
  /// then it takes part in the other ranks' allreduces with zeros (an average still divides by
  /// size()), and their allgathers and broadcasts fail with ErrorCode::mismatch naming the joined
  /// ranks. The handle completes once every rank has joined; last_joined() then gives the rank
  /// that joined last (the highest of those that joined in the same negotiation round). Returns at
  /// once. Error(invalid_argument) while this rank has tensors pending or has joined already.
  Handle join();
  /// After a completed join: the rank that joined last; -1 before any.
  int last_joined() const;

  /// Wakes the background thread for a negotiation round now rather than at the next cycle
  /// (used when the caller is about to wait).
  void flush();

  /// Records a phase of the training step (e.g. "BACKWARD", "OPTIMIZER") on the timeline.
  void record_phase(std::string_view name, std::chrono::steady_clock::time_point start,
                    std::chrono::steady_clock::time_point end);

  /// Starts writing the timeline to `path` while the engine runs (Horovod's start_timeline). The
  /// file is chosen as for EngineOptions::timeline_path (and timeline_rank): rank 0 writes `path`
  /// and the other ranks nothing, unless it contains "{rank}" (then every rank writes its own);
  /// an empty path writes none. The timeline written until now, if any (from the options or an
  /// earlier call), is closed, complete. With `mark_cycles`, each negotiation round is an instant
  /// event CYCLE_START on the "step" lane. Not collective: ranks may start and stop at other
  /// times. Any thread, any time; operations in flight appear from the phase they are in.
  /// Error(invalid_argument) naming the file when it cannot be written; the running timeline
  /// then goes on (unless it was that same file).
  void start_timeline(const std::string& path, bool mark_cycles = false);
  /// Closes the timeline being written, complete (a JSON array), before returning; nothing is
  /// written after it. Nothing to do without one.
  void stop_timeline();

  EngineStats stats() const;
  /// The collective calls completed since the previous call (allreduces only).
  std::vector<CollectiveRecord> take_allreduce_records();

  const EngineOptions& options() const;

 private:
  std::unique_ptr<engine::EngineCore> core_;
};

}  // namespace tutti
