// libtorch glue for out-of-core training, the optimizer's side: parameters and gradients placed in
// an offload::Pool (so that they count against its budget), and SGD whose momentum buffers live in
// the pool, swapped out after each step and prefetched one parameter ahead during the next.
// Part of <tutti/torch_offload.hpp>; header-only, CPU tensors over a host-addressable pool.
#pragma once

#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include <ATen/ATen.h>
#include <torch/optim/optimizer.h>
#include <torch/optim/sgd.h>

#include "tutti/offload.hpp"

namespace tutti::torch {
namespace detail {

inline void require_host_addressable(const offload::Pool& pool, const char* who) {
  if (!pool.host_addressable())
    throw Error(ErrorCode::unsupported, std::string("tutti::torch::") + who + ": the pool's device (" +
                                            pool.device_name() +
                                            ") is not host-addressable; libtorch computes on the CPU over the "
                                            "blocks, so use the emulated device (TUTTI_DEVICE=emulated)");
}

/// A CPU tensor of `sizes` and `type` over `data` (which it does not own).
inline at::Tensor view_of(void* data, at::IntArrayRef sizes, at::ScalarType type) {
  return at::from_blob(data, sizes, at::TensorOptions().dtype(type));
}

}  // namespace detail

/// Moves the parameters' data and gradients into held blocks of `pool` for as long as it lives:
/// each parameter's data, and a zeroed gradient (which backward accumulates into in place, and
/// the optimizers' zero_grad zeroes in place), become views of device memory that counts against
/// the budget and is never evicted. Place the parameters before anything records their data
/// pointers (an engine's buffers). On destruction the parameters and gradients get libtorch
/// memory again, with their current values.
class PooledParameters {
 public:
  /// Error(unsupported) for a pool that is not host-addressable; Error(invalid_argument) for a
  /// parameter that is not a defined CPU leaf tensor; the pool's out-of-memory error if they do
  /// not fit (then nothing is moved).
  PooledParameters(offload::Pool& pool, std::vector<at::Tensor> params) : pool_(pool) {
    detail::require_host_addressable(pool, "PooledParameters");
    for (const auto& p : params)
      if (!p.defined() || !p.is_cpu() || !p.is_leaf())
        throw Error(ErrorCode::invalid_argument,
                    "tutti::torch::PooledParameters: every parameter must be a defined CPU leaf tensor");
    try {
      for (auto& p : params) place(std::move(p));
    } catch (...) {
      restore();
      throw;
    }
  }
  ~PooledParameters() { restore(); }
  PooledParameters(const PooledParameters&) = delete;
  PooledParameters& operator=(const PooledParameters&) = delete;

  /// Device bytes the parameters and gradients take (as the pool counts them: whole blocks).
  std::size_t bytes() const { return bytes_; }

 private:
  struct Placed {
    at::Tensor param;
    offload::Block data, grad;
  };

  void place(at::Tensor p) {
    Placed placed{p, offload::Block{}, offload::Block{}};
    const std::size_t bytes = p.nbytes();
    if (bytes == 0) return;
    placed.data = pool_.allocate(bytes);
    placed_.push_back(placed);  // from here restore() frees what was allocated
    placed_.back().grad = pool_.allocate(bytes);
    bytes_ += 2 * offload::Pool::charge(bytes);
    at::Tensor data = detail::view_of(pool_.data(placed.data), p.sizes(), p.scalar_type());
    data.copy_(p.detach());
    at::Tensor grad = detail::view_of(pool_.data(placed_.back().grad), p.sizes(), p.scalar_type());
    if (p.grad().defined()) {
      grad.copy_(p.grad());
    } else {
      grad.zero_();
    }
    p.set_data(data);
    p.mutable_grad() = grad;
  }

  void restore() {
    for (auto& placed : placed_) {
      if (placed.grad) {  // both blocks exist: the parameter was moved
        placed.param.set_data(placed.param.detach().clone());
        if (placed.param.grad().defined()) placed.param.mutable_grad() = placed.param.grad().clone();
      }
      pool_.free(placed.grad);
      pool_.free(placed.data);
    }
    placed_.clear();
    bytes_ = 0;
  }

  offload::Pool& pool_;
  std::vector<Placed> placed_;
  std::size_t bytes_ = 0;
};

/// ::torch::optim::SGD with its momentum buffers in pool blocks: once the pool has swapped
/// anything, each buffer is swapped out (Pool::swap_out) right after its parameter's update, so
/// that forward's activations may take its device memory without waiting for a copy (the copy
/// runs while the next parameters update), and step() prefetches the next parameter's buffer
/// while it updates the current one. The arithmetic is SGD's own, op for op, so parameters follow
/// ::torch::optim::SGD bit for bit. Momentum lives only in the pool: save()/load() and
/// broadcast_optimizer_state do not see it. Usable under DistributedOptimizer like SGD.
class OffloadedSGD : public ::torch::optim::Optimizer {
 public:
  /// Error(unsupported) for a pool that is not host-addressable.
  OffloadedSGD(offload::Pool& pool, std::vector<at::Tensor> params, const ::torch::optim::SGDOptions& options)
      : ::torch::optim::Optimizer({::torch::optim::OptimizerParamGroup(std::move(params))},
                                  std::make_unique<::torch::optim::SGDOptions>(options)),
        pool_(pool) {
    detail::require_host_addressable(pool, "OffloadedSGD");
  }
  ~OffloadedSGD() override {
    for (auto& [impl, block] : buffers_) pool_.free(block);
  }

  /// One SGD step over the parameters that have a gradient (contract of ::torch::optim::SGD::step);
  /// the pool's out-of-memory error if a momentum buffer cannot be brought back.
  at::Tensor step(LossClosure closure = nullptr) override {
    at::NoGradGuard no_grad;
    at::Tensor loss;
    if (closure != nullptr) {
      at::AutoGradMode enable_grad(true);
      loss = closure();
    }
    std::vector<std::pair<at::Tensor, const ::torch::optim::SGDOptions*>> todo;
    for (auto& group : param_groups_)
      for (auto& p : group.params())
        if (p.grad().defined()) todo.emplace_back(p, &static_cast<const ::torch::optim::SGDOptions&>(group.options()));
    if (!todo.empty()) prefetch(todo.front().first);
    for (std::size_t i = 0; i < todo.size(); ++i) {
      if (i + 1 < todo.size()) prefetch(todo[i + 1].first);
      update(todo[i].first, *todo[i].second);
    }
    return loss;
  }

  /// Momentum buffers in the pool now.
  std::size_t buffers() const { return buffers_.size(); }

 private:
  void prefetch(const at::Tensor& p) {
    const auto it = buffers_.find(p.unsafeGetTensorImpl());
    if (it != buffers_.end()) pool_.prefetch(it->second);
  }

  // SGD::step's arithmetic for one parameter, with the buffer in the pool.
  void update(at::Tensor& p, const ::torch::optim::SGDOptions& options) {
    at::Tensor d_p = p.grad().data();
    if (options.weight_decay() != 0) d_p = d_p.add(p.data(), options.weight_decay());
    if (options.momentum() == 0) {
      p.data().add_(d_p, -1 * options.lr());
      return;
    }
    offload::Block& block = buffers_[p.unsafeGetTensorImpl()];
    at::Tensor buf;
    if (!block) {
      block = pool_.allocate(d_p.nbytes());
      buf = detail::view_of(pool_.data(block), d_p.sizes(), d_p.scalar_type());
      buf.copy_(d_p);
    } else {
      buf = detail::view_of(pool_.acquire(block, offload::Access::write), d_p.sizes(), d_p.scalar_type());
      buf.mul_(options.momentum()).add_(d_p, 1 - options.dampening());
    }
    d_p = options.nesterov() ? d_p.add(buf, options.momentum()) : buf;
    p.data().add_(d_p, -1 * options.lr());
    pool_.release(block);
    // A pool that never had to swap has room for everything: a copy out would only cost.
    if (pool_.counters().swap_outs > 0) pool_.swap_out(block);
  }

  offload::Pool& pool_;
  std::unordered_map<const void*, offload::Block> buffers_;  // by the parameter's TensorImpl
};

}  // namespace tutti::torch
