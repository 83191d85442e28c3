// libtorch glue for out-of-core training: layers whose tensors saved for backward live in an
// offload::Pool (tutti/offload.hpp) instead of libtorch's memory, so that under a device-memory
// budget they are swapped to host while forward runs on and brought back, one layer ahead, while
// backward computes. Part of <tutti/torch.hpp>; header-only, CPU tensors only.
//
//   tutti::offload::Pool pool(64 << 20);                       // the device budget
//   tutti::torch::PooledParameters placed(pool, model->parameters());  // parameters, gradients
//   tutti::torch::ActivationStore store(pool);
//   tutti::torch::OffloadedSGD sgd(pool, model->parameters(), ::torch::optim::SGDOptions(0.05).momentum(0.9));
//   for (...) {
//     store.clear();
//     auto y = tutti::torch::conv2d_relu_maxpool2d(store, x, conv->weight, conv->bias, 1, 2).flatten(1);
//     y = tutti::torch::linear(store, y, fc->weight, fc->bias, /*relu=*/false);
//     sgd.zero_grad(); loss_of(y).backward(); sgd.step();
//   }
//
// Each layer is a ::torch::autograd::Function that copies what its backward needs into pool
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

#include <cstdint>
#include <cstring>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include "tutti/offload.hpp"
#include "tutti/torch_offload_sgd.hpp"

namespace tutti::torch {

/// The tensors that layers save for backward, in pool blocks, in groups numbered in forward order.
/// Used from the thread that runs forward and backward. Must outlive the backward passes of the
/// graphs built over it.
class ActivationStore {
 public:
  /// Over `pool` (which must outlive the store). Error(unsupported) if the pool's device memory is
  /// not host-addressable.
  explicit ActivationStore(offload::Pool& pool) : pool_(pool) {
    detail::require_host_addressable(pool, "ActivationStore");
  }
  ~ActivationStore() { clear(); }
  ActivationStore(const ActivationStore&) = delete;
  ActivationStore& operator=(const ActivationStore&) = delete;

  offload::Pool& pool() { return pool_; }

  /// Frees every group still stored (a forward whose backward never ran); call before a forward.
  void clear() {
    for (auto& [number, group] : groups_)
      for (const auto& saved : group) pool_.free(saved.block);
    groups_.clear();
  }

  /// Copies `tensors` into new blocks (unheld: the pool may evict them) as a new group; returns its
  /// number. Evicts, or raises the pool's out-of-memory error, as Pool::allocate.
  std::int64_t save(const std::vector<at::Tensor>& tensors) {
    std::vector<Saved> group;
    group.reserve(tensors.size());
    try {
      for (const auto& tensor : tensors) group.push_back(store(tensor.contiguous()));
    } catch (...) {
      for (const auto& saved : group) pool_.free(saved.block);
      throw;
    }
    std::size_t bytes = 0;
    for (const auto& saved : group) bytes += saved.block ? pool_.size(saved.block) : 0;
    const std::int64_t number = next_++;
    groups_.emplace(number, std::move(group));
    write_back(bytes);
    return number;
  }

  /// Starts bringing group `number`'s blocks back (a hint: a group not stored, or blocks that do
  /// not fit now, are left for take()).
  void prefetch(std::int64_t number) {
    const auto it = groups_.find(number);
    if (it == groups_.end()) return;
    for (const auto& saved : it->second)
      if (saved.block) pool_.prefetch(saved.block);
  }

  /// Calls `use` with group `number`'s tensors (views of held blocks, valid only during the call),
  /// then frees the group. Error(invalid_argument) if the group is not stored (its backward ran
  /// already, or the store was cleared).
  template <typename Use>
  auto take(std::int64_t number, Use&& use) {
    const auto it = groups_.find(number);
    if (it == groups_.end())
      throw Error(ErrorCode::invalid_argument, "tutti::torch::ActivationStore: group " + std::to_string(number) +
                                                   " is not stored (backward ran twice, or clear() came between)");
    std::vector<Saved> group = std::move(it->second);
    groups_.erase(it);
    struct Free {  // frees the blocks however `use` ends
      offload::Pool& pool;
      const std::vector<Saved>& group;
      ~Free() {
        for (const auto& saved : group) pool.free(saved.block);
      }
    } free{pool_, group};
    std::vector<at::Tensor> tensors;
    tensors.reserve(group.size());
    for (const auto& saved : group) {
      if (!saved.block) {
        tensors.push_back(at::empty(saved.sizes, at::TensorOptions().dtype(saved.dtype)));
        continue;
      }
      void* data = pool_.acquire(saved.block, offload::Access::read);
      tensors.push_back(at::from_blob(data, saved.sizes, at::TensorOptions().dtype(saved.dtype)));
    }
    return use(tensors);
  }

  /// Groups stored now.
  std::size_t groups() const { return groups_.size(); }

 private:
  struct Saved {
    offload::Block block;  // Block{} for a tensor of no elements
    std::vector<std::int64_t> sizes;
    at::ScalarType dtype;
  };

  /// If the next layer's group, taken to be as large as the last one (`bytes`), would not fit,
  /// starts copying the oldest groups but the newest to host (Pool::swap_out) until `bytes` of them have a
  /// current host copy: the eviction it will need then frees them without waiting for a copy,
  /// and the copies run on the swap stream while the next layer computes.
  void write_back(std::size_t bytes) {
    const offload::Counters c = pool_.counters();
    if (!pool_.swapping() || c.in_use_bytes + bytes <= pool_.budget()) return;
    std::size_t clean = 0;
    for (const auto& [number, group] : groups_) {
      if (number == next_ - 1) return;  // the group just saved: backward needs it first
      for (const auto& saved : group) {
        if (!saved.block || !pool_.resident(saved.block) || !pool_.swap_out(saved.block)) continue;
        clean += pool_.size(saved.block);
      }
      if (clean >= bytes) return;
    }
  }

  Saved store(const at::Tensor& tensor) {
    Saved saved{offload::Block{}, tensor.sizes().vec(), tensor.scalar_type()};
    const std::size_t bytes = tensor.nbytes();
    if (bytes == 0) return saved;
    saved.block = pool_.allocate(bytes);
    std::memcpy(pool_.data(saved.block), tensor.data_ptr(), bytes);
    pool_.release(saved.block);
    return saved;
  }

  offload::Pool& pool_;
  std::map<std::int64_t, std::vector<Saved>> groups_;
  std::int64_t next_ = 0;
};

namespace detail {

/// Keeps in a layer's context its store, its group and its weight (a parameter: it lives on,
/// nothing is copied).
inline void remember(::torch::autograd::AutogradContext* ctx, ActivationStore& store, std::int64_t group,
                     const at::Tensor& weight) {
  ctx->saved_data["store"] = static_cast<std::int64_t>(reinterpret_cast<std::intptr_t>(&store));
  ctx->saved_data["group"] = group;
  ctx->save_for_backward({weight});
}

/// What every layer's backward starts from, once it has prefetched the previous layer's group
/// (whose backward runs next).
struct Backward {
  ActivationStore& store;
  std::int64_t group;
  at::Tensor weight;
};

inline Backward begin_backward(::torch::autograd::AutogradContext* ctx) {
  auto& store = *reinterpret_cast<ActivationStore*>(ctx->saved_data["store"].toInt());
  const std::int64_t group = ctx->saved_data["group"].toInt();
  store.prefetch(group - 1);
  return {store, group, ctx->get_saved_variables()[0]};
}

/// Zero where `mask` is false, the gradient elsewhere: ReLU's backward (exact zeros, as
/// threshold_backward gives).
inline at::Tensor relu_backward(const at::Tensor& grad, const at::Tensor& mask) {
  return grad.masked_fill(mask.logical_not(), 0);
}

/// y = x W^T + b, then ReLU if asked; saves x and ReLU's mask.
struct LinearFunction : ::torch::autograd::Function<LinearFunction> {
  static at::Tensor forward(::torch::autograd::AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight,
                            const at::Tensor& bias, ActivationStore* store, bool relu) {
    at::Tensor y = at::linear(x, weight, bias);
    std::vector<at::Tensor> saved{x};
    if (relu) {
      y = at::relu(y);
      saved.push_back(y.gt(0));
    }
    remember(ctx, *store, store->save(saved), weight);
    ctx->saved_data["relu"] = relu;
    return y;
  }

  static ::torch::autograd::variable_list backward(::torch::autograd::AutogradContext* ctx,
                                                   ::torch::autograd::variable_list grads) {
    const Backward b = begin_backward(ctx);
    const bool relu = ctx->saved_data["relu"].toBool();
    return b.store.take(b.group, [&](const std::vector<at::Tensor>& saved) {
      at::Tensor g = grads[0].contiguous();
      if (relu) g = relu_backward(g, saved[1]);
      // As addmm's backward computes them, so that the results match libtorch's own Linear.
      at::Tensor grad_x = ctx->needs_input_grad(0) ? g.mm(b.weight) : at::Tensor();
      at::Tensor grad_w = saved[0].t().mm(g).t();
      at::Tensor grad_b = g.sum(0);
      return ::torch::autograd::variable_list{grad_x, grad_w, grad_b, at::Tensor(), at::Tensor()};
    });
  }
};

/// maxpool(ReLU(conv2d(x, W, b, stride 1, padding)), pool): saves x, the pooling's indices and
/// ReLU's mask on the pooled output (a pooled element is positive exactly where the ReLU let the
/// gradient through at the element the pooling chose).
struct ConvReluPoolFunction : ::torch::autograd::Function<ConvReluPoolFunction> {
  static at::Tensor forward(::torch::autograd::AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight,
                            const at::Tensor& bias, ActivationStore* store, std::int64_t padding, std::int64_t pool) {
    const at::Tensor conv = at::convolution(x, weight, bias, {1, 1}, {padding, padding}, {1, 1}, false, {0, 0}, 1);
    const at::Tensor relu = at::relu(conv);
    auto [pooled, indices] = at::max_pool2d_with_indices(relu, {pool, pool}, {pool, pool});
    remember(ctx, *store, store->save({x, indices, pooled.gt(0)}), weight);
    ctx->saved_data["padding"] = padding;
    ctx->saved_data["pool"] = pool;
    ctx->saved_data["relu_sizes"] = relu.sizes().vec();
    return pooled;
  }

  static ::torch::autograd::variable_list backward(::torch::autograd::AutogradContext* ctx,
                                                   ::torch::autograd::variable_list grads) {
    const Backward b = begin_backward(ctx);
    const std::int64_t padding = ctx->saved_data["padding"].toInt();
    const std::int64_t pool = ctx->saved_data["pool"].toInt();
    const auto relu_sizes = ctx->saved_data["relu_sizes"].toIntVector();
    const bool input_grad = ctx->needs_input_grad(0);
    return b.store.take(b.group, [&](const std::vector<at::Tensor>& saved) {
      const at::Tensor g = relu_backward(grads[0].contiguous(), saved[2]);
      // The pooling's backward reads only the shape of its input: an uninitialized stand-in.
      const at::Tensor shape = at::empty(relu_sizes, g.options());
      const at::Tensor grad_relu =
          at::max_pool2d_with_indices_backward(g, shape, {pool, pool}, {pool, pool}, {0, 0}, {1, 1}, false, saved[1]);
      auto [grad_x, grad_w, grad_b] =
          at::convolution_backward(grad_relu, saved[0], b.weight, b.weight.sizes().slice(0, 1), {1, 1},
                                   {padding, padding}, {1, 1}, false, {0, 0}, 1, {input_grad, true, true});
      return ::torch::autograd::variable_list{grad_x, grad_w, grad_b, at::Tensor(), at::Tensor(), at::Tensor()};
    });
  }
};

}  // namespace detail

/// Linear layer x W^T + b (x: [N, in], W: [out, in], b: [out]), followed by ReLU if `relu`, whose
/// backward input lives in `store`'s pool. Gradients as libtorch's Linear (+ ReLU) computes them.
inline at::Tensor linear(ActivationStore& store, const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                         bool relu) {
  return detail::LinearFunction::apply(x, weight, bias, &store, relu);
}

/// Conv2d (stride 1, `padding` on each side) + ReLU + MaxPool2d(`pool`, stride `pool`), x: [N, C,
/// H, W]; what backward needs lives in `store`'s pool. Gradients as libtorch's layers compute them.
inline at::Tensor conv2d_relu_maxpool2d(ActivationStore& store, const at::Tensor& x, const at::Tensor& weight,
                                        const at::Tensor& bias, std::int64_t padding, std::int64_t pool) {
  return detail::ConvReluPoolFunction::apply(x, weight, bias, &store, padding, pool);
}

}  // namespace tutti::torch
