// tutti-train's checkpoints (--checkpoint DIR --checkpoint-every N [--checkpoint-blocking]) and
// --resume DIR, over DistributedOptimizer::checkpoint_async and load_checkpoint.
#pragma once

#include <cstdint>
#include <string>

#include "settings.hpp"
#include "tutti/torch.hpp"
#include "tutti/tutti.hpp"

namespace tutti::train {

/// Where training goes on: epoch (1-based) and the step within it (0 for a fresh run).
struct ResumePoint {
  int epoch = 1;
  std::int64_t step = 0;
};

class Checkpointing {
 public:
  /// `steps_per_epoch`: loop steps (backward passes) per epoch, a multiple of s.backward_passes.
  Checkpointing(const Settings& s, tutti::libtorch::DistributedOptimizer& optimizer, std::int64_t steps_per_epoch)
      : s_(s), optimizer_(optimizer), steps_per_epoch_(steps_per_epoch) {}

  /// Collective. With --resume DIR: restores the latest complete checkpoint in DIR (parameters,
  /// optimizer state, step count), the one rank 0 chose for all, and returns where it was taken;
  /// rank 0 says which one, or that there is none (then training starts afresh). Without
  /// --resume: the start. Throws tutti::Error for a DIR that does not exist or a checkpoint it
  /// refuses (damaged, another world size or model), and std::runtime_error for one taken with
  /// another batch size, seed or accumulation.
  ResumePoint resume(Communicator& comm);

  /// Called after loop step `step` of epoch `epoch`: with --checkpoint, takes a checkpoint into
  /// DIR/step-NNNNNNNN at every --checkpoint-every-th optimizer step, in the background (or,
  /// with --checkpoint-blocking, written before it returns). Throws the previous write's error.
  void after_step(int epoch, std::int64_t step);

  /// Waits until the last checkpoint is published; throws its write's error.
  void finish() { optimizer_.wait_checkpoint(); }

  /// Checkpoints taken, and the training thread's time inside their calls (the copy of this
  /// rank's share; with --checkpoint-blocking, the write too), in seconds.
  std::int64_t taken() const { return taken_; }
  double call_seconds() const { return call_seconds_; }

 private:
  const Settings& s_;
  tutti::libtorch::DistributedOptimizer& optimizer_;
  std::int64_t steps_per_epoch_;
  std::int64_t taken_ = 0;
  double call_seconds_ = 0;
};

}  // namespace tutti::train
