// The tensor-parallel layers and their autograd functions (tutti/torch_tensor_parallel.hpp).
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>

#include <torch/torch.h>

#include "tutti/torch_dtype.hpp"
#include "tutti/torch_tensor_parallel.hpp"
#include "tutti/tutti.hpp"

namespace tutti::libtorch {
namespace {

// `t` summed over the ranks of `comm`, in a contiguous copy of it (t is left alone).
torch::Tensor allreduce_sum(Communicator& comm, const torch::Tensor& t) {
  torch::Tensor sum = t.clone(::at::MemoryFormat::Contiguous);
  comm.allreduce(sum.data_ptr(), sum.data_ptr(), static_cast<std::size_t>(sum.numel()), dtype_of(sum), ReduceOp::sum);
  return sum;
}

Communicator* communicator_of(const torch::autograd::AutogradContext* ctx) {
  return reinterpret_cast<Communicator*>(ctx->saved_data.at("comm").toInt());
}

// Identity forward, allreduce of the gradient in backward ("f" in Megatron-LM's paper).
struct CopyToTensorParallel : torch::autograd::Function<CopyToTensorParallel> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x, std::int64_t comm) {
    ctx->saved_data["comm"] = comm;
    return x.clone();  // a new tensor: an input returned as is would make autograd treat it as a view
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    return {allreduce_sum(*communicator_of(ctx), grads[0]), torch::Tensor()};
  }
};

// Allreduce forward, identity backward ("g").
struct ReduceFromTensorParallel : torch::autograd::Function<ReduceFromTensorParallel> {
  static torch::Tensor forward(torch::autograd::AutogradContext* /*ctx*/, const torch::Tensor& x, std::int64_t comm) {
    return allreduce_sum(*reinterpret_cast<Communicator*>(comm), x);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* /*ctx*/,
                                                 torch::autograd::variable_list grads) {
    return {grads[0], torch::Tensor()};
  }
};

std::int64_t handle_of(Communicator& comm) { return reinterpret_cast<std::int64_t>(&comm); }

// [begin, end) of this rank's share of `n` features split `ways` ways; Error unless they divide.
std::pair<std::int64_t, std::int64_t> share_of(Communicator& comm, std::int64_t n, const char* what) {
  const std::int64_t ways = comm.size();
  if (n % ways != 0)
    throw Error(ErrorCode::invalid_argument, std::string(what) + ": " + std::to_string(n) +
                                                 " features do not split evenly over " + std::to_string(ways) +
                                                 " tensor-parallel ranks");
  const std::int64_t share = n / ways;
  return {comm.rank() * share, (comm.rank() + 1) * share};
}

}  // namespace

torch::Tensor copy_to_tensor_parallel(Communicator& comm, const torch::Tensor& x) {
  return CopyToTensorParallel::apply(x, handle_of(comm));
}

torch::Tensor reduce_from_tensor_parallel(Communicator& comm, const torch::Tensor& x) {
  return ReduceFromTensorParallel::apply(x, handle_of(comm));
}

ColumnParallelLinearImpl::ColumnParallelLinearImpl(Communicator& comm, const torch::nn::Linear& full) : comm_(comm) {
  const auto [begin, end] = share_of(comm, full->weight.size(0), "ColumnParallelLinear");
  torch::NoGradGuard no_grad;
  weight = register_parameter("weight", full->weight.slice(0, begin, end).clone());
  if (full->bias.defined()) bias = register_parameter("bias", full->bias.slice(0, begin, end).clone());
}

torch::Tensor ColumnParallelLinearImpl::forward(const torch::Tensor& x) {
  return torch::nn::functional::linear(copy_to_tensor_parallel(comm_, x), weight, bias);
}

RowParallelLinearImpl::RowParallelLinearImpl(Communicator& comm, const torch::nn::Linear& full) : comm_(comm) {
  const auto [begin, end] = share_of(comm, full->weight.size(1), "RowParallelLinear");
  torch::NoGradGuard no_grad;
  weight = register_parameter("weight", full->weight.slice(1, begin, end).contiguous().clone());
  if (full->bias.defined()) bias = register_parameter("bias", full->bias.clone());
}

torch::Tensor RowParallelLinearImpl::forward(const torch::Tensor& x) {
  torch::Tensor y = reduce_from_tensor_parallel(comm_, torch::nn::functional::linear(x, weight));
  return bias.defined() ? y + bias : y;
}

}  // namespace tutti::libtorch
