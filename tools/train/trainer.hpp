// tutti-train's training loop: a data-parallel epoch, evaluation, and the parameters' checksum.
#pragma once

#include <torch/torch.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "model.hpp"
#include "out_of_core.hpp"
#include "parallel_model.hpp"
#include "profiling.hpp"
#include "settings.hpp"
#include "tutti/torch.hpp"
#include "tutti/tutti.hpp"

namespace tutti::train {

/// The data set as tensors: images [N, 1, 28, 28] normalized, labels [N] int64.
struct Data {
  torch::Tensor train_images, train_labels, test_images, test_labels;
};

/// Reads Fashion-MNIST from s.data (the first s.train_samples / s.test_samples samples).
/// Throws std::runtime_error naming the file that is missing or damaged.
Data load_data(const Settings& s);

/// One epoch's figures, the same on every rank except where noted.
struct EpochResult {
  double train_loss = 0;     ///< mean training loss over the epoch's steps and the ranks
  double test_accuracy = 0;  ///< over the whole test set (every rank evaluates a shard)
  double test_loss = 0;
  double step_seconds = 0;                ///< this rank's mean step (forward+backward+step), warm-up excluded
  double samples_per_second = 0;          ///< global: size() * batch / step_seconds
  tutti::libtorch::OverlapStats overlap;  ///< this rank's, for the epoch
  /// The job's communication that backward did not hide, per step: in each step, the wait in
  /// step() of the rank that waited least. That rank finished backward last; the others'
  /// longer waits are for it (skew between ranks), not for communication.
  double exposed_seconds = 0;
  /// 1 - exposed / the same ranks' time in allreduce calls, over the epoch, in [0, 1]. Strict:
  /// the exposed wait also holds what is not allreduce (the last negotiation, the wake-ups).
  double hidden_fraction = 0;
  /// Of all ranks' time in allreduce calls, the share spent before the calling rank's backward
  /// ended (overlapped with its compute), in [0, 1].
  double overlapped_fraction = 0;
  /// Pipeline only: this rank's share of the timed steps not spent computing (its bubble).
  double idle_fraction = 0;
  /// Pipeline only: this rank's mean compute (forwards and backwards) and pipeline time per step.
  double stage_compute_seconds = 0, stage_step_seconds = 0;
};

/// What this rank holds, in bytes (after a step: the optimizer's state exists from the first).
struct MemoryUse {
  std::uint64_t parameters = 0;       ///< this rank's part of the network
  std::uint64_t optimizer_state = 0;  ///< momentum (ZeRO: this rank's shard)
  std::uint64_t gradients = 0;        ///< what the optimizer keeps of the gradients (ZeRO-2: a shard)
  std::uint64_t max_rss = 0;          ///< the process's peak resident memory
};

class Trainer {
 public:
  using Clock = std::chrono::steady_clock;

  /// Collective: lays the ranks out (Layout::of; throws UsageError for a layout that does not
  /// fit), builds this rank's part of the model from s.seed, broadcasts parameters and optimizer
  /// state within the data-parallel group, and starts the engine there.
  Trainer(Communicator& comm, const Settings& s, const Data& data);
  ~Trainer();
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;

  /// Collective: trains epoch `epoch` (1-based) from loop step `first_step` on (a resumed run),
  /// calling `after_step(step, loss)` after each step's optimizer step (within the step's time;
  /// `loss`: this rank's batch loss, 0 where it computes none), and evaluates.
  /// `from_sample` > 0 (an elastic job that changed size within the epoch): the epoch goes on
  /// from that many samples of its order, the rest split among the ranks there are now.
  EpochResult run_epoch(int epoch, std::int64_t first_step = 0,
                        const std::function<void(std::int64_t step, double loss)>& after_step = {},
                        std::int64_t from_sample = 0);

  /// Data parallelism alone (no ZeRO, pipeline, tensor parallelism or --device-memory): the
  /// parameters, buffers and momentum as bytes, the same layout on every rank; load_state takes
  /// what some rank's save_state gave (Error(invalid_argument) for another layout).
  /// The CPU generator's state comes with them.
  std::vector<std::byte> save_state() const;
  void load_state(std::span<const std::byte> bytes);
  /// With a --compression that keeps memory (qsgd, topk, powersgd): its state; empty otherwise.
  /// load_compressor_state of empty bytes does nothing; of another compression's state,
  /// Error(invalid_argument).
  tutti::compress::CompressorState compressor_state() const;
  void load_compressor_state(std::span<const std::byte> shared, std::span<const std::byte> local);

  /// FNV-1a 64 of this rank's parameters' bytes, in named_parameters order.
  std::uint64_t parameter_checksum() const;
  /// Parameters of the whole network (every rank's part together).
  std::int64_t parameter_count() const;
  const Layout& layout() const { return layout_; }
  /// The ranks that hold the same part of the network as this one (and must hold it bitwise equal).
  Communicator& data_group() { return groups_->data; }
  MemoryUse memory_use() const;
  /// Training steps (optimizer step() calls) per epoch on each rank.
  std::int64_t steps_per_epoch() const { return steps_per_epoch_; }
  /// The data-parallel optimizer (not with --zero: nullptr).
  tutti::libtorch::DistributedOptimizer* optimizer() { return optimizer_.get(); }
  /// The engine's fusion threshold in bytes (0 with --zero, which has no engine).
  std::size_t fusion_threshold() const { return optimizer_ ? optimizer_->engine().options().fusion_threshold : 0; }
  /// This rank's compute timing (--profile) and stretch (--straggler).
  const ComputeTimer& compute_timer() const { return timer_; }
  /// With --device-memory: the pool's counters (peak device bytes, swaps); nullptr otherwise.
  const OutOfCore* out_of_core() const { return out_of_core_.get(); }

 private:
  /// The epoch's order of the training samples: a permutation seeded by seed + epoch, the same on
  /// every rank; this rank's shard is every data-th sample of it from `from_sample` on, starting
  /// at its data rank d (the ranks of a pipeline or tensor group share one).
  std::vector<std::int64_t> shard_of_epoch(int epoch, std::int64_t from_sample = 0) const;
  /// (correct, total, loss sum) over this rank's strided shard of the test set (zeros on ranks
  /// before the last pipeline stage).
  std::vector<double> evaluate_shard();
  /// One step's forward and backward on the batch; returns the batch's loss (last stage: the
  /// global batch's for this data rank; 0 on earlier pipeline stages).
  double forward_backward(const torch::Tensor& images, const torch::Tensor& labels, Clock::time_point step_start);
  void zero_grad();
  void optimizer_step();
  /// The data-parallel optimizer's (zero with --zero).
  tutti::libtorch::OverlapStats overlap_stats() const;
  /// Rank 0 appends the step's loss over the global batch to --loss-log (collective when set).
  void log_loss(int epoch, std::int64_t step, double loss);

  Communicator& comm_;
  Settings s_;
  const Data& data_;
  Layout layout_;
  std::unique_ptr<Groups> groups_;
  std::unique_ptr<ModelPart> part_;
  ComputeTimer timer_;                      // before sgd_ and optimizer_, which use it and its hooks run first
  std::unique_ptr<OutOfCore> out_of_core_;  // with --device-memory; before sgd_, which keeps momentum in its pool
  std::unique_ptr<torch::optim::Optimizer> sgd_;
  std::unique_ptr<tutti::libtorch::DistributedOptimizer> optimizer_;  // without --zero
  std::unique_ptr<tutti::libtorch::ShardedOptimizer> zero_;           // with --zero
  std::unique_ptr<tutti::libtorch::PipelineStage> stage_;             // with --pipeline
  std::FILE* loss_log_ = nullptr;                                     // rank 0 with --loss-log
  std::int64_t steps_per_epoch_ = 0;
  std::int64_t steps_run_ = 0;  // over the run, for the warm-up
};

}  // namespace tutti::train
