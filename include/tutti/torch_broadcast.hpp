// libtorch glue: copying root's model parameters and optimizer state to every rank.
// Part of <tutti/torch.hpp> (the library Tutti::torch, src/libtorch/broadcast.cpp); CPU tensors only.
#pragma once

#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include "tutti/tutti.hpp"

namespace tutti::libtorch {

/// Copies root's parameters and buffers (`named_parameters()` and `named_buffers()`, recursively,
/// in name order) into every rank's `module`, with blocking broadcasts on `comm`. Collective.
/// Every tensor must be a contiguous CPU tensor, and the names, types and shapes must be the same
/// on every rank; otherwise every rank throws Error(invalid_argument) naming the ranks at fault.
void broadcast_parameters(Communicator& comm, torch::nn::Module& module, int root);

/// Copies root's optimizer settings and state into every rank's `optimizer`, with blocking
/// broadcasts on `comm`. Collective. Call it after a checkpoint is loaded on root, or at start.
///
/// Settings: for SGD lr, momentum, dampening, weight_decay and nesterov; for Adam and AdamW lr,
/// betas, eps, weight_decay and amsgrad; for other optimizers lr (when they have one), each
/// param group's. State (keyed by parameter, in param-group order): SGD's momentum_buffer; Adam's
/// and AdamW's step, exp_avg, exp_avg_sq and max_exp_avg_sq. A rank that lacks state root has
/// creates it; a rank that has state root lacks drops it. Root having state for an optimizer
/// other than SGD, Adam or AdamW is an Error(invalid_argument) on every rank, naming the type.
/// The param groups must have the same number of parameters, types and shapes on every rank.
void broadcast_optimizer_state(Communicator& comm, torch::optim::Optimizer& optimizer, int root);

}  // namespace tutti::libtorch
