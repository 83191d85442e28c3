// libtorch glue for out-of-core training, the optimizer's side: parameters and gradients placed in
// an offload::Pool (so that they count against its budget), and SGD whose momentum buffers live in
// the pool, swapped out after each step and prefetched one parameter ahead during the next.
// Part of <tutti/torch_offload.hpp>, CPU tensors over a host-addressable pool; implemented in
// src/libtorch/offload_sgd.cpp (Tutti::torch).
#pragma once

#include <cstddef>
#include <unordered_map>
#include <vector>

#include <ATen/ATen.h>
#include <torch/optim/optimizer.h>
#include <torch/optim/sgd.h>

#include "tutti/offload.hpp"

namespace tutti::libtorch {

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
  PooledParameters(offload::Pool& pool, std::vector<at::Tensor> params);
  ~PooledParameters();
  PooledParameters(const PooledParameters&) = delete;
  PooledParameters& operator=(const PooledParameters&) = delete;

  /// Device bytes the parameters and gradients take (as the pool counts them: whole blocks).
  std::size_t bytes() const { return bytes_; }

 private:
  struct Placed {
    at::Tensor param;
    offload::Block data, grad;
  };

  void place(at::Tensor p);
  void restore();

  offload::Pool& pool_;
  std::vector<Placed> placed_;
  std::size_t bytes_ = 0;
};

/// torch::optim::SGD with its momentum buffers in pool blocks: once the pool has swapped
/// anything, each buffer is swapped out (Pool::swap_out) right after its parameter's update, so
/// that forward's activations may take its device memory without waiting for a copy (the copy
/// runs while the next parameters update), and step() prefetches the next parameter's buffer
/// while it updates the current one. The arithmetic is SGD's own, op for op, so parameters follow
/// torch::optim::SGD bit for bit. Momentum lives only in the pool: save()/load() and
/// broadcast_optimizer_state do not see it. Usable under DistributedOptimizer like SGD.
class OffloadedSGD : public torch::optim::Optimizer {
 public:
  /// Error(unsupported) for a pool that is not host-addressable.
  OffloadedSGD(offload::Pool& pool, std::vector<at::Tensor> params, const torch::optim::SGDOptions& options);
  ~OffloadedSGD() override;

  /// One SGD step over the parameters that have a gradient (contract of torch::optim::SGD::step);
  /// the pool's out-of-memory error if a momentum buffer cannot be brought back.
  at::Tensor step(LossClosure closure = nullptr) override;

  /// Momentum buffers in the pool now.
  std::size_t buffers() const { return buffers_.size(); }

 private:
  void prefetch(const at::Tensor& p);
  // SGD::step's arithmetic for one parameter, with the buffer in the pool.
  void update(at::Tensor& p, const torch::optim::SGDOptions& options);

  offload::Pool& pool_;
  std::unordered_map<const void*, offload::Block> buffers_;  // by the parameter's TensorImpl
};

}  // namespace tutti::libtorch
