// libtorch glue: DistributedOptimizer, which averages gradients over the ranks through the
// training engine, overlapping the allreduces with backward.
// Part of <tutti/torch.hpp> (the library Tutti::torch: src/libtorch/optimizer.cpp); CPU tensors only.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/optim/optimizer.h>

#include "tutti/compress.hpp"
#include "tutti/engine.hpp"
#include "tutti/torch_checkpoint.hpp"  // CheckpointMetadata
#include "tutti/tutti.hpp"

namespace tutti::libtorch {

namespace detail {

class CheckpointWriter;
struct CheckpointExtras;

/// What `grad_accumulator` returns: a std::shared_ptr of the node up to torch 2.x's later releases,
/// a c10::intrusive_ptr since. Held to keep the node, and the hook on it, alive.
using GradAccumulatorPtr = decltype(torch::autograd::impl::grad_accumulator(std::declval<const at::Tensor&>()));

/// Calls `on_ready` after AccumulateGrad has added a backward pass's gradient to `param.grad()`.
class GradReadyHook final : public torch::autograd::FunctionPostHook {
 public:
  explicit GradReadyHook(std::function<void()> on_ready) : on_ready_(std::move(on_ready)) {}
  torch::autograd::variable_list operator()(const torch::autograd::variable_list& outputs,
                                            const torch::autograd::variable_list& /*inputs*/) override {
    on_ready_();
    return outputs;
  }

 private:
  std::function<void()> on_ready_;
};

}  // namespace detail

struct DistributedOptions {
  /// Reduce each gradient as soon as backward has produced it (true), or all of them in step().
  bool overlap = true;
  /// Backward passes accumulated locally per optimizer step (gradient accumulation).
  int backward_passes_per_step = 1;
  /// The engine's settings; `engine.fusion_threshold` bounds a fused allreduce.
  EngineOptions engine = EngineOptions::from_environment();
  /// How gradients travel (docs/training.md, "Compression"): none (the engine's allreduce), fp16,
  /// bf16, qsgd:BITS, powersgd:RANK or topk:RATIO (compress::Compression). Every rank must pass
  /// the same. fp16 and bf16 go through the engine like none; the others are reduced in step(),
  /// not during backward (see reduce_compressed).
  compress::Compression compression;
  /// Seeds QSGD's coins and PowerSGD's first Q: the same on every rank, so that runs reproduce.
  std::uint64_t compression_seed = 0;
  /// The module's buffers (running statistics: module->named_buffers()), by name: never reduced,
  /// but checkpoints save them with the parameters and load_checkpoint restores them (a checkpoint
  /// without one of them is refused, Error(mismatch)).
  std::vector<std::pair<std::string, torch::Tensor>> buffers;
  /// Checkpoints save each rank's CPU generator state (cpu_generator_state) and load_checkpoint
  /// gives it back, so that randomness (dropout, sampling) goes on as it would have.
  bool checkpoint_generator = true;

  /// The 16-bit wire type of fp16 and bf16; DataType::f32 for the other compressions.
  DataType wire_type() const {
    using Kind = compress::Compression::Kind;
    return compression.kind == Kind::fp16   ? DataType::f16
           : compression.kind == Kind::bf16 ? DataType::bf16
                                            : DataType::f32;
  }
  /// Whether gradients are reduced in step() by a compress::GradientCompressor.
  bool compression_in_step() const {
    return compression.kind != compress::Compression::Kind::none && wire_type() == DataType::f32;
  }
};

/// Where the communication time of the steps went (seconds summed over steps).
struct OverlapStats {
  double allreduce_seconds = 0;  ///< inside the engine's allreduce calls
  double hidden_seconds = 0;     ///< of those, before backward ended (overlapped with compute)
  double wait_seconds = 0;       ///< step(), from the end of backward until the gradients were reduced
  std::uint64_t bytes = 0;       ///< bytes the allreduces reduced
  std::uint64_t steps = 0;       ///< optimizer steps taken
};

/// Wraps a libtorch optimizer so that step() applies gradients averaged over the ranks.
///
/// Gradients are AVERAGED over ranks and SUMMED over the `backward_passes_per_step` backward
/// passes of an accumulation window (scale the loss by 1/backward_passes_per_step for a mean).
/// Every rank must call zero_grad/backward/step in the same pattern; construction and
/// destruction are collective (they build and stop an Engine). Parameters that do not require
/// grad are ignored; the others must be CPU leaf tensors with unique names that mean the same
/// tensor on every rank, and must include every parameter the optimizer updates.
class DistributedOptimizer {
 public:
  /// Errors: Error(invalid_argument) for a duplicate or empty name, an undefined, non-leaf or
  /// non-CPU tensor, an unsupported type (with compression: any type but f32),
  /// backward_passes_per_step < 1, or an optimizer parameter missing from `named_parameters`.
  DistributedOptimizer(Communicator& comm, torch::optim::Optimizer& optimizer,
                       std::vector<std::pair<std::string, torch::Tensor>> named_parameters,
                       DistributedOptions options = {});

  /// Collective (destroys the engine); gradients still in flight are abandoned.
  ~DistributedOptimizer();
  DistributedOptimizer(const DistributedOptimizer&) = delete;
  DistributedOptimizer& operator=(const DistributedOptimizer&) = delete;

  /// Counts a backward pass; on the last pass of an accumulation window, completes the
  /// allreduce of every gradient (enqueueing those backward did not, with zeros for gradients
  /// that are undefined) and steps the wrapped optimizer. On the other passes it only counts.
  /// Throws the engine's Error for a failed allreduce (after waiting for all of them).
  void step();

  /// Checkpoints the parameters, the optimizer's state and param groups' options, the optimizer
  /// step count ("optimizer_steps") and `metadata` into directory `path` (created; it must not
  /// hold a checkpoint yet): docs/training.md, "Checkpoints". Call it on every rank after step(),
  /// with the same path and metadata. It waits for the previous checkpoint's write, copies this
  /// rank's share (about 1/size() of the bytes) and returns; a thread writes the share while the
  /// next steps compute, and rank 0 publishes the checkpoint (its MANIFEST) once every rank's
  /// share is on disk. Errors: Error(invalid_argument) within an accumulation window or for a bad
  /// path or metadata (detail::snapshot_checkpoint), Error(system) for a directory it cannot make,
  /// Error(unsupported) for an optimizer whose state it cannot take apart (a rank that throws
  /// these writes nothing, and the other ranks' checkpoint fails); a failed write (unwritable
  /// directory, full disk, a failed rank) as Error from the next checkpoint_async, checkpoint or
  /// wait_checkpoint.
  void checkpoint_async(const std::string& path, CheckpointMetadata metadata = {});
  /// checkpoint_async and wait_checkpoint: the same checkpoint, written before it returns.
  void checkpoint(const std::string& path, CheckpointMetadata metadata = {});
  /// Returns when the last checkpoint is published on every rank; throws the error of its write.
  void wait_checkpoint();
  /// Collective: restores the checkpoint in directory `path` into the parameters and the
  /// optimizer, and returns its metadata. It refuses, on every rank and before changing anything,
  /// a checkpoint that is incomplete or damaged (Error(invalid_argument)) or was written by
  /// another number of ranks, for another optimizer type or another model (names, types, shapes:
  /// Error(mismatch)). See detail::load_checkpoint.
  CheckpointMetadata load_checkpoint(const std::string& path);
  /// Optimizer steps taken (or restored by load_checkpoint).
  std::uint64_t optimizer_steps() const { return optimizer_steps_; }

  /// Completes the gradients' allreduce without stepping (e.g. to clip them before step());
  /// the next step() then does not reduce again. Call it after the window's last backward pass.
  void synchronize();

  /// The wrapped optimizer's zero_grad, at the start of an accumulation window only: within a
  /// window it does nothing, so a loop calling zero_grad/backward/step every pass accumulates.
  /// Error(invalid_argument) while gradients are being reduced (backward without step()).
  void zero_grad();

  Engine& engine() { return engine_; }
  torch::optim::Optimizer& optimizer() { return optimizer_; }
  /// The compressor that reduces gradients in step() (qsgd, topk, powersgd), whose memory
  /// (save_state, load_state) a job that goes on needs; nullptr without one (none, fp16, bf16:
  /// nothing to remember).
  compress::GradientCompressor* compressor() { return compressor_.get(); }
  const DistributedOptions& options() const { return options_; }

  OverlapStats overlap_stats() const { return stats_; }
  void reset_overlap_stats() { stats_ = {}; }

 private:
  struct Param {
    std::string name;
    torch::Tensor tensor;
    detail::GradAccumulatorPtr accumulator;  // kept alive: the hook lives on it
    std::uintptr_t hook_key = 0;
    int passes = 0;                   // backward passes that produced this gradient in the window
    bool enqueued = false;            // handed to the engine in this window
    torch::Tensor grad;               // the gradient being reduced
    torch::Tensor buffer;             // what the engine reduces: grad, or a contiguous copy of it
    std::vector<std::uint16_t> wire;  // with fp16/bf16: buffer rounded to 16 bits, what the engine sums
    Handle handle;
  };

  static std::vector<Param> make_params(std::vector<std::pair<std::string, torch::Tensor>> named,
                                        torch::optim::Optimizer& optimizer, const DistributedOptions& options);

  void install_hooks();

  // Runs in the thread that runs backward, after AccumulateGrad.
  void on_grad_ready(std::size_t i);

  // Caller holds mutex_.
  void enqueue(Param& p);

  void reduce_gradients();

  // buffer = the decoded 16-bit sum / size(), in f32: the same bits on every rank.
  void decode_average(Param& p);

  // Compression hooks in here, between the framework and the wire, rather than in the engine's
  // fusion buffer: a codec keeps state per tensor (error-feedback residuals, PowerSGD's warm-
  // started Q) and PowerSGD needs each gradient's matrix shape, which only this layer knows; the
  // engine moves flat named buffers, and its fused buckets are not the same from step to step
  // (they hold whatever negotiation found ready in a cycle), so per-bucket state would not follow
  // the same elements. Every rank reduces its gradients here in parameter order (the same on every
  // rank), over a communicator of its own, after backward: the price is no overlap with backward.
  // (fp16 and bf16 need neither state nor shapes: they go through the engine, see enqueue.)
  void reduce_compressed();

  // What reduce_compressed averages at once, by name (the compressor keeps its state by name).
  struct Unit {
    std::string name;
    std::vector<std::size_t> params;  // indices into params_, in order
  };

  // One unit per tensor, except for top-k, which chooses among the elements of a whole bucket:
  // parameters in order up to the fusion threshold in bytes (as DDP's buckets; a threshold of 0
  // gives one tensor per bucket). With a fixed share of every tensor, small layers (biases) send
  // one element each and the layers that matter most no more than their share; choosing across a
  // bucket trained closer to the dense run (topk:0.01, p = 2, 2 epochs of 12,800 samples: training
  // loss 0.49 and test accuracy 82.4% against 0.62 and 81.3% per tensor; dense 0.47 and 84.4%).
  // The buckets are the same every step, so each residual follows the same elements.
  static std::vector<Unit> compressed_units(const std::vector<Param>& params, const DistributedOptions& options);

  void account(std::chrono::steady_clock::time_point backward_end, double wait_seconds);

  std::vector<std::pair<std::string, torch::Tensor>> checkpoint_params() const;
  detail::CheckpointExtras checkpoint_extras();

  torch::optim::Optimizer& optimizer_;
  DistributedOptions options_;
  std::vector<Param> params_;  // before engine_: the buffers outlive the engine that writes them
  std::mutex mutex_;
  int step_calls_ = 0;
  bool synchronized_ = false;
  OverlapStats stats_;
  std::unique_ptr<compress::GradientCompressor> compressor_;  // with compression_in_step() only
  std::vector<Unit> units_;                                   // with compression_in_step() only
  Communicator compress_comm_;                                // with compression_in_step() only
  Engine engine_;
  Communicator comm_;  // the caller's: checkpoint_async splits the checkpoint writers' from it
  std::uint64_t optimizer_steps_ = 0;
  std::unique_ptr<detail::CheckpointWriter> checkpoint_writer_;  // after the first checkpoint_async
};

}  // namespace tutti::libtorch
