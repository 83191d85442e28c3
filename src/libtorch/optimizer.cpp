// DistributedOptimizer (include/tutti/torch_optimizer.hpp).
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <exception>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <unordered_set>
#include <utility>
#include <vector>

#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/optim/optimizer.h>

#include "libtorch/checkpoint.hpp"
#include "tutti/compress.hpp"
#include "tutti/torch_dtype.hpp"
#include "tutti/torch_optimizer.hpp"

namespace tutti::libtorch {

DistributedOptimizer::DistributedOptimizer(Communicator& comm, torch::optim::Optimizer& optimizer,
                                           std::vector<std::pair<std::string, torch::Tensor>> named_parameters,
                                           DistributedOptions options)
    : optimizer_(optimizer),
      options_(std::move(options)),
      params_(make_params(std::move(named_parameters), optimizer, options_)),
      engine_(comm, options_.engine),
      comm_(comm) {
  if (!options_.compression_in_step()) {
    if (options_.overlap) install_hooks();
  } else {
    compressor_ = std::make_unique<compress::GradientCompressor>(options_.compression, options_.compression_seed);
    compress_comm_ = comm.split(0, comm.rank());  // collective, like the engine's own split
    units_ = compressed_units(params_, options_);
  }
}

DistributedOptimizer::~DistributedOptimizer() {
  for (auto& p : params_)
    if (p.accumulator && p.hook_key) p.accumulator->del_post_hook(p.hook_key);
}

void DistributedOptimizer::step() {
  if (++step_calls_ < options_.backward_passes_per_step) return;
  step_calls_ = 0;
  if (!synchronized_) reduce_gradients();
  synchronized_ = false;
  const auto start = std::chrono::steady_clock::now();
  optimizer_.step();
  ++optimizer_steps_;
  engine_.record_phase("OPTIMIZER", start, std::chrono::steady_clock::now());
}

void DistributedOptimizer::checkpoint_async(const std::string& path, CheckpointMetadata metadata) {
  if (step_calls_ != 0 || metadata.count("optimizer_steps"))
    throw Error(ErrorCode::invalid_argument, "tutti::libtorch::DistributedOptimizer::checkpoint_async(" + path + "): " +
                                                 (step_calls_ ? "inside an accumulation window; call it after step()"
                                                              : "the metadata key optimizer_steps is reserved"));
  metadata["optimizer_steps"] = std::to_string(optimizer_steps_);
  if (!checkpoint_writer_)  // collective, in the same call on every rank
    checkpoint_writer_ = std::make_unique<detail::CheckpointWriter>(comm_.split(0, comm_.rank()));
  checkpoint_writer_->wait();
  detail::CheckpointJob job;
  try {
    job = detail::snapshot_checkpoint(comm_.rank(), comm_.size(), path, checkpoint_params(), optimizer_, metadata,
                                      checkpoint_extras());
  } catch (...) {
    checkpoint_writer_->start_without_shard();  // the other ranks' writers may be under way
    throw;
  }
  checkpoint_writer_->start(std::move(job));
}

void DistributedOptimizer::checkpoint(const std::string& path, CheckpointMetadata metadata) {
  checkpoint_async(path, std::move(metadata));
  wait_checkpoint();
}

void DistributedOptimizer::wait_checkpoint() {
  if (checkpoint_writer_) checkpoint_writer_->wait();
}

CheckpointMetadata DistributedOptimizer::load_checkpoint(const std::string& path) {
  wait_checkpoint();
  auto metadata = detail::load_checkpoint(comm_, path, checkpoint_params(), optimizer_, checkpoint_extras());
  const auto steps = metadata.find("optimizer_steps");  // written by checkpoint_async
  optimizer_steps_ = steps == metadata.end() ? 0 : std::strtoull(steps->second.c_str(), nullptr, 10);
  return metadata;
}

void DistributedOptimizer::synchronize() {
  reduce_gradients();
  synchronized_ = true;
}

void DistributedOptimizer::zero_grad() {
  if (step_calls_ != 0) return;
  {
    std::lock_guard lock(mutex_);
    for (const auto& p : params_)
      if (p.enqueued)
        throw Error(ErrorCode::invalid_argument, "tutti::libtorch::DistributedOptimizer::zero_grad: the gradient of " +
                                                     p.name + " is being reduced; call step() after backward");
  }
  optimizer_.zero_grad();
}

std::vector<DistributedOptimizer::Param> DistributedOptimizer::make_params(
    std::vector<std::pair<std::string, torch::Tensor>> named, torch::optim::Optimizer& optimizer,
    const DistributedOptions& options) {
  const std::string where = "tutti::libtorch::DistributedOptimizer: ";
  if (options.backward_passes_per_step < 1)
    throw Error(ErrorCode::invalid_argument, where + "backward_passes_per_step must be at least 1, not " +
                                                 std::to_string(options.backward_passes_per_step));
  std::vector<Param> params;
  std::unordered_set<std::string> names;
  std::unordered_set<const void*> impls;
  for (auto& [name, tensor] : named) {
    if (name.empty()) throw Error(ErrorCode::invalid_argument, where + "a parameter has an empty name");
    if (!names.insert(name).second)
      throw Error(ErrorCode::invalid_argument, where + "duplicate parameter name " + name);
    if (!tensor.defined()) throw Error(ErrorCode::invalid_argument, where + "parameter " + name + " is undefined");
    if (!tensor.requires_grad()) continue;
    if (!tensor.is_leaf())
      throw Error(ErrorCode::invalid_argument, where + "parameter " + name + " is not a leaf tensor");
    if (!tensor.device().is_cpu())
      throw Error(ErrorCode::invalid_argument,
                  where + "parameter " + name + " is on " + tensor.device().str() + " (CPU tensors only)");
    if (dtype_of(tensor) != DataType::f32 && options.compression.kind != compress::Compression::Kind::none)
      throw Error(ErrorCode::invalid_argument, where + "parameter " + name + " is not f32: compression " +
                                                   options.compression.to_string() + " takes f32 gradients only");
    impls.insert(tensor.unsafeGetTensorImpl());
    if (tensor.numel() == 0) continue;  // nothing to reduce
    Param p;
    p.name = name;
    p.tensor = tensor;
    params.push_back(std::move(p));
  }
  for (std::size_t g = 0; g < optimizer.param_groups().size(); ++g) {
    const auto& group_params = optimizer.param_groups()[g].params();
    for (std::size_t i = 0; i < group_params.size(); ++i)
      if (group_params[i].requires_grad() && !impls.count(group_params[i].unsafeGetTensorImpl()))
        throw Error(ErrorCode::invalid_argument, where + "parameter " + std::to_string(i) + " of param group " +
                                                     std::to_string(g) +
                                                     " is not among the named parameters: its gradient "
                                                     "would not be averaged");
  }
  return params;
}

void DistributedOptimizer::install_hooks() {
  for (std::size_t i = 0; i < params_.size(); ++i) {
    Param& p = params_[i];
    p.accumulator = torch::autograd::impl::grad_accumulator(p.tensor);
    if (!p.accumulator) continue;  // cannot happen for a leaf that requires grad
    p.hook_key = p.accumulator->add_post_hook(std::make_unique<detail::GradReadyHook>([this, i] { on_grad_ready(i); }));
  }
}

void DistributedOptimizer::on_grad_ready(std::size_t i) {
  std::lock_guard lock(mutex_);
  Param& p = params_[i];
  if (p.enqueued)
    throw Error(ErrorCode::invalid_argument, "tutti::libtorch::DistributedOptimizer: the gradient of " + p.name +
                                                 " was computed more than backward_passes_per_step (" +
                                                 std::to_string(options_.backward_passes_per_step) +
                                                 ") times before step()");
  if (++p.passes < options_.backward_passes_per_step) return;
  enqueue(p);
}

void DistributedOptimizer::enqueue(Param& p) {
  torch::NoGradGuard no_grad;
  if (!p.tensor.grad().defined()) p.tensor.mutable_grad() = torch::zeros_like(p.tensor);
  p.grad = p.tensor.grad();
  p.buffer = p.grad.is_contiguous() ? p.grad : p.grad.contiguous();
  const auto n = static_cast<std::size_t>(p.buffer.numel());
  const DataType wire = options_.wire_type();
  if (wire == DataType::f32) {
    p.handle = engine_.enqueue_allreduce(p.name, p.buffer.data_ptr(), n, dtype_of(p.buffer), ReduceOp::avg);
  } else {
    // A 16-bit wire is stateless and element-wise, so it rides the engine (fused, overlapped with
    // backward): the gradient is rounded here, the engine's 16-bit sum adds in f32 and rounds
    // each partial sum, and every rank decodes the same bits in reduce_gradients.
    p.wire.resize(n);
    (wire == DataType::f16 ? compress::encode_fp16 : compress::encode_bf16)(p.buffer.data_ptr<float>(), p.wire.data(),
                                                                            n);
    p.handle = engine_.enqueue_allreduce(p.name, p.wire.data(), n, wire, ReduceOp::sum);
  }
  p.enqueued = true;
}

void DistributedOptimizer::reduce_gradients() {
  if (compressor_) return reduce_compressed();
  const auto backward_end = std::chrono::steady_clock::now();
  {
    std::lock_guard lock(mutex_);
    for (auto& p : params_)
      if (!p.enqueued) enqueue(p);
  }
  engine_.flush();
  std::exception_ptr failure;
  {
    std::lock_guard lock(mutex_);
    torch::NoGradGuard no_grad;
    for (auto& p : params_) {
      try {
        p.handle.wait();
        if (options_.wire_type() != DataType::f32) decode_average(p);
        if (!p.buffer.is_same(p.grad)) p.grad.copy_(p.buffer);
      } catch (...) {
        if (!failure) failure = std::current_exception();
      }
      p.passes = 0;
      p.enqueued = false;
      p.grad = p.buffer = torch::Tensor();
      p.handle = Handle();
    }
  }
  const auto wait_end = std::chrono::steady_clock::now();
  // From the end of backward: the enqueues above may already have started allreduces.
  account(backward_end, std::chrono::duration<double>(wait_end - backward_end).count());
  if (failure) std::rethrow_exception(failure);
}

void DistributedOptimizer::decode_average(Param& p) {
  auto* out = p.buffer.data_ptr<float>();
  const auto n = p.wire.size();
  (options_.wire_type() == DataType::f16 ? compress::decode_fp16 : compress::decode_bf16)(p.wire.data(), out, n);
  const auto size = static_cast<float>(engine_.size());
  for (std::size_t i = 0; i < n; ++i) out[i] /= size;
}

void DistributedOptimizer::reduce_compressed() {
  const auto start = std::chrono::steady_clock::now();
  torch::NoGradGuard no_grad;
  std::uint64_t bytes = 0;
  for (auto& p : params_)
    if (!p.tensor.grad().defined()) p.tensor.mutable_grad() = torch::zeros_like(p.tensor);
  for (const Unit& unit : units_) {
    if (unit.params.size() == 1) {  // one tensor, in its own shape (PowerSGD needs it)
      auto grad = params_[unit.params[0]].tensor.grad();
      auto buffer = grad.is_contiguous() ? grad : grad.contiguous();
      const auto sizes = buffer.sizes();
      bytes += compressor_->average(compress_comm_, unit.name, buffer.data_ptr<float>(),
                                    std::span<const std::int64_t>(sizes.data(), sizes.size()));
      if (!buffer.is_same(grad)) grad.copy_(buffer);
      continue;
    }
    std::vector<torch::Tensor> flat;
    for (std::size_t i : unit.params) flat.push_back(params_[i].tensor.grad().reshape({-1}));
    auto bucket = torch::cat(flat);
    const std::int64_t n = bucket.numel();
    bytes +=
        compressor_->average(compress_comm_, unit.name, bucket.data_ptr<float>(), std::span<const std::int64_t>(&n, 1));
    std::int64_t offset = 0;
    for (std::size_t i : unit.params) {
      auto grad = params_[i].tensor.grad();
      grad.copy_(bucket.narrow(0, offset, grad.numel()).view_as(grad));
      offset += grad.numel();
    }
  }
  compressor_->next_step();
  const auto end = std::chrono::steady_clock::now();
  engine_.record_phase("COMPRESSED_ALLREDUCE", start, end);
  const double seconds = std::chrono::duration<double>(end - start).count();
  stats_.allreduce_seconds += seconds;
  stats_.wait_seconds += seconds;
  stats_.bytes += bytes;
  stats_.steps += 1;
}

std::vector<DistributedOptimizer::Unit> DistributedOptimizer::compressed_units(const std::vector<Param>& params,
                                                                               const DistributedOptions& options) {
  std::vector<Unit> units;
  const bool buckets = options.compression.kind == compress::Compression::Kind::topk;
  std::size_t bytes = 0;
  for (std::size_t i = 0; i < params.size(); ++i) {
    const std::size_t size = static_cast<std::size_t>(params[i].tensor.numel()) * sizeof(float);
    if (!buckets || units.empty() || bytes + size > options.engine.fusion_threshold) {
      units.push_back({buckets ? "bucket " + std::to_string(units.size()) : params[i].name, {}});
      bytes = 0;
    }
    units.back().params.push_back(i);
    bytes += size;
  }
  return units;
}

void DistributedOptimizer::account(std::chrono::steady_clock::time_point backward_end, double wait_seconds) {
  for (const auto& r : engine_.take_allreduce_records()) {
    stats_.allreduce_seconds += std::chrono::duration<double>(r.end - r.start).count();
    const auto hidden_end = std::min(r.end, backward_end);
    if (hidden_end > r.start) stats_.hidden_seconds += std::chrono::duration<double>(hidden_end - r.start).count();
    stats_.bytes += r.bytes;
  }
  stats_.wait_seconds += wait_seconds;
  stats_.steps += 1;
}

detail::NamedTensors DistributedOptimizer::checkpoint_params() const {
  detail::NamedTensors named;
  for (const auto& p : params_) named.emplace_back(p.name, p.tensor);
  return named;
}

detail::CheckpointExtras DistributedOptimizer::checkpoint_extras() {
  return {options_.buffers, compressor_.get(), options_.checkpoint_generator};
}

}  // namespace tutti::libtorch
