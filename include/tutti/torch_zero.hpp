// libtorch glue: ShardedOptimizer, SGD with momentum whose optimizer state (ZeRO stage 1) and
// also gradients (stage 2) are split over the data-parallel ranks, as PyTorch's
// ZeroRedundancyOptimizer and DeepSpeed's ZeRO do. docs/training.md, "Sharded optimizer (ZeRO 1
// and 2)", is the user's page.
// Part of <tutti/torch.hpp>, which users include: header-only, CPU tensors only. Inside namespace
// tutti, `torch::` means tutti::torch: write `::torch::` there.
//
// The parameters that require grad are seen as one flat f32 vector of n elements (in the order
// given), padded with zeros to p * ceil(n/p); rank r owns elements [r * ceil(n/p), (r+1) * ceil(n/p)).
// A step averages the gradients (stage 1: allreduce, every rank gets all of them; stage 2:
// reduce_scatter, each rank gets its shard only), updates the owned shard with the owned shard of
// momentum, and allgathers the updated shards into every rank's parameters. The parameters are
// therefore bitwise the same on every rank after every step: each element is computed by one rank
// and copied to the others. With ShardedOptions::overlap, stage 2's reduction starts during
// backward instead, bucket by bucket (torch_zero_overlap.hpp).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <unordered_set>
#include <utility>
#include <vector>

#include <torch/csrc/autograd/variable.h>
#include <torch/types.h>

#include "tutti/torch_broadcast.hpp"
#include "tutti/torch_checkpoint_state.hpp"
#include "tutti/torch_zero_overlap.hpp"
#include "tutti/tutti.hpp"

namespace tutti::torch {

/// What ShardedOptimizer computes: torch::optim::SGD with these settings (dampening 0, no
/// Nesterov). Every rank must pass the same.
struct ShardedOptions {
  int stage = 1;            ///< 1: optimizer state sharded; 2: gradients sharded too
  double lr = 0.01;         ///< learning rate, >= 0
  double momentum = 0;      ///< >= 0; 0 keeps no optimizer state
  double weight_decay = 0;  ///< L2 penalty added to the gradient, >= 0
  /// Stage 2 only: start each bucket's reduce during backward, from gradient hooks, instead of
  /// one reduce_scatter in step() (torch_zero_overlap.hpp). Takes one backward pass per step.
  bool overlap = false;
  std::size_t bucket_bytes = std::size_t{1} << 20;  ///< with overlap: the most bytes per bucket, >= 4
};

namespace detail {

/// The first parameter or option that differs between this rank's `lines` and rank 0's, or ""
/// when they agree. Collective (two broadcasts). Line 0 holds the options, the others one
/// parameter each. Every rank reads rank 0's length, so all decide alike whether to receive it.
inline std::string differences_from_rank0(Communicator& comm, const std::vector<std::string>& lines) {
  std::string text;
  for (const auto& line : lines) text += line + '\n';
  std::uint64_t length = text.size();
  comm.broadcast(&length, 1, DataType::u64, 0);
  constexpr std::uint64_t limit = 64ull << 20;  // bounds what rank 0 can make the others allocate
  if (length > limit) return "rank 0's parameter list takes " + std::to_string(length) + " bytes, over 64 MiB";
  std::string root = comm.rank() == 0 ? text : std::string(length, '\0');
  if (length > 0) comm.broadcast(root.data(), length, DataType::u8, 0);
  std::vector<std::string> theirs;
  for (std::size_t start = 0, end; start < root.size(); start = end + 1) {
    end = root.find('\n', start);
    if (end == std::string::npos) end = root.size();
    theirs.push_back(root.substr(start, end - start));
  }
  if (!theirs.empty() && lines[0] != theirs[0])
    return "the options (" + lines[0] + ") differ from rank 0's (" + theirs[0] + ")";
  for (std::size_t i = 1; i < std::max(lines.size(), theirs.size()); ++i) {
    const std::string index = "parameter " + std::to_string(i - 1);
    if (i >= theirs.size()) return index + " (" + lines[i] + ") has no counterpart on rank 0";
    if (i >= lines.size()) return index + " of rank 0 (" + theirs[i] + ") has no counterpart here";
    if (lines[i] != theirs[i]) return index + " is " + lines[i] + " here but " + theirs[i] + " on rank 0";
  }
  return {};
}

inline std::string describe_options(const ShardedOptions& o) {
  char text[200];
  std::snprintf(text, sizeof text,
                "stage %d, lr %.17g, momentum %.17g, weight_decay %.17g, overlap %d, bucket_bytes %zu", o.stage, o.lr,
                o.momentum, o.weight_decay, o.overlap ? 1 : 0, o.bucket_bytes);
  return text;
}

/// Why `o` is invalid, or "".
inline std::string invalid_options(const ShardedOptions& o) {
  if (o.stage != 1 && o.stage != 2)
    return "stage " + std::to_string(o.stage) + " is not supported (1: optimizer state sharded, 2: gradients too)";
  const std::pair<const char*, double> values[] = {
      {"lr", o.lr}, {"momentum", o.momentum}, {"weight_decay", o.weight_decay}};
  for (const auto& [name, value] : values)
    if (!std::isfinite(value) || value < 0)
      return std::string(name) + " must be finite and >= 0, not " + std::to_string(value);
  if (o.overlap && o.stage != 2) return "overlap needs stage 2 (stage 1 reduces in step())";
  if (o.overlap && o.bucket_bytes < sizeof(float))
    return "bucket_bytes must be at least 4 (one f32), not " + std::to_string(o.bucket_bytes);
  return {};
}

}  // namespace detail

/// SGD with momentum over the data-parallel ranks of a communicator, with the momentum (stage 1)
/// and the averaged gradients (stage 2) kept for this rank's shard of the parameters only.
///
///   tutti::torch::broadcast_parameters(comm, *model, 0);   // the same start on every rank
///   tutti::torch::ShardedOptimizer opt(comm, model->named_parameters().pairs(),
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
  ShardedOptimizer(Communicator& comm, std::vector<std::pair<std::string, ::torch::Tensor>> named_parameters,
                   ShardedOptions options)
      : comm_(comm), options_(options) {
    std::vector<std::string> lines{detail::describe_options(options_)};
    std::string problem = detail::invalid_options(options_);
    collect(std::move(named_parameters), lines, problem);
    const std::string differs = detail::differences_from_rank0(comm_, lines);  // on every rank, problem or not
    if (problem.empty()) problem = differs;
    detail::agree(comm_, problem, 0, 0, "tutti::torch::ShardedOptimizer");

    const auto p = static_cast<std::int64_t>(comm_.size());
    shard_ = (count_ + p - 1) / p;
    begin_ = shard_ * comm_.rank();
    const auto f32 = ::torch::TensorOptions().dtype(::torch::kFloat);
    if (options_.stage == 1)
      flat_ = ::torch::zeros({shard_ * p}, f32);
    else
      grad_shard_ = ::torch::zeros({shard_}, f32);
    if (options_.momentum != 0) momentum_ = ::torch::zeros({shard_}, f32);
    if (options_.overlap) {
      const auto bucket = static_cast<std::int64_t>(options_.bucket_bytes / sizeof(float));
      overlap_ = std::make_unique<detail::OverlappedReduce>(comm_, params_, shard_, bucket, grad_shard_);
    }
  }
  ShardedOptimizer(const ShardedOptimizer&) = delete;
  ShardedOptimizer& operator=(const ShardedOptimizer&) = delete;

  /// Releases every parameter's gradient (sets it undefined); the next backward creates it
  /// anew, and step() reads an undefined gradient as zeros. Local, not collective. With overlap,
  /// Error(invalid_argument) between backward and step() (the gradients are being reduced).
  void zero_grad() {
    if (overlap_ && overlap_->busy())
      throw Error(ErrorCode::invalid_argument, "tutti::torch::ShardedOptimizer::zero_grad (rank " +
                                                   std::to_string(comm_.rank()) +
                                                   "): the gradients are being reduced; call step() after backward");
    release_gradients();
  }

  /// Collective: averages the gradients over the ranks, updates this rank's shard (as
  /// torch::optim::SGD: d = grad + weight_decay * param; buf = d on the first step, else
  /// momentum * buf + d; param -= lr * buf, or lr * d without momentum) and allgathers
  /// the shards into every rank's parameters. Stage 2 also releases the parameters' gradients
  /// (only this rank's averaged shard of them is kept). Throws the collectives' Error; after one,
  /// the parameters and the state may be partly updated and the optimizer should not be used.
  void step() {
    ::torch::NoGradGuard no_grad;
    ++steps_;
    if (count_ == 0) return;  // the same on every rank: the constructor compared the parameters
    auto flat = overlap_ ? overlap_->finish() : reduce_gradients();
    if (options_.stage == 2) release_gradients();
    float* base = flat.data_ptr<float>();
    auto grad = options_.stage == 1 ? flat.narrow(0, begin_, shard_) : grad_shard_;
    auto param = pack_parameter_shard();
    update(param, grad);
    flat.narrow(0, begin_, shard_).copy_(param);  // stage 1: over the gradient, used by now
    comm_.allgather(base + begin_, base, static_cast<std::size_t>(shard_), DataType::f32);
    for (auto& p : params_) p.tensor.detach().copy_(flat.narrow(0, p.offset, p.numel).view(p.tensor.sizes()));
  }

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
  std::uint64_t overlapped_buckets() const { return overlap_ ? overlap_->started_in_backward() : 0; }

 private:
  // Keeps the parameters that require grad, with their descriptions for the comparison with rank
  // 0 (`lines`); `problem` gets the first thing wrong with them, if it is still empty.
  void collect(std::vector<std::pair<std::string, ::torch::Tensor>> named, std::vector<std::string>& lines,
               std::string& problem) {
    std::unordered_set<std::string> names;
    std::unordered_set<const void*> tensors;
    for (auto& [name, tensor] : named) {
      if (tensor.defined() && !tensor.requires_grad()) continue;
      lines.push_back(name + " " + (tensor.defined() ? detail::shape_of(tensor) : "undefined"));
      std::string bad = invalid_parameter(name, tensor);
      if (bad.empty() && !names.insert(name).second) bad = "appears twice";
      if (bad.empty() && !tensors.insert(tensor.unsafeGetTensorImpl()).second) bad = "is a tensor given twice";
      if (!bad.empty() && problem.empty()) problem = "parameter " + name + " " + bad;
      const std::int64_t numel = tensor.defined() ? tensor.numel() : 0;
      params_.push_back({name, tensor, count_, numel});
      count_ += numel;
    }
  }

  static std::string invalid_parameter(const std::string& name, const ::torch::Tensor& t) {
    if (name.empty()) return "(a parameter without a name) is not allowed";
    if (!t.defined()) return "is undefined";
    if (!t.is_leaf()) return "is not a leaf tensor";
    if (!t.device().is_cpu()) return "is on " + t.device().str() + " (CPU tensors only)";
    if (t.layout() != ::torch::kStrided) return "is not a strided (dense) tensor";
    if (t.scalar_type() != ::torch::kFloat)
      return std::string("is ") + c10::toString(t.scalar_type()) + ", not Float (f32 only)";
    return {};
  }

  // Without overlap: the flat gradient (zeros in the padding), averaged over the ranks, all of it
  // (stage 1, in flat_) or this rank's shard (stage 2, in grad_shard_). Returns the flat buffer.
  ::torch::Tensor reduce_gradients() {
    auto flat = options_.stage == 1 ? flat_ : ::torch::empty({shard_ * comm_.size()}, ::torch::kFloat);
    for (const auto& p : params_) detail::pack_gradient(flat, p);
    flat.narrow(0, count_, flat.numel() - count_).zero_();
    float* base = flat.data_ptr<float>();
    if (options_.stage == 1)
      comm_.allreduce(base, base, static_cast<std::size_t>(flat.numel()), DataType::f32, ReduceOp::avg);
    else
      comm_.reduce_scatter(base, grad_shard_.data_ptr<float>(), static_cast<std::size_t>(shard_), DataType::f32,
                           ReduceOp::avg);
    return flat;
  }

  void release_gradients() {
    for (auto& p : params_) p.tensor.mutable_grad() = ::torch::Tensor();
  }

  // A copy of this rank's shard of the parameters (zeros in the padding).
  ::torch::Tensor pack_parameter_shard() const {
    auto shard = ::torch::zeros({shard_}, ::torch::kFloat);
    const std::int64_t end = begin_ + shard_;
    for (const auto& p : params_) {
      const std::int64_t lo = std::max(begin_, p.offset), hi = std::min(end, p.offset + p.numel);
      if (lo >= hi) continue;
      shard.narrow(0, lo - begin_, hi - lo).copy_(p.tensor.detach().reshape({-1}).narrow(0, lo - p.offset, hi - lo));
    }
    return shard;
  }

  // The same tensor operations as torch::optim::SGD::step (libtorch), on the shard.
  void update(::torch::Tensor& param, const ::torch::Tensor& grad) {
    ::torch::Tensor d_p = grad;
    if (options_.weight_decay != 0) d_p = d_p.add(param, options_.weight_decay);
    if (options_.momentum != 0) {
      if (!momentum_started_)  // as torch's SGD, which creates its buffer as a copy of d_p
        momentum_.copy_(d_p);
      else
        momentum_.mul_(options_.momentum).add_(d_p, 1.0);  // 1 - dampening
      momentum_started_ = true;
      d_p = momentum_;
    }
    param.add_(d_p, -1 * options_.lr);
  }

  Communicator comm_;
  ShardedOptions options_;
  std::vector<detail::FlatSlot> params_;
  std::int64_t count_ = 0;      // n
  std::int64_t shard_ = 0;      // ceil(n/p)
  std::int64_t begin_ = 0;      // this rank's first element
  ::torch::Tensor flat_;        // stage 1: the averaged flat gradient, then the gathered parameters
  ::torch::Tensor grad_shard_;  // stage 2: this rank's shard of the averaged gradient
  ::torch::Tensor momentum_;    // this rank's shard of the momentum (with momentum != 0)
  std::unique_ptr<detail::OverlappedReduce> overlap_;  // after params_, which it refers to
  bool momentum_started_ = false;
  std::uint64_t steps_ = 0;
};

}  // namespace tutti::torch
