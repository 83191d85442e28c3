// Copying root's parameters and optimizer state to every rank (include/tutti/torch_broadcast.hpp),
// and the helpers the other files share (broadcast.hpp).
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <typeinfo>
#include <utility>
#include <vector>

#include <c10/util/Type.h>
#include <torch/nn/module.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/optimizer.h>
#include <torch/optim/sgd.h>

#include "libtorch/broadcast.hpp"
#include "tutti/torch_broadcast.hpp"
#include "tutti/torch_dtype.hpp"

namespace tutti::libtorch {

namespace detail {

OptimizerStateKey state_key(const torch::Tensor& param) {
  return state_key_of<OptimizerStateKey>(param.unsafeGetTensorImpl());
}

std::string describe(const std::string& name, const torch::Tensor& t) {
  if (!t.defined()) return name + ":undefined;";
  std::string s = name + ":" + c10::toString(t.scalar_type()) + "[";
  for (auto d : t.sizes()) s += std::to_string(d) + ",";
  return s + "];";
}

std::string unmovable(const std::string& name, const torch::Tensor& t) {
  if (!t.defined()) return {};
  if (!t.device().is_cpu()) return name + " is on " + t.device().str() + " (CPU tensors only)";
  if (!t.is_contiguous()) return name + " is not contiguous";
  return {};
}

void agree(Communicator& comm, std::string problem, std::uint64_t signature, int root, std::string_view what) {
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

void broadcast_bytes(Communicator& comm, const torch::Tensor& t, int root) {
  if (t.defined() && t.nbytes() > 0) comm.broadcast(t.data_ptr(), t.nbytes(), DataType::u8, root);
}

OptimizerKind kind_of(torch::optim::Optimizer& optimizer) {
  if (dynamic_cast<torch::optim::SGD*>(&optimizer)) return OptimizerKind::sgd;
  if (dynamic_cast<torch::optim::Adam*>(&optimizer)) return OptimizerKind::adam;
  if (dynamic_cast<torch::optim::AdamW*>(&optimizer)) return OptimizerKind::adamw;
  return OptimizerKind::other;
}

std::vector<double> group_options(OptimizerKind kind, torch::optim::OptimizerOptions& options) {
  if (kind == OptimizerKind::sgd) {
    auto& o = static_cast<torch::optim::SGDOptions&>(options);
    return {o.lr(), o.momentum(), o.dampening(), o.weight_decay(), o.nesterov() ? 1.0 : 0.0};
  }
  if (kind == OptimizerKind::adam || kind == OptimizerKind::adamw) {
    auto get = [](auto& o) -> std::vector<double> {
      return {o.lr(),  std::get<0>(o.betas()), std::get<1>(o.betas()),
              o.eps(), o.weight_decay(),       o.amsgrad() ? 1.0 : 0.0};
    };
    if (kind == OptimizerKind::adam) return get(static_cast<torch::optim::AdamOptions&>(options));
    return get(static_cast<torch::optim::AdamWOptions&>(options));
  }
  try {
    return {options.get_lr()};
  } catch (const c10::Error&) {
    return {};  // an optimizer without a learning rate (the same on every rank: the types agree)
  }
}

void set_group_options(OptimizerKind kind, torch::optim::OptimizerOptions& options, const std::vector<double>& v) {
  if (kind == OptimizerKind::sgd) {
    auto& o = static_cast<torch::optim::SGDOptions&>(options);
    o.lr(v[0]).momentum(v[1]).dampening(v[2]).weight_decay(v[3]).nesterov(v[4] != 0);
  } else if (kind == OptimizerKind::adam || kind == OptimizerKind::adamw) {
    auto set = [&](auto& o) {
      o.lr(v[0]).betas(std::make_tuple(v[1], v[2])).eps(v[3]).weight_decay(v[4]).amsgrad(v[5] != 0);
    };
    if (kind == OptimizerKind::adam)
      set(static_cast<torch::optim::AdamOptions&>(options));
    else
      set(static_cast<torch::optim::AdamWOptions&>(options));
  } else if (!v.empty()) {
    options.set_lr(v[0]);
  }
}

torch::Tensor receivable(const torch::Tensor& t, const torch::Tensor& param) {
  if (t.defined() && t.sizes() == param.sizes() && t.scalar_type() == param.scalar_type() && t.is_contiguous() &&
      t.device().is_cpu())
    return t;
  return torch::zeros_like(param, torch::TensorOptions(), torch::MemoryFormat::Contiguous);
}

void broadcast_param_state(Communicator& comm, torch::optim::Optimizer& optimizer, OptimizerKind kind,
                           const torch::Tensor& param, std::uint8_t flags, int root) {
  auto& state = optimizer.state();
  const OptimizerStateKey key = state_key(param);
  auto it = state.find(key);
  if (kind == OptimizerKind::sgd) {
    auto* s = it == state.end() ? nullptr : dynamic_cast<torch::optim::SGDParamState*>(it->second.get());
    if (!s) {
      state[key] = std::make_unique<torch::optim::SGDParamState>();
      s = static_cast<torch::optim::SGDParamState*>(state[key].get());
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
      s->max_exp_avg_sq(torch::Tensor());
    }
  };
  if (kind == OptimizerKind::adam) {
    using S = torch::optim::AdamParamState;
    adam_like(it == state.end() ? nullptr : dynamic_cast<S*>(it->second.get()), [] { return std::make_unique<S>(); });
  } else {
    using S = torch::optim::AdamWParamState;
    adam_like(it == state.end() ? nullptr : dynamic_cast<S*>(it->second.get()), [] { return std::make_unique<S>(); });
  }
}

std::uint8_t state_flags(torch::optim::Optimizer& optimizer, OptimizerKind kind, const torch::Tensor& param) {
  auto it = optimizer.state().find(detail::state_key(param));
  if (it == optimizer.state().end()) return 0;
  torch::Tensor max_sq;
  if (kind == OptimizerKind::adam) {
    if (auto* s = dynamic_cast<torch::optim::AdamParamState*>(it->second.get())) max_sq = s->max_exp_avg_sq();
  } else if (kind == OptimizerKind::adamw) {
    if (auto* s = dynamic_cast<torch::optim::AdamWParamState*>(it->second.get())) max_sq = s->max_exp_avg_sq();
  }
  return static_cast<std::uint8_t>(1 | (max_sq.defined() ? 2 : 0));
}

}  // namespace detail

void broadcast_parameters(Communicator& comm, torch::nn::Module& module, int root) {
  std::vector<std::pair<std::string, torch::Tensor>> tensors;
  for (const auto& item : module.named_parameters(true)) tensors.emplace_back(item.key(), item.value());
  for (const auto& item : module.named_buffers(true)) tensors.emplace_back(item.key(), item.value());
  std::sort(tensors.begin(), tensors.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  std::uint64_t signature = detail::fnv1a_offset;
  std::string problem;
  for (const auto& [name, t] : tensors) {
    signature = detail::fnv1a(detail::describe(name, t), signature);
    if (problem.empty()) problem = detail::unmovable(name, t);
  }
  detail::agree(comm, problem, signature, root, "tutti::libtorch::broadcast_parameters");
  for (const auto& [name, t] : tensors) detail::broadcast_bytes(comm, t, root);
}

void broadcast_optimizer_state(Communicator& comm, torch::optim::Optimizer& optimizer, int root) {
  const detail::OptimizerKind kind = detail::kind_of(optimizer);
  const std::string type_name = c10::demangle(typeid(optimizer).name());
  auto& groups = optimizer.param_groups();
  std::uint64_t signature = detail::fnv1a(type_name + "/" + std::to_string(groups.size()));
  std::string problem;
  std::vector<torch::Tensor> params;
  for (std::size_t g = 0; g < groups.size(); ++g) {
    for (const auto& p : groups[g].params()) {
      const std::string name = "param group " + std::to_string(g) + " parameter " + std::to_string(params.size());
      signature = detail::fnv1a(detail::describe(name, p), signature);
      if (problem.empty()) problem = detail::unmovable(name, p);
      params.push_back(p);
    }
  }
  detail::agree(comm, problem, signature, root, "tutti::libtorch::broadcast_optimizer_state(" + type_name + ")");

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
    throw Error(ErrorCode::invalid_argument, "tutti::libtorch::broadcast_optimizer_state: rank " +
                                                 std::to_string(root) + " has optimizer state for " + type_name +
                                                 ", whose state it cannot broadcast (only SGD, Adam and AdamW)");
  for (std::size_t i = 0; i < params.size(); ++i) {
    if (flags[i] == 0) {
      optimizer.state().erase(detail::state_key(params[i]));
      continue;
    }
    detail::broadcast_param_state(comm, optimizer, kind, params[i], flags[i], root);
  }
}

}  // namespace tutti::libtorch
