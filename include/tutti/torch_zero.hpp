// libtorch glue: ShardedOptimizer, SGD with momentum whose optimizer state (ZeRO stage 1) and
// also gradients (stage 2) are split over the data-parallel ranks, as PyTorch's
// ZeroRedundancyOptimizer and DeepSpeed's ZeRO do. docs/training.md, "Sharded optimizer (ZeRO 1
// and 2)", is the user's page.
// Part of <tutti/torch.hpp> (the library Tutti::torch: src/libtorch/zero.cpp); CPU tensors only.
//
// The parameters that require grad are seen as one flat f32 vector of n elements (in the order
// given), padded with zeros to p * ceil(n/p); rank r owns elements [r * ceil(n/p), (r+1) * ceil(n/p)).
// A step averages the gradients (stage 1: allreduce, every rank gets all of them; stage 2:
// reduce_scatter, each rank gets its shard only), updates the owned shard with the owned shard of
// momentum, and allgathers the updated shards into every rank's parameters. The parameters are
// therefore bitwise the same on every rank after every step: each element is computed by one rank
// and copied to the others. With ShardedOptions::overlap, stage 2's reduction starts during
// backward instead, bucket by bucket (src/libtorch/zero_overlap.hpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <torch/types.h>

#include "tutti/tutti.hpp"

namespace tutti::libtorch {

/// What ShardedOptimizer computes: torch::optim::SGD with these settings (dampening 0, no
/// Nesterov). Every rank must pass the same.
struct ShardedOptions {
  int stage = 1;            ///< 1: optimizer state sharded; 2: gradients sharded too
  double lr = 0.01;         ///< learning rate, >= 0
  double momentum = 0;      ///< >= 0; 0 keeps no optimizer state
  double weight_decay = 0;  ///< L2 penalty added to the gradient, >= 0
  /// Stage 2 only: start each bucket's reduce during backward, from gradient hooks, instead of
  /// one reduce_scatter in step() (src/libtorch/zero_overlap.hpp). Takes one backward pass per step.
  bool overlap = false;
  std::size_t bucket_bytes = std::size_t{1} << 20;  ///< with overlap: the most bytes per bucket, >= 4
};

namespace detail {
struct FlatSlot;
class OverlappedReduce;
}  // namespace detail

/// SGD with momentum over the data-parallel ranks of a communicator, with the momentum (stage 1)
/// and the averaged gradients (stage 2) kept for this rank's shard of the parameters only.
///
///   tutti::libtorch::broadcast_parameters(comm, *model, 0);   // the same start on every rank
///   tutti::libtorch::ShardedOptimizer opt(comm, model->named_parameters().pairs(),
///                                      {.stage = 2, .lr = 0.05, .momentum = 0.9});
///   for (...) { opt.zero_grad(); loss(model, my_part_of_the_batch).backward(); opt.step(); }
///
/// Gradients are AVERAGED over ranks (equal per-rank batches give the full batch's mean
/// gradient); a parameter whose gradient is undefined on a rank counts as zeros there. Parameters
/// that do not require grad are left out and never changed. Construction and step() are
/// collective: every rank calls them in the same order. The optimizer uses `comm` itself (no
/// communicator of its own), so the caller's other calls on `comm` must be ordered alike too.
class ShardedOptimizer {
 public:
  /// Collective. `named_parameters`: CPU, f32 (Float), strided leaf tensors with unique non-empty
  /// names, the same names, types and shapes in the same order on every rank; `options` the same
  /// on every rank. Errors: Error(invalid_argument) on EVERY rank when any rank's arguments are
  /// wrong (a stage other than 1 or 2, a negative or non-finite setting, overlap without stage 2
  /// or with bucket_bytes < 4, a bad or differing parameter, named in the message of the rank at
  /// fault), before anything is changed. With overlap, installs hooks on the parameters' gradient
  /// accumulators (removed by the destructor).
  ShardedOptimizer(Communicator& comm, std::vector<std::pair<std::string, torch::Tensor>> named_parameters,
                   ShardedOptions options);
  /// Removes the hooks (with overlap).
  ~ShardedOptimizer();
  ShardedOptimizer(const ShardedOptimizer&) = delete;
  ShardedOptimizer& operator=(const ShardedOptimizer&) = delete;

  /// Releases every parameter's gradient (sets it undefined); the next backward creates it
  /// anew, and step() reads an undefined gradient as zeros. Local, not collective. With overlap,
  /// Error(invalid_argument) between backward and step() (the gradients are being reduced).
  void zero_grad();

  /// Collective: averages the gradients over the ranks, updates this rank's shard (as
  /// torch::optim::SGD: d = grad + weight_decay * param; buf = d on the first step, else
  /// momentum * buf + d; param -= lr * buf, or lr * d without momentum) and allgathers
  /// the shards into every rank's parameters. Stage 2 also releases the parameters' gradients
  /// (only this rank's averaged shard of them is kept). Throws the collectives' Error; after one,
  /// the parameters and the state may be partly updated and the optimizer should not be used.
  void step();

  /// Bytes of optimizer state on this rank: its momentum shard, ceil(n/p) * 4 (0 without momentum).
  std::size_t optimizer_state_bytes() const { return momentum_.defined() ? momentum_.nbytes() : 0; }
  /// Bytes of gradients this optimizer keeps between steps: stage 1, the whole padded flat
  /// gradient, p * ceil(n/p) * 4; stage 2, this rank's averaged shard, ceil(n/p) * 4.
  std::size_t gradient_bytes_held() const { return options_.stage == 1 ? flat_.nbytes() : grad_shard_.nbytes(); }
  /// n: the elements of the parameters that require grad (without padding).
  std::size_t parameter_count() const { return static_cast<std::size_t>(count_); }
  /// ceil(n/p): the elements of each rank's shard (the last one may hold padding).
  std::size_t shard_size() const { return static_cast<std::size_t>(shard_); }
  const ShardedOptions& options() const { return options_; }
  /// step() calls made.
  std::uint64_t steps() const { return steps_; }
  /// With overlap: buckets whose reduce started during backward rather than in step(), summed
  /// over the steps (0 without overlap).
  std::uint64_t overlapped_buckets() const;

 private:
  // Keeps the parameters that require grad, with their descriptions for the comparison with rank
  // 0 (`lines`); `problem` gets the first thing wrong with them, if it is still empty.
  void collect(std::vector<std::pair<std::string, torch::Tensor>> named, std::vector<std::string>& lines,
               std::string& problem);

  static std::string invalid_parameter(const std::string& name, const torch::Tensor& t);

  // Without overlap: the flat gradient (zeros in the padding), averaged over the ranks, all of it
  // (stage 1, in flat_) or this rank's shard (stage 2, in grad_shard_). Returns the flat buffer.
  torch::Tensor reduce_gradients();

  void release_gradients();

  // A copy of this rank's shard of the parameters (zeros in the padding).
  torch::Tensor pack_parameter_shard() const;

  // The same tensor operations as torch::optim::SGD::step (libtorch), on the shard.
  void update(torch::Tensor& param, const torch::Tensor& grad);

  Communicator comm_;
  ShardedOptions options_;
  std::vector<detail::FlatSlot> params_;
  std::int64_t count_ = 0;    // n
  std::int64_t shard_ = 0;    // ceil(n/p)
  std::int64_t begin_ = 0;    // this rank's first element
  torch::Tensor flat_;        // stage 1: the averaged flat gradient, then the gathered parameters
  torch::Tensor grad_shard_;  // stage 2: this rank's shard of the averaged gradient
  torch::Tensor momentum_;    // this rank's shard of the momentum (with momentum != 0)
  std::unique_ptr<detail::OverlappedReduce> overlap_;  // after params_, which it refers to
  bool momentum_started_ = false;
  std::uint64_t steps_ = 0;
};

}  // namespace tutti::libtorch
