// libtorch glue for out-of-core training: layers whose tensors saved for backward live in an
// offload::Pool (tutti/offload.hpp) instead of libtorch's memory, so that under a device-memory
// budget they are swapped to host while forward runs on and brought back, one layer ahead, while
// backward computes. Part of <tutti/torch.hpp>, CPU tensors only; implemented in
// src/libtorch/offload.cpp (Tutti::torch).
//
//   tutti::offload::Pool pool(64 << 20);                       // the device budget
//   tutti::libtorch::PooledParameters placed(pool, model->parameters());  // parameters, gradients
//   tutti::libtorch::ActivationStore store(pool);
//   tutti::libtorch::OffloadedSGD sgd(pool, model->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
//   for (...) {
//     store.clear();
//     auto y = tutti::libtorch::conv2d_relu_maxpool2d(store, x, conv->weight, conv->bias, 1, 2).flatten(1);
//     y = tutti::libtorch::linear(store, y, fc->weight, fc->bias, /*relu=*/false);
//     sgd.zero_grad(); loss_of(y).backward(); sgd.step();
//   }
//
// Each layer is a torch::autograd::Function that copies what its backward needs into pool
// blocks (one group per layer call, numbered in forward order) and keeps only the group's number
// in its context. Backward of group k first prefetches group k - 1 (the layer whose backward runs
// next) on the pool's swap stream, then acquires its own blocks, computes its gradients, and frees
// them: the copy in of the next layer overlaps this layer's compute. In forward, once the pool is
// nearly full, saving a group also starts copying the oldest groups to host (Pool::swap_out), so
// that the next layer's eviction finds their copies done. What is not in the pool: the
// activation flowing from one layer to the next during forward, and the gradient flowing back
// (at most one layer's input and output at a time), and the loss's own small tensors.
//
// The pool's device memory must be host-addressable (the emulated device): the layers compute on
// the CPU over views of the blocks. A pool over CUDA is Error(unsupported) from ActivationStore.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <vector>

#include <ATen/ATen.h>

#include "tutti/offload.hpp"
#include "tutti/torch_offload_sgd.hpp"

namespace tutti::libtorch {

/// The tensors that layers save for backward, in pool blocks, in groups numbered in forward order.
/// Used from the thread that runs forward and backward. Must outlive the backward passes of the
/// graphs built over it.
class ActivationStore {
 public:
  /// Over `pool` (which must outlive the store). Error(unsupported) if the pool's device memory is
  /// not host-addressable.
  explicit ActivationStore(offload::Pool& pool);
  ~ActivationStore();
  ActivationStore(const ActivationStore&) = delete;
  ActivationStore& operator=(const ActivationStore&) = delete;

  offload::Pool& pool() { return pool_; }

  /// Frees every group still stored (a forward whose backward never ran); call before a forward.
  void clear();

  /// Copies `tensors` into new blocks (unheld: the pool may evict them) as a new group; returns its
  /// number. Evicts, or raises the pool's out-of-memory error, as Pool::allocate.
  std::int64_t save(const std::vector<at::Tensor>& tensors);

  /// Starts bringing group `number`'s blocks back (a hint: a group not stored, or blocks that do
  /// not fit now, are left for take()).
  void prefetch(std::int64_t number);

  /// Calls `use` with group `number`'s tensors (views of held blocks, valid only during the call),
  /// then frees the group. Error(invalid_argument) if the group is not stored (its backward ran
  /// already, or the store was cleared).
  template <typename Use>
  auto take(std::int64_t number, Use&& use) {
    Taken taken(*this, number);
    return use(taken.tensors);
  }

  /// Groups stored now.
  std::size_t groups() const { return groups_.size(); }

 private:
  struct Saved {
    offload::Block block;  // Block{} for a tensor of no elements
    std::vector<std::int64_t> sizes;
    at::ScalarType dtype;
  };

  /// A group taken out of the store: its blocks held, as `tensors`, until it is destroyed, which
  /// frees them however take()'s `use` ends.
  struct Taken {
    Taken(ActivationStore& store, std::int64_t number);
    ~Taken();
    Taken(const Taken&) = delete;
    Taken& operator=(const Taken&) = delete;

    offload::Pool& pool;
    std::vector<Saved> group;
    std::vector<at::Tensor> tensors;
  };

  /// If the next layer's group, taken to be as large as the last one (`bytes`), would not fit,
  /// starts copying the oldest groups but the newest to host (Pool::swap_out) until `bytes` of them have a
  /// current host copy: the eviction it will need then frees them without waiting for a copy,
  /// and the copies run on the swap stream while the next layer computes.
  void write_back(std::size_t bytes);
  Saved store(const at::Tensor& tensor);

  offload::Pool& pool_;
  std::map<std::int64_t, std::vector<Saved>> groups_;
  std::int64_t next_ = 0;
};

/// Linear layer x W^T + b (x: [N, in], W: [out, in], b: [out]), followed by ReLU if `relu`, whose
/// backward input lives in `store`'s pool. Gradients as libtorch's Linear (+ ReLU) computes them.
at::Tensor linear(ActivationStore& store, const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                  bool relu);

/// Conv2d (stride 1, `padding` on each side) + ReLU + MaxPool2d(`pool`, stride `pool`), x: [N, C,
/// H, W]; what backward needs lives in `store`'s pool. Gradients as libtorch's layers compute them.
at::Tensor conv2d_relu_maxpool2d(ActivationStore& store, const at::Tensor& x, const at::Tensor& weight,
                                 const at::Tensor& bias, std::int64_t padding, std::int64_t pool);

}  // namespace tutti::libtorch
