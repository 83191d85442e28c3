// tutti-train's training loop: a data-parallel epoch, evaluation, and the parameters' checksum.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "model.hpp"
#include "profiling.hpp"
#include "settings.hpp"
#include "tutti/torch.hpp"
#include "tutti/tutti.hpp"

namespace tutti::train {

/// The data set as tensors: images [N, 1, 28, 28] normalized, labels [N] int64.
struct Data {
  ::torch::Tensor train_images, train_labels, test_images, test_labels;
};

/// Reads Fashion-MNIST from s.data (the first s.train_samples / s.test_samples samples).
/// Throws std::runtime_error naming the file that is missing or damaged.
Data load_data(const Settings& s);

/// One epoch's figures, the same on every rank except where noted.
struct EpochResult {
  double train_loss = 0;     ///< mean training loss over the epoch's steps and the ranks
  double test_accuracy = 0;  ///< over the whole test set (every rank evaluates a shard)
  double test_loss = 0;
  double step_seconds = 0;             ///< this rank's mean step (forward+backward+step), warm-up excluded
  double samples_per_second = 0;       ///< global: size() * batch / step_seconds
  tutti::torch::OverlapStats overlap;  ///< this rank's, for the epoch
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
};

class Trainer {
 public:
  /// Collective: builds the model from s.seed, broadcasts rank 0's parameters and optimizer
  /// state, and starts the engine.
  Trainer(Communicator& comm, const Settings& s, const Data& data);

  /// Collective: trains epoch `epoch` (1-based) and evaluates.
  /// Collective: trains epoch `epoch` (1-based) from loop step `first_step` on (a resumed run),
  /// calling `after_step(step)` after each step's optimizer step (within the step's time), and
  /// evaluates.
  EpochResult run_epoch(int epoch, std::int64_t first_step = 0,
                        const std::function<void(std::int64_t)>& after_step = {});

  /// FNV-1a 64 of the parameters' bytes, in named_parameters order.
  std::uint64_t parameter_checksum() const;
  std::int64_t parameter_count() const;
  /// Training steps (optimizer step() calls) per epoch on each rank.
  std::int64_t steps_per_epoch() const { return steps_per_epoch_; }
  tutti::torch::DistributedOptimizer& optimizer() { return *optimizer_; }
  /// The engine's fusion threshold in bytes.
  std::size_t fusion_threshold() const { return optimizer_->engine().options().fusion_threshold; }
  /// This rank's compute timing (--profile) and stretch (--straggler).
  const ComputeTimer& compute_timer() const { return timer_; }

 private:
  /// The epoch's order of the training samples: a permutation seeded by seed + epoch, the same on
  /// every rank; this rank's shard is every size()-th sample of it, starting at rank().
  std::vector<std::int64_t> shard_of_epoch(int epoch) const;
  /// (correct, total, loss sum) over this rank's strided shard of the test set.
  std::vector<double> evaluate_shard();

  Communicator& comm_;
  Settings s_;
  const Data& data_;
  Net model_{nullptr};
  ComputeTimer timer_;  // before sgd_ and optimizer_, which use it and its hooks run first
  std::unique_ptr<::torch::optim::SGD> sgd_;
  std::unique_ptr<tutti::torch::DistributedOptimizer> optimizer_;
  std::int64_t steps_per_epoch_ = 0;
  std::int64_t steps_run_ = 0;  // over the run, for the warm-up
};

}  // namespace tutti::train
