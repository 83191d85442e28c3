// ShardedOptimizer (include/tutti/torch_zero.hpp).
#include <torch/csrc/autograd/variable.h>
#include <torch/types.h>
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

#include "libtorch/broadcast.hpp"
#include "libtorch/checkpoint_state.hpp"
#include "libtorch/zero_overlap.hpp"
#include "tutti/torch_zero.hpp"

namespace tutti::libtorch {

namespace detail {
namespace {

std::string differences_from_rank0(Communicator& comm, const std::vector<std::string>& lines) {
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

std::string describe_options(const ShardedOptions& o) {
  char text[200];
  std::snprintf(text, sizeof text,
                "stage %d, lr %.17g, momentum %.17g, weight_decay %.17g, overlap %d, bucket_bytes %zu", o.stage, o.lr,
                o.momentum, o.weight_decay, o.overlap ? 1 : 0, o.bucket_bytes);
  return text;
}

std::string invalid_options(const ShardedOptions& o) {
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

}  // namespace
}  // namespace detail

ShardedOptimizer::ShardedOptimizer(Communicator& comm,
                                   std::vector<std::pair<std::string, torch::Tensor>> named_parameters,
                                   ShardedOptions options)
    : comm_(comm), options_(options) {
  std::vector<std::string> lines{detail::describe_options(options_)};
  std::string problem = detail::invalid_options(options_);
  collect(std::move(named_parameters), lines, problem);
  const std::string differs = detail::differences_from_rank0(comm_, lines);  // on every rank, problem or not
  if (problem.empty()) problem = differs;
  detail::agree(comm_, problem, 0, 0, "tutti::libtorch::ShardedOptimizer");

  const auto p = static_cast<std::int64_t>(comm_.size());
  shard_ = (count_ + p - 1) / p;
  begin_ = shard_ * comm_.rank();
  const auto f32 = torch::TensorOptions().dtype(torch::kFloat);
  if (options_.stage == 1)
    flat_ = torch::zeros({shard_ * p}, f32);
  else
    grad_shard_ = torch::zeros({shard_}, f32);
  if (options_.momentum != 0) momentum_ = torch::zeros({shard_}, f32);
  if (options_.overlap) {
    const auto bucket = static_cast<std::int64_t>(options_.bucket_bytes / sizeof(float));
    overlap_ = std::make_unique<detail::OverlappedReduce>(comm_, params_, shard_, bucket, grad_shard_);
  }
}

void ShardedOptimizer::zero_grad() {
  if (overlap_ && overlap_->busy())
    throw Error(ErrorCode::invalid_argument, "tutti::libtorch::ShardedOptimizer::zero_grad (rank " +
                                                 std::to_string(comm_.rank()) +
                                                 "): the gradients are being reduced; call step() after backward");
  release_gradients();
}

void ShardedOptimizer::step() {
  torch::NoGradGuard no_grad;
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

void ShardedOptimizer::collect(std::vector<std::pair<std::string, torch::Tensor>> named,
                               std::vector<std::string>& lines, std::string& problem) {
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

std::string ShardedOptimizer::invalid_parameter(const std::string& name, const torch::Tensor& t) {
  if (name.empty()) return "(a parameter without a name) is not allowed";
  if (!t.defined()) return "is undefined";
  if (!t.is_leaf()) return "is not a leaf tensor";
  if (!t.device().is_cpu()) return "is on " + t.device().str() + " (CPU tensors only)";
  if (t.layout() != torch::kStrided) return "is not a strided (dense) tensor";
  if (t.scalar_type() != torch::kFloat)
    return std::string("is ") + c10::toString(t.scalar_type()) + ", not Float (f32 only)";
  return {};
}

torch::Tensor ShardedOptimizer::reduce_gradients() {
  auto flat = options_.stage == 1 ? flat_ : torch::empty({shard_ * comm_.size()}, torch::kFloat);
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

void ShardedOptimizer::release_gradients() {
  for (auto& p : params_) p.tensor.mutable_grad() = torch::Tensor();
}

torch::Tensor ShardedOptimizer::pack_parameter_shard() const {
  auto shard = torch::zeros({shard_}, torch::kFloat);
  const std::int64_t end = begin_ + shard_;
  for (const auto& p : params_) {
    const std::int64_t lo = std::max(begin_, p.offset), hi = std::min(end, p.offset + p.numel);
    if (lo >= hi) continue;
    shard.narrow(0, lo - begin_, hi - lo).copy_(p.tensor.detach().reshape({-1}).narrow(0, lo - p.offset, hi - lo));
  }
  return shard;
}

void ShardedOptimizer::update(torch::Tensor& param, const torch::Tensor& grad) {
  torch::Tensor d_p = grad;
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

std::uint64_t ShardedOptimizer::overlapped_buckets() const { return overlap_ ? overlap_->started_in_backward() : 0; }

ShardedOptimizer::~ShardedOptimizer() = default;

}  // namespace tutti::libtorch
