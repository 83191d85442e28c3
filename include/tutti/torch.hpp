// libtorch glue: data-parallel training over Tutti's training engine, and beyond it (ZeRO,
// pipeline and tensor parallelism, out-of-core layers, checkpoints), in namespace tutti::libtorch.
//
// The library Tutti::torch (src/libtorch/), built where libtorch is found, so that the core
// library never needs libtorch: link it (CMake: find_package(Tutti COMPONENTS torch),
// target_link_libraries(... Tutti::torch)); it brings libtorch. CPU tensors only.
//
//   tutti::Communicator comm = tutti::init();
//   Net model;                                               // same architecture on every rank
//   tutti::libtorch::broadcast_parameters(comm, *model, 0);     // every rank starts from rank 0's weights
//   torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
//   tutti::libtorch::DistributedOptimizer opt(comm, sgd, model->named_parameters().pairs());
//   tutti::libtorch::broadcast_optimizer_state(comm, sgd, 0);
//   for (...) { opt.zero_grad(); model->forward(x).backward(); opt.step(); }
//
// With overlap on (the default), each gradient is enqueued on the engine by a hook on its
// parameter's gradient accumulator the moment backward has accumulated it, so the allreduces of
// the last layers run while backward computes the first ones; step() waits for them.
#pragma once

#include "tutti/torch_broadcast.hpp"
#include "tutti/torch_dtype.hpp"
#include "tutti/torch_offload.hpp"
#include "tutti/torch_optimizer.hpp"
#include "tutti/torch_pipeline.hpp"
#include "tutti/torch_tensor_parallel.hpp"
#include "tutti/torch_zero.hpp"
