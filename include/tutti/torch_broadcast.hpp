// libtorch glue: copying root's model parameters and optimizer state to every rank.
// Part of <tutti/torch.hpp>, which users include: header-only, CPU tensors only. Inside namespace
// tutti, `torch::` means tutti::torch: write `::torch::` there.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <sstream>
#include <string>
#include <string_view>
#include <type_traits>
#include <typeinfo>
#include <utility>
#include <vector>

#include <c10/util/C++17.h>
#include <c10/util/Type.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/nn/module.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/optimizer.h>
#include <torch/optim/sgd.h>

#include "tutti/tutti.hpp"

namespace tutti::torch {

namespace detail {

// The key of a parameter in an optimizer's state: its TensorImpl's address, as text in libtorch 1.x
// (what c10::guts::to_string made of it there), the address itself in 2.x.
using OptimizerStateKey =
    typename std::remove_cvref_t<decltype(std::declval<::torch::optim::Optimizer&>().state())>::key_type;

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

inline OptimizerStateKey state_key(const ::torch::Tensor& param) {
  return state_key_of<OptimizerStateKey>(param.unsafeGetTensorImpl());
}

inline constexpr std::uint64_t fnv1a_offset = 14695981039346656037ull;

/// FNV-1a, 64 bits, continued from `hash`.
inline std::uint64_t fnv1a(const void* data, std::size_t bytes, std::uint64_t hash = fnv1a_offset) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (std::size_t i = 0; i < bytes; ++i) hash = (hash ^ p[i]) * 1099511628211ull;
  return hash;
}

inline std::uint64_t fnv1a(std::string_view text, std::uint64_t hash = fnv1a_offset) {
  return fnv1a(text.data(), text.size(), hash);
}

/// A tensor's name, type and shape, for the signatures the ranks compare.
inline std::string describe(const std::string& name, const ::torch::Tensor& t) {
  if (!t.defined()) return name + ":undefined;";
  std::string s = name + ":" + c10::toString(t.scalar_type()) + "[";
  for (auto d : t.sizes()) s += std::to_string(d) + ",";
  return s + "];";
}

/// Empty if `t` can be moved through its data pointer, else why not.
inline std::string unmovable(const std::string& name, const ::torch::Tensor& t) {
  if (!t.defined()) return {};
  if (!t.device().is_cpu()) return name + " is on " + t.device().str() + " (CPU tensors only)";
  if (!t.is_contiguous()) return name + " is not contiguous";
  return {};
}

/// Makes the ranks agree before they enter per-tensor collectives that must match: root's
/// `signature` is broadcast and compared, and every rank's verdict is gathered, so that either
/// every rank goes on or every rank throws Error(invalid_argument), naming the ranks at fault.
inline void agree(Communicator& comm, std::string problem, std::uint64_t signature, int root, std::string_view what) {
  std::uint64_t root_signature = signature;
  comm.broadcast(&root_signature, 1, DataType::u64, root);
  if (problem.empty() && root_signature != signature)
    problem = "the tensors' names, types or shapes differ from rank " + std::to_string(root) + "'s";
  const std::int32_t bad = problem.empty() ? 0 : 1;
  std::vector<std::int32_t> verdicts(static_cast<std::size_t>(comm.size()));
  comm.allgather(&bad, verdicts.data(), 1, DataType::i32);
  std::string culprits;
  for (std::size_t r = 0; r < verdicts.size(); ++r)
    if (verdicts[r]) culprits += (culprits.empty() ? "" : ", ") + std::to_string(r);
  if (culprits.empty()) return;
  const std::string prefix = std::string(what) + " (rank " + std::to_string(comm.rank()) + "): ";
  if (!problem.empty()) throw Error(ErrorCode::invalid_argument, prefix + problem);
  throw Error(ErrorCode::invalid_argument, prefix + "rank(s) " + culprits + " failed their checks (see their errors)");
}

/// Broadcasts a tensor's bytes (any element type) from root.
inline void broadcast_bytes(Communicator& comm, const ::torch::Tensor& t, int root) {
  if (t.defined() && t.nbytes() > 0) comm.broadcast(t.data_ptr(), t.nbytes(), DataType::u8, root);
}

enum class OptimizerKind { sgd, adam, adamw, other };

inline OptimizerKind kind_of(::torch::optim::Optimizer& optimizer) {
  if (dynamic_cast<::torch::optim::SGD*>(&optimizer)) return OptimizerKind::sgd;
  if (dynamic_cast<::torch::optim::Adam*>(&optimizer)) return OptimizerKind::adam;
  if (dynamic_cast<::torch::optim::AdamW*>(&optimizer)) return OptimizerKind::adamw;
  return OptimizerKind::other;
}

/// The options of a param group that change what step() computes, as doubles.
inline std::vector<double> group_options(OptimizerKind kind, ::torch::optim::OptimizerOptions& options) {
  if (kind == OptimizerKind::sgd) {
    auto& o = static_cast<::torch::optim::SGDOptions&>(options);
    return {o.lr(), o.momentum(), o.dampening(), o.weight_decay(), o.nesterov() ? 1.0 : 0.0};
  }
  if (kind == OptimizerKind::adam || kind == OptimizerKind::adamw) {
    auto get = [](auto& o) -> std::vector<double> {
      return {o.lr(),  std::get<0>(o.betas()), std::get<1>(o.betas()),
              o.eps(), o.weight_decay(),       o.amsgrad() ? 1.0 : 0.0};
    };
    if (kind == OptimizerKind::adam) return get(static_cast<::torch::optim::AdamOptions&>(options));
    return get(static_cast<::torch::optim::AdamWOptions&>(options));
  }
  try {
    return {options.get_lr()};
  } catch (const c10::Error&) {
    return {};  // an optimizer without a learning rate (the same on every rank: the types agree)
  }
}

inline void set_group_options(OptimizerKind kind, ::torch::optim::OptimizerOptions& options,
                              const std::vector<double>& v) {
  if (kind == OptimizerKind::sgd) {
    auto& o = static_cast<::torch::optim::SGDOptions&>(options);
    o.lr(v[0]).momentum(v[1]).dampening(v[2]).weight_decay(v[3]).nesterov(v[4] != 0);
  } else if (kind == OptimizerKind::adam || kind == OptimizerKind::adamw) {
    auto set = [&](auto& o) {
      o.lr(v[0]).betas(std::make_tuple(v[1], v[2])).eps(v[3]).weight_decay(v[4]).amsgrad(v[5] != 0);
    };
    if (kind == OptimizerKind::adam)
      set(static_cast<::torch::optim::AdamOptions&>(options));
    else
      set(static_cast<::torch::optim::AdamWOptions&>(options));
  } else if (!v.empty()) {
    options.set_lr(v[0]);
  }
}

/// `t` if it can receive a broadcast of a tensor shaped like `param`, else zeros shaped like it.
inline ::torch::Tensor receivable(const ::torch::Tensor& t, const ::torch::Tensor& param) {
  if (t.defined() && t.sizes() == param.sizes() && t.scalar_type() == param.scalar_type() && t.is_contiguous() &&
      t.device().is_cpu())
    return t;
  return ::torch::zeros_like(param, ::torch::TensorOptions(), ::torch::MemoryFormat::Contiguous);
}

/// Broadcasts one parameter's state of an SGD or Adam(W) optimizer from root, creating it where
/// missing. `flags` is root's: bit 1, state present; bit 2, Adam's max_exp_avg_sq present.
inline void broadcast_param_state(Communicator& comm, ::torch::optim::Optimizer& optimizer, OptimizerKind kind,
                                  const ::torch::Tensor& param, std::uint8_t flags, int root) {
  auto& state = optimizer.state();
  const OptimizerStateKey key = state_key(param);
  auto it = state.find(key);
  if (kind == OptimizerKind::sgd) {
    auto* s = it == state.end() ? nullptr : dynamic_cast<::torch::optim::SGDParamState*>(it->second.get());
    if (!s) {
      state[key] = std::make_unique<::torch::optim::SGDParamState>();
      s = static_cast<::torch::optim::SGDParamState*>(state[key].get());
    }
    s->momentum_buffer(receivable(s->momentum_buffer(), param));
    broadcast_bytes(comm, s->momentum_buffer(), root);
    return;
  }
  auto adam_like = [&](auto* s, auto make) {
    if (!s) {
      state[key] = make();
      s = static_cast<decltype(s)>(state[key].get());
    }
    std::int64_t step = s->step();
    comm.broadcast(&step, 1, DataType::i64, root);
    s->step(step);
    s->exp_avg(receivable(s->exp_avg(), param));
    s->exp_avg_sq(receivable(s->exp_avg_sq(), param));
    broadcast_bytes(comm, s->exp_avg(), root);
    broadcast_bytes(comm, s->exp_avg_sq(), root);
    if (flags & 2) {
      s->max_exp_avg_sq(receivable(s->max_exp_avg_sq(), param));
      broadcast_bytes(comm, s->max_exp_avg_sq(), root);
    } else {
      s->max_exp_avg_sq(::torch::Tensor());
    }
  };
  if (kind == OptimizerKind::adam) {
    using S = ::torch::optim::AdamParamState;
    adam_like(it == state.end() ? nullptr : dynamic_cast<S*>(it->second.get()), [] { return std::make_unique<S>(); });
  } else {
    using S = ::torch::optim::AdamWParamState;
    adam_like(it == state.end() ? nullptr : dynamic_cast<S*>(it->second.get()), [] { return std::make_unique<S>(); });
  }
}

inline std::uint8_t state_flags(::torch::optim::Optimizer& optimizer, OptimizerKind kind,
                                const ::torch::Tensor& param) {
  auto it = optimizer.state().find(detail::state_key(param));
  if (it == optimizer.state().end()) return 0;
  ::torch::Tensor max_sq;
  if (kind == OptimizerKind::adam) {
    if (auto* s = dynamic_cast<::torch::optim::AdamParamState*>(it->second.get())) max_sq = s->max_exp_avg_sq();
  } else if (kind == OptimizerKind::adamw) {
    if (auto* s = dynamic_cast<::torch::optim::AdamWParamState*>(it->second.get())) max_sq = s->max_exp_avg_sq();
  }
  return static_cast<std::uint8_t>(1 | (max_sq.defined() ? 2 : 0));
}

}  // namespace detail

/// Copies root's parameters and buffers (`named_parameters()` and `named_buffers()`, recursively,
/// in name order) into every rank's `module`, with blocking broadcasts on `comm`. Collective.
/// Every tensor must be a contiguous CPU tensor, and the names, types and shapes must be the same
/// on every rank; otherwise every rank throws Error(invalid_argument) naming the ranks at fault.
inline void broadcast_parameters(Communicator& comm, ::torch::nn::Module& module, int root) {
  std::vector<std::pair<std::string, ::torch::Tensor>> tensors;
  for (const auto& item : module.named_parameters(true)) tensors.emplace_back(item.key(), item.value());
  for (const auto& item : module.named_buffers(true)) tensors.emplace_back(item.key(), item.value());
  std::sort(tensors.begin(), tensors.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  std::uint64_t signature = detail::fnv1a_offset;
  std::string problem;
  for (const auto& [name, t] : tensors) {
    signature = detail::fnv1a(detail::describe(name, t), signature);
    if (problem.empty()) problem = detail::unmovable(name, t);
  }
  detail::agree(comm, problem, signature, root, "tutti::torch::broadcast_parameters");
  for (const auto& [name, t] : tensors) detail::broadcast_bytes(comm, t, root);
}

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
inline void broadcast_optimizer_state(Communicator& comm, ::torch::optim::Optimizer& optimizer, int root) {
  const detail::OptimizerKind kind = detail::kind_of(optimizer);
  const std::string type_name = c10::demangle(typeid(optimizer).name());
  auto& groups = optimizer.param_groups();
  std::uint64_t signature = detail::fnv1a(type_name + "/" + std::to_string(groups.size()));
  std::string problem;
  std::vector<::torch::Tensor> params;
  for (std::size_t g = 0; g < groups.size(); ++g) {
    for (const auto& p : groups[g].params()) {
      const std::string name = "param group " + std::to_string(g) + " parameter " + std::to_string(params.size());
      signature = detail::fnv1a(detail::describe(name, p), signature);
      if (problem.empty()) problem = detail::unmovable(name, p);
      params.push_back(p);
    }
  }
  detail::agree(comm, problem, signature, root, "tutti::torch::broadcast_optimizer_state(" + type_name + ")");

  for (auto& group : groups) {
    std::vector<double> values = detail::group_options(kind, group.options());
    if (!values.empty()) comm.broadcast(values.data(), values.size(), DataType::f64, root);
    detail::set_group_options(kind, group.options(), values);
  }

  std::vector<std::uint8_t> flags(params.size());
  for (std::size_t i = 0; i < params.size(); ++i) flags[i] = detail::state_flags(optimizer, kind, params[i]);
  if (!flags.empty()) comm.broadcast(flags.data(), flags.size(), DataType::u8, root);
  const bool root_has_state = std::any_of(flags.begin(), flags.end(), [](std::uint8_t f) { return f != 0; });
  if (root_has_state && kind == detail::OptimizerKind::other)
    throw Error(ErrorCode::invalid_argument, "tutti::torch::broadcast_optimizer_state: rank " + std::to_string(root) +
                                                 " has optimizer state for " + type_name +
                                                 ", whose state it cannot broadcast (only SGD, Adam and AdamW)");
  for (std::size_t i = 0; i < params.size(); ++i) {
    if (flags[i] == 0) {
      optimizer.state().erase(detail::state_key(params[i]));
      continue;
    }
    detail::broadcast_param_state(comm, optimizer, kind, params[i], flags[i], root);
  }
}

}  // namespace tutti::torch
