// libtorch glue: data-parallel training over Tutti's training engine.
//
// Header-only, so that the core library never needs libtorch: a program that includes this
// header links libtorch itself (CPU tensors only).
//
//   tutti::Communicator comm = tutti::init();
//   Net model;                                               // same architecture on every rank
//   tutti::torch::broadcast_parameters(comm, *model, 0);     // every rank starts from rank 0's weights
//   torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
//   tutti::torch::DistributedOptimizer opt(comm, sgd, model->named_parameters().pairs());
//   tutti::torch::broadcast_optimizer_state(comm, sgd, 0);
//   for (...) { opt.zero_grad(); model->forward(x).backward(); opt.step(); }
//
// With overlap on (the default), each gradient is enqueued on the engine by a hook on its
// parameter's gradient accumulator the moment backward has accumulated it, so the allreduces of
// the last layers run while backward computes the first ones; step() waits for them.
//
// Inside namespace tutti, `torch::` means tutti::torch: write `::torch::` there (TORCH_MODULE,
// which says `torch::nn`, works only outside namespace tutti).
#pragma once

#include "tutti/torch_broadcast.hpp"
#include "tutti/torch_dtype.hpp"
#include "tutti/torch_offload.hpp"
#include "tutti/torch_optimizer.hpp"
#include "tutti/torch_pipeline.hpp"
#include "tutti/torch_tensor_parallel.hpp"
#include "tutti/torch_zero.hpp"
