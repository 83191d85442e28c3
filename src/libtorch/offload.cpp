// ActivationStore and the out-of-core layers' autograd functions (tutti/torch_offload.hpp).
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include "libtorch/offload_support.hpp"
#include "tutti/offload.hpp"
#include "tutti/torch_offload.hpp"
#include "tutti/types.hpp"

namespace tutti::libtorch {

ActivationStore::ActivationStore(offload::Pool& pool) : pool_(pool) {
  detail::require_host_addressable(pool, "ActivationStore");
}

ActivationStore::~ActivationStore() { clear(); }

void ActivationStore::clear() {
  for (auto& [number, group] : groups_)
    for (const auto& saved : group) pool_.free(saved.block);
  groups_.clear();
}

std::int64_t ActivationStore::save(const std::vector<at::Tensor>& tensors) {
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

void ActivationStore::prefetch(std::int64_t number) {
  const auto it = groups_.find(number);
  if (it == groups_.end()) return;
  for (const auto& saved : it->second)
    if (saved.block) pool_.prefetch(saved.block);
}

ActivationStore::Taken::Taken(ActivationStore& store, std::int64_t number) : pool(store.pool_) {
  const auto it = store.groups_.find(number);
  if (it == store.groups_.end())
    throw Error(ErrorCode::invalid_argument, "tutti::libtorch::ActivationStore: group " + std::to_string(number) +
                                                 " is not stored (backward ran twice, or clear() came between)");
  group = std::move(it->second);
  store.groups_.erase(it);
  tensors.reserve(group.size());
  try {
    for (const auto& saved : group) {
      if (!saved.block) {
        tensors.push_back(at::empty(saved.sizes, at::TensorOptions().dtype(saved.dtype)));
        continue;
      }
      void* data = pool.acquire(saved.block, offload::Access::read);
      tensors.push_back(at::from_blob(data, saved.sizes, at::TensorOptions().dtype(saved.dtype)));
    }
  } catch (...) {
    tensors.clear();
    for (const auto& saved : group) pool.free(saved.block);
    throw;
  }
}

ActivationStore::Taken::~Taken() {
  tensors.clear();
  for (const auto& saved : group) pool.free(saved.block);
}

void ActivationStore::write_back(std::size_t bytes) {
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

ActivationStore::Saved ActivationStore::store(const at::Tensor& tensor) {
  Saved saved{offload::Block{}, tensor.sizes().vec(), tensor.scalar_type()};
  const std::size_t bytes = tensor.nbytes();
  if (bytes == 0) return saved;
  saved.block = pool_.allocate(bytes);
  std::memcpy(pool_.data(saved.block), tensor.data_ptr(), bytes);
  pool_.release(saved.block);
  return saved;
}

namespace {

/// Keeps in a layer's context its store, its group and its weight (a parameter: it lives on,
/// nothing is copied).
void remember(torch::autograd::AutogradContext* ctx, ActivationStore& store, std::int64_t group,
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

Backward begin_backward(torch::autograd::AutogradContext* ctx) {
  auto& store = *reinterpret_cast<ActivationStore*>(ctx->saved_data["store"].toInt());
  const std::int64_t group = ctx->saved_data["group"].toInt();
  store.prefetch(group - 1);
  return {store, group, ctx->get_saved_variables()[0]};
}

/// Zero where `mask` is false, the gradient elsewhere: ReLU's backward (exact zeros, as
/// threshold_backward gives).
at::Tensor relu_backward(const at::Tensor& grad, const at::Tensor& mask) {
  return grad.masked_fill(mask.logical_not(), 0);
}

/// y = x W^T + b, then ReLU if asked; saves x and ReLU's mask.
struct LinearFunction : torch::autograd::Function<LinearFunction> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight,
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

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const Backward b = begin_backward(ctx);
    const bool relu = ctx->saved_data["relu"].toBool();
    return b.store.take(b.group, [&](const std::vector<at::Tensor>& saved) {
      at::Tensor g = grads[0].contiguous();
      if (relu) g = relu_backward(g, saved[1]);
      // As addmm's backward computes them, so that the results match libtorch's own Linear.
      at::Tensor grad_x = ctx->needs_input_grad(0) ? g.mm(b.weight) : at::Tensor();
      at::Tensor grad_w = saved[0].t().mm(g).t();
      at::Tensor grad_b = g.sum(0);
      return torch::autograd::variable_list{grad_x, grad_w, grad_b, at::Tensor(), at::Tensor()};
    });
  }
};

/// maxpool(ReLU(conv2d(x, W, b, stride 1, padding)), pool): saves x, the pooling's indices and
/// ReLU's mask on the pooled output (a pooled element is positive exactly where the ReLU let the
/// gradient through at the element the pooling chose).
struct ConvReluPoolFunction : torch::autograd::Function<ConvReluPoolFunction> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight,
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

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
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
      return torch::autograd::variable_list{grad_x, grad_w, grad_b, at::Tensor(), at::Tensor(), at::Tensor()};
    });
  }
};

}  // namespace

at::Tensor linear(ActivationStore& store, const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                  bool relu) {
  return LinearFunction::apply(x, weight, bias, &store, relu);
}

at::Tensor conv2d_relu_maxpool2d(ActivationStore& store, const at::Tensor& x, const at::Tensor& weight,
                                 const at::Tensor& bias, std::int64_t padding, std::int64_t pool) {
  return ConvReluPoolFunction::apply(x, weight, bias, &store, padding, pool);
}

}  // namespace tutti::libtorch
