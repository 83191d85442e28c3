// libtorch glue: tensor parallelism in the style of Megatron-LM. A pair of linear layers is split
// across the T ranks of a tensor-parallel communicator: the first by output features (columns of
// the product: each rank computes a slice of the hidden layer, no communication), the second by
// input features (rows: each rank's partial product, summed by one allreduce). Forward then holds
// one allreduce per pair (after the row-parallel layer), and backward one (the input gradient of
// the column-parallel layer, which every rank computed only in part).
// Part of <tutti/torch.hpp>, CPU tensors only; implemented in src/libtorch/tensor_parallel.cpp
// (Tutti::torch).
#pragma once

#include <torch/torch.h>

#include "tutti/tutti.hpp"

namespace tutti::libtorch {

/// x unchanged; in backward, its gradient summed over `comm`'s ranks. `comm` outlives the graph.
torch::Tensor copy_to_tensor_parallel(Communicator& comm, const torch::Tensor& x);

/// x summed over `comm`'s ranks; in backward, the gradient unchanged. Collective.
torch::Tensor reduce_from_tensor_parallel(Communicator& comm, const torch::Tensor& x);

/// This rank's column slice of a linear layer: output features [r·out/T, (r+1)·out/T) of `full`
/// (weight rows and bias entries copied, so that T ranks together compute exactly `full`).
/// forward(x) takes the whole input and returns this rank's slice of the output.
/// Error(invalid_argument) unless T divides the output features.
struct ColumnParallelLinearImpl : torch::nn::Module {
  ColumnParallelLinearImpl(Communicator& comm, const torch::nn::Linear& full);
  torch::Tensor forward(const torch::Tensor& x);
  torch::Tensor weight, bias;

 private:
  Communicator& comm_;
};

/// This rank's row slice of a linear layer: input features [r·in/T, (r+1)·in/T) of `full`.
/// forward(x) takes this rank's slice of the input (a ColumnParallelLinear's output) and returns
/// the whole output, summed over the ranks (one allreduce), plus the bias (kept whole on every
/// rank and added once, after the sum). Error(invalid_argument) unless T divides the input features.
struct RowParallelLinearImpl : torch::nn::Module {
  RowParallelLinearImpl(Communicator& comm, const torch::nn::Linear& full);
  torch::Tensor forward(const torch::Tensor& x);
  torch::Tensor weight, bias;

 private:
  Communicator& comm_;
};

// The modules' holders, as TORCH_MODULE(ColumnParallelLinear) and TORCH_MODULE(RowParallelLinear) declare them.
class ColumnParallelLinear : public torch::nn::ModuleHolder<ColumnParallelLinearImpl> {
 public:
  using torch::nn::ModuleHolder<ColumnParallelLinearImpl>::ModuleHolder;
};
class RowParallelLinear : public torch::nn::ModuleHolder<RowParallelLinearImpl> {
 public:
  using torch::nn::ModuleHolder<RowParallelLinearImpl>::ModuleHolder;
};

}  // namespace tutti::libtorch
