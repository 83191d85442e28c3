// libtorch glue: tensor parallelism in the style of Megatron-LM. A pair of linear layers is split
// across the T ranks of a tensor-parallel communicator: the first by output features (columns of
// the product: each rank computes a slice of the hidden layer, no communication), the second by
// input features (rows: each rank's partial product, summed by one allreduce). Forward then holds
// one allreduce per pair (after the row-parallel layer), and backward one (the input gradient of
// the column-parallel layer, which every rank computed only in part).
// Part of <tutti/torch.hpp>: header-only, CPU tensors only.
#pragma once

#include <cstdint>
#include <string>

#include <torch/torch.h>

#include "tutti/torch_dtype.hpp"
#include "tutti/tutti.hpp"

namespace tutti::torch {

namespace detail {

// `t` summed over the ranks of `comm`, in a contiguous copy of it (t is left alone).
inline ::torch::Tensor allreduce_sum(Communicator& comm, const ::torch::Tensor& t) {
  ::torch::Tensor sum = t.clone(::at::MemoryFormat::Contiguous);
  comm.allreduce(sum.data_ptr(), sum.data_ptr(), static_cast<std::size_t>(sum.numel()), dtype_of(sum), ReduceOp::sum);
  return sum;
}

inline Communicator* communicator_of(const ::torch::autograd::AutogradContext* ctx) {
  return reinterpret_cast<Communicator*>(ctx->saved_data.at("comm").toInt());
}

// Identity forward, allreduce of the gradient in backward ("f" in Megatron-LM's paper).
struct CopyToTensorParallel : ::torch::autograd::Function<CopyToTensorParallel> {
  static ::torch::Tensor forward(::torch::autograd::AutogradContext* ctx, const ::torch::Tensor& x, std::int64_t comm) {
    ctx->saved_data["comm"] = comm;
    return x.clone();  // a new tensor: an input returned as is would make autograd treat it as a view
  }
  static ::torch::autograd::variable_list backward(::torch::autograd::AutogradContext* ctx,
                                                   ::torch::autograd::variable_list grads) {
    return {allreduce_sum(*communicator_of(ctx), grads[0]), ::torch::Tensor()};
  }
};

// Allreduce forward, identity backward ("g").
struct ReduceFromTensorParallel : ::torch::autograd::Function<ReduceFromTensorParallel> {
  static ::torch::Tensor forward(::torch::autograd::AutogradContext* /*ctx*/, const ::torch::Tensor& x,
                                 std::int64_t comm) {
    return allreduce_sum(*reinterpret_cast<Communicator*>(comm), x);
  }
  static ::torch::autograd::variable_list backward(::torch::autograd::AutogradContext* /*ctx*/,
                                                   ::torch::autograd::variable_list grads) {
    return {grads[0], ::torch::Tensor()};
  }
};

inline std::int64_t handle_of(Communicator& comm) { return reinterpret_cast<std::int64_t>(&comm); }

// [begin, end) of this rank's share of `n` features split `ways` ways; Error unless they divide.
inline std::pair<std::int64_t, std::int64_t> share_of(Communicator& comm, std::int64_t n, const char* what) {
  const std::int64_t ways = comm.size();
  if (n % ways != 0)
    throw Error(ErrorCode::invalid_argument, std::string(what) + ": " + std::to_string(n) +
                                                 " features do not split evenly over " + std::to_string(ways) +
                                                 " tensor-parallel ranks");
  const std::int64_t share = n / ways;
  return {comm.rank() * share, (comm.rank() + 1) * share};
}

}  // namespace detail

/// x unchanged; in backward, its gradient summed over `comm`'s ranks. `comm` outlives the graph.
inline ::torch::Tensor copy_to_tensor_parallel(Communicator& comm, const ::torch::Tensor& x) {
  return detail::CopyToTensorParallel::apply(x, detail::handle_of(comm));
}

/// x summed over `comm`'s ranks; in backward, the gradient unchanged. Collective.
inline ::torch::Tensor reduce_from_tensor_parallel(Communicator& comm, const ::torch::Tensor& x) {
  return detail::ReduceFromTensorParallel::apply(x, detail::handle_of(comm));
}

/// This rank's column slice of a linear layer: output features [r·out/T, (r+1)·out/T) of `full`
/// (weight rows and bias entries copied, so that T ranks together compute exactly `full`).
/// forward(x) takes the whole input and returns this rank's slice of the output.
/// Error(invalid_argument) unless T divides the output features.
struct ColumnParallelLinearImpl : ::torch::nn::Module {
  ColumnParallelLinearImpl(Communicator& comm, const ::torch::nn::Linear& full) : comm_(comm) {
    const auto [begin, end] = detail::share_of(comm, full->weight.size(0), "ColumnParallelLinear");
    ::torch::NoGradGuard no_grad;
    weight = register_parameter("weight", full->weight.slice(0, begin, end).clone());
    if (full->bias.defined()) bias = register_parameter("bias", full->bias.slice(0, begin, end).clone());
  }
  ::torch::Tensor forward(const ::torch::Tensor& x) {
    return ::torch::nn::functional::linear(copy_to_tensor_parallel(comm_, x), weight, bias);
  }
  ::torch::Tensor weight, bias;

 private:
  Communicator& comm_;
};

/// This rank's row slice of a linear layer: input features [r·in/T, (r+1)·in/T) of `full`.
/// forward(x) takes this rank's slice of the input (a ColumnParallelLinear's output) and returns
/// the whole output, summed over the ranks (one allreduce), plus the bias (kept whole on every
/// rank and added once, after the sum). Error(invalid_argument) unless T divides the input features.
struct RowParallelLinearImpl : ::torch::nn::Module {
  RowParallelLinearImpl(Communicator& comm, const ::torch::nn::Linear& full) : comm_(comm) {
    const auto [begin, end] = detail::share_of(comm, full->weight.size(1), "RowParallelLinear");
    ::torch::NoGradGuard no_grad;
    weight = register_parameter("weight", full->weight.slice(1, begin, end).contiguous().clone());
    if (full->bias.defined()) bias = register_parameter("bias", full->bias.clone());
  }
  ::torch::Tensor forward(const ::torch::Tensor& x) {
    ::torch::Tensor y = reduce_from_tensor_parallel(comm_, ::torch::nn::functional::linear(x, weight));
    return bias.defined() ? y + bias : y;
  }
  ::torch::Tensor weight, bias;

 private:
  Communicator& comm_;
};

// TORCH_MODULE by hand: the macro says `torch::nn`, which is tutti::torch::nn in here.
class ColumnParallelLinear : public ::torch::nn::ModuleHolder<ColumnParallelLinearImpl> {
 public:
  using ::torch::nn::ModuleHolder<ColumnParallelLinearImpl>::ModuleHolder;
};
class RowParallelLinear : public ::torch::nn::ModuleHolder<RowParallelLinearImpl> {
 public:
  using ::torch::nn::ModuleHolder<RowParallelLinearImpl>::ModuleHolder;
};

}  // namespace tutti::torch
