// Tutti::torch's internals shared by its files: the ranks' agreement before per-tensor
// collectives, tensors' signatures, and an optimizer's kind, options and per-parameter state
// (implemented in broadcast.cpp; the public part is include/tutti/torch_broadcast.hpp).
#pragma once

#include <cstdint>
#include <sstream>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include <torch/optim/optimizer.h>
#include <torch/types.h>

#include "tutti/tutti.hpp"

namespace tutti::libtorch::detail {
// The key of a parameter in an optimizer's state: its TensorImpl's address, as text in libtorch 1.x
// (what c10::guts::to_string made of it there), the address itself in 2.x.
using OptimizerStateKey =
    typename std::remove_cvref_t<decltype(std::declval<torch::optim::Optimizer&>().state())>::key_type;

template <class Key>
Key state_key_of(void* impl) {
  if constexpr (std::is_same_v<Key, std::string>) {
    std::ostringstream text;
    text << impl;
    return text.str();
  } else {
    return impl;
  }
}

OptimizerStateKey state_key(const torch::Tensor& param);

/// A tensor's name, type and shape, for the signatures the ranks compare.
std::string describe(const std::string& name, const torch::Tensor& t);

/// Empty if `t` can be moved through its data pointer, else why not.
std::string unmovable(const std::string& name, const torch::Tensor& t);

/// Makes the ranks agree before they enter per-tensor collectives that must match: root's
/// `signature` is broadcast and compared, and every rank's verdict is gathered, so that either
/// every rank goes on or every rank throws Error(invalid_argument), naming the ranks at fault.
void agree(Communicator& comm, std::string problem, std::uint64_t signature, int root, std::string_view what);

/// Broadcasts a tensor's bytes (any element type) from root.
void broadcast_bytes(Communicator& comm, const torch::Tensor& t, int root);

enum class OptimizerKind { sgd, adam, adamw, other };

OptimizerKind kind_of(torch::optim::Optimizer& optimizer);

/// The options of a param group that change what step() computes, as doubles.
std::vector<double> group_options(OptimizerKind kind, torch::optim::OptimizerOptions& options);

void set_group_options(OptimizerKind kind, torch::optim::OptimizerOptions& options, const std::vector<double>& v);

/// `t` if it can receive a broadcast of a tensor shaped like `param`, else zeros shaped like it.
torch::Tensor receivable(const torch::Tensor& t, const torch::Tensor& param);

/// Broadcasts one parameter's state of an SGD or Adam(W) optimizer from root, creating it where
/// missing. `flags` is root's: bit 1, state present; bit 2, Adam's max_exp_avg_sq present.
void broadcast_param_state(Communicator& comm, torch::optim::Optimizer& optimizer, OptimizerKind kind,
                           const torch::Tensor& param, std::uint8_t flags, int root);

std::uint8_t state_flags(torch::optim::Optimizer& optimizer, OptimizerKind kind, const torch::Tensor& param);

}  // namespace tutti::libtorch::detail
