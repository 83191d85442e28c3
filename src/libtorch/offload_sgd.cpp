// PooledParameters and OffloadedSGD (tutti/torch_offload_sgd.hpp).
#include <cstddef>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <ATen/ATen.h>
#include <torch/optim/optimizer.h>
#include <torch/optim/sgd.h>

#include "libtorch/offload_support.hpp"
#include "tutti/offload.hpp"
#include "tutti/torch_offload_sgd.hpp"
#include "tutti/types.hpp"

namespace tutti::libtorch {

void detail::require_host_addressable(const offload::Pool& pool, const char* who) {
  if (!pool.host_addressable())
    throw Error(ErrorCode::unsupported, std::string("tutti::libtorch::") + who + ": the pool's device (" +
                                            pool.device_name() +
                                            ") is not host-addressable; libtorch computes on the CPU over the "
                                            "blocks, so use the emulated device (TUTTI_DEVICE=emulated)");
}

PooledParameters::PooledParameters(offload::Pool& pool, std::vector<at::Tensor> params) : pool_(pool) {
  detail::require_host_addressable(pool, "PooledParameters");
  for (const auto& p : params)
    if (!p.defined() || !p.is_cpu() || !p.is_leaf())
      throw Error(ErrorCode::invalid_argument,
                  "tutti::libtorch::PooledParameters: every parameter must be a defined CPU leaf tensor");
  try {
    for (auto& p : params) place(std::move(p));
  } catch (...) {
    restore();
    throw;
  }
}

PooledParameters::~PooledParameters() { restore(); }

void PooledParameters::place(at::Tensor p) {
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

void PooledParameters::restore() {
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

OffloadedSGD::OffloadedSGD(offload::Pool& pool, std::vector<at::Tensor> params, const torch::optim::SGDOptions& options)
    : torch::optim::Optimizer({torch::optim::OptimizerParamGroup(std::move(params))},
                              std::make_unique<torch::optim::SGDOptions>(options)),
      pool_(pool) {
  detail::require_host_addressable(pool, "OffloadedSGD");
}

OffloadedSGD::~OffloadedSGD() {
  for (auto& [impl, block] : buffers_) pool_.free(block);
}

at::Tensor OffloadedSGD::step(LossClosure closure) {
  at::NoGradGuard no_grad;
  at::Tensor loss;
  if (closure != nullptr) {
    at::AutoGradMode enable_grad(true);
    loss = closure();
  }
  std::vector<std::pair<at::Tensor, const torch::optim::SGDOptions*>> todo;
  for (auto& group : param_groups_)
    for (auto& p : group.params())
      if (p.grad().defined()) todo.emplace_back(p, &static_cast<const torch::optim::SGDOptions&>(group.options()));
  if (!todo.empty()) prefetch(todo.front().first);
  for (std::size_t i = 0; i < todo.size(); ++i) {
    if (i + 1 < todo.size()) prefetch(todo[i + 1].first);
    update(todo[i].first, *todo[i].second);
  }
  return loss;
}

void OffloadedSGD::prefetch(const at::Tensor& p) {
  const auto it = buffers_.find(p.unsafeGetTensorImpl());
  if (it != buffers_.end()) pool_.prefetch(it->second);
}

void OffloadedSGD::update(at::Tensor& p, const torch::optim::SGDOptions& options) {
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

}  // namespace tutti::libtorch
