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

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <typeinfo>
#include <unordered_set>
#include <utility>
#include <vector>

#include <c10/util/C++17.h>
#include <c10/util/Type.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/nn/module.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/optimizer.h>
#include <torch/optim/sgd.h>

#include "tutti/engine.hpp"
#include "tutti/tutti.hpp"

namespace tutti::torch {

/// The Tutti type of a tensor's elements: float32/64, float16, bfloat16, int8, uint8, int32,
/// int64. Any other type (bool, complex, …) or an undefined tensor is an
/// Error(invalid_argument) naming the type.
inline DataType dtype_of(const ::torch::Tensor& tensor) {
  if (!tensor.defined()) throw Error(ErrorCode::invalid_argument, "tutti::torch::dtype_of: the tensor is undefined");
  switch (tensor.scalar_type()) {
    case ::torch::kFloat:
      return DataType::f32;
    case ::torch::kDouble:
      return DataType::f64;
    case ::torch::kHalf:
      return DataType::f16;
    case ::torch::kBFloat16:
      return DataType::bf16;
    case ::torch::kChar:
      return DataType::i8;
    case ::torch::kByte:
      return DataType::u8;
    case ::torch::kInt:
      return DataType::i32;
    case ::torch::kLong:
      return DataType::i64;
    default:
      throw Error(ErrorCode::invalid_argument,
                  std::string("tutti::torch::dtype_of: tensor type ") + c10::toString(tensor.scalar_type()) +
                      " has no Tutti DataType (supported: Float, Double, Half, BFloat16, Char, Byte, Int, Long)");
  }
}

namespace detail {

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

/// Calls `on_ready` after AccumulateGrad has added a backward pass's gradient to `param.grad()`.
class GradReadyHook final : public ::torch::autograd::FunctionPostHook {
 public:
  explicit GradReadyHook(std::function<void()> on_ready) : on_ready_(std::move(on_ready)) {}
  ::torch::autograd::variable_list operator()(const ::torch::autograd::variable_list& outputs,
                                              const ::torch::autograd::variable_list& /*inputs*/) override {
    on_ready_();
    return outputs;
  }

 private:
  std::function<void()> on_ready_;
};

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
  const std::string key = c10::guts::to_string(param.unsafeGetTensorImpl());
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
  auto it = optimizer.state().find(c10::guts::to_string(param.unsafeGetTensorImpl()));
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
      optimizer.state().erase(c10::guts::to_string(params[i].unsafeGetTensorImpl()));
      continue;
    }
    detail::broadcast_param_state(comm, optimizer, kind, params[i], flags[i], root);
  }
}

struct DistributedOptions {
  /// Reduce each gradient as soon as backward has produced it (true), or all of them in step().
  bool overlap = true;
  /// Backward passes accumulated locally per optimizer step (gradient accumulation).
  int backward_passes_per_step = 1;
  /// The engine's settings; `engine.fusion_threshold` bounds a fused allreduce.
  EngineOptions engine = EngineOptions::from_environment();
};

/// Where the communication time of the steps went (seconds summed over steps).
struct OverlapStats {
  double allreduce_seconds = 0;  ///< inside the engine's allreduce calls
  double hidden_seconds = 0;     ///< of those, before backward ended (overlapped with compute)
  double wait_seconds = 0;       ///< step(), from the end of backward until the gradients were reduced
  std::uint64_t bytes = 0;       ///< bytes the allreduces reduced
  std::uint64_t steps = 0;       ///< optimizer steps taken
};

/// Wraps a libtorch optimizer so that step() applies gradients averaged over the ranks.
///
/// Gradients are AVERAGED over ranks and SUMMED over the `backward_passes_per_step` backward
/// passes of an accumulation window (scale the loss by 1/backward_passes_per_step for a mean).
/// Every rank must call zero_grad/backward/step in the same pattern; construction and
/// destruction are collective (they build and stop an Engine). Parameters that do not require
/// grad are ignored; the others must be CPU leaf tensors with unique names that mean the same
/// tensor on every rank, and must include every parameter the optimizer updates.
class DistributedOptimizer {
 public:
  /// Errors: Error(invalid_argument) for a duplicate or empty name, an undefined, non-leaf or
  /// non-CPU tensor, an unsupported type, backward_passes_per_step < 1, or an optimizer
  /// parameter missing from `named_parameters`.
  DistributedOptimizer(Communicator& comm, ::torch::optim::Optimizer& optimizer,
                       std::vector<std::pair<std::string, ::torch::Tensor>> named_parameters,
                       DistributedOptions options = {})
      : optimizer_(optimizer),
        options_(std::move(options)),
        params_(make_params(std::move(named_parameters), optimizer, options_)),
        engine_(comm, options_.engine) {
    if (options_.overlap) install_hooks();
  }

  /// Collective (destroys the engine); gradients still in flight are abandoned.
  ~DistributedOptimizer() {
    for (auto& p : params_)
      if (p.accumulator && p.hook_key) p.accumulator->del_post_hook(p.hook_key);
  }
  DistributedOptimizer(const DistributedOptimizer&) = delete;
  DistributedOptimizer& operator=(const DistributedOptimizer&) = delete;

  /// Counts a backward pass; on the last pass of an accumulation window, completes the
  /// allreduce of every gradient (enqueueing those backward did not, with zeros for gradients
  /// that are undefined) and steps the wrapped optimizer. On the other passes it only counts.
  /// Throws the engine's Error for a failed allreduce (after waiting for all of them).
  void step() {
    if (++step_calls_ < options_.backward_passes_per_step) return;
    step_calls_ = 0;
    if (!synchronized_) reduce_gradients();
    synchronized_ = false;
    const auto start = std::chrono::steady_clock::now();
    optimizer_.step();
    engine_.record_phase("OPTIMIZER", start, std::chrono::steady_clock::now());
  }

  /// Completes the gradients' allreduce without stepping (e.g. to clip them before step());
  /// the next step() then does not reduce again. Call it after the window's last backward pass.
  void synchronize() {
    reduce_gradients();
    synchronized_ = true;
  }

  /// The wrapped optimizer's zero_grad, at the start of an accumulation window only: within a
  /// window it does nothing, so a loop calling zero_grad/backward/step every pass accumulates.
  /// Error(invalid_argument) while gradients are being reduced (backward without step()).
  void zero_grad() {
    if (step_calls_ != 0) return;
    {
      std::lock_guard lock(mutex_);
      for (const auto& p : params_)
        if (p.enqueued)
          throw Error(ErrorCode::invalid_argument, "tutti::torch::DistributedOptimizer::zero_grad: the gradient of " +
                                                       p.name + " is being reduced; call step() after backward");
    }
    optimizer_.zero_grad();
  }

  Engine& engine() { return engine_; }
  ::torch::optim::Optimizer& optimizer() { return optimizer_; }
  const DistributedOptions& options() const { return options_; }

  OverlapStats overlap_stats() const { return stats_; }
  void reset_overlap_stats() { stats_ = {}; }

 private:
  struct Param {
    std::string name;
    ::torch::Tensor tensor;
    std::shared_ptr<::torch::autograd::Node> accumulator;  // kept alive: the hook lives on it
    std::uintptr_t hook_key = 0;
    int passes = 0;          // backward passes that produced this gradient in the window
    bool enqueued = false;   // handed to the engine in this window
    ::torch::Tensor grad;    // the gradient being reduced
    ::torch::Tensor buffer;  // what the engine reduces: grad, or a contiguous copy of it
    Handle handle;
  };

  static std::vector<Param> make_params(std::vector<std::pair<std::string, ::torch::Tensor>> named,
                                        ::torch::optim::Optimizer& optimizer, const DistributedOptions& options) {
    const std::string where = "tutti::torch::DistributedOptimizer: ";
    if (options.backward_passes_per_step < 1)
      throw Error(ErrorCode::invalid_argument, where + "backward_passes_per_step must be at least 1, not " +
                                                   std::to_string(options.backward_passes_per_step));
    std::vector<Param> params;
    std::unordered_set<std::string> names;
    std::unordered_set<const void*> impls;
    for (auto& [name, tensor] : named) {
      if (name.empty()) throw Error(ErrorCode::invalid_argument, where + "a parameter has an empty name");
      if (!names.insert(name).second)
        throw Error(ErrorCode::invalid_argument, where + "duplicate parameter name " + name);
      if (!tensor.defined()) throw Error(ErrorCode::invalid_argument, where + "parameter " + name + " is undefined");
      if (!tensor.requires_grad()) continue;
      if (!tensor.is_leaf())
        throw Error(ErrorCode::invalid_argument, where + "parameter " + name + " is not a leaf tensor");
      if (!tensor.device().is_cpu())
        throw Error(ErrorCode::invalid_argument,
                    where + "parameter " + name + " is on " + tensor.device().str() + " (CPU tensors only)");
      dtype_of(tensor);  // throws for an unsupported type
      impls.insert(tensor.unsafeGetTensorImpl());
      if (tensor.numel() == 0) continue;  // nothing to reduce
      Param p;
      p.name = name;
      p.tensor = tensor;
      params.push_back(std::move(p));
    }
    for (std::size_t g = 0; g < optimizer.param_groups().size(); ++g) {
      const auto& group_params = optimizer.param_groups()[g].params();
      for (std::size_t i = 0; i < group_params.size(); ++i)
        if (group_params[i].requires_grad() && !impls.count(group_params[i].unsafeGetTensorImpl()))
          throw Error(ErrorCode::invalid_argument, where + "parameter " + std::to_string(i) + " of param group " +
                                                       std::to_string(g) +
                                                       " is not among the named parameters: its gradient "
                                                       "would not be averaged");
    }
    return params;
  }

  void install_hooks() {
    for (std::size_t i = 0; i < params_.size(); ++i) {
      Param& p = params_[i];
      p.accumulator = ::torch::autograd::impl::grad_accumulator(p.tensor);
      if (!p.accumulator) continue;  // cannot happen for a leaf that requires grad
      p.hook_key =
          p.accumulator->add_post_hook(std::make_unique<detail::GradReadyHook>([this, i] { on_grad_ready(i); }));
    }
  }

  // Runs in the thread that runs backward, after AccumulateGrad.
  void on_grad_ready(std::size_t i) {
    std::lock_guard lock(mutex_);
    Param& p = params_[i];
    if (p.enqueued)
      throw Error(ErrorCode::invalid_argument, "tutti::torch::DistributedOptimizer: the gradient of " + p.name +
                                                   " was computed more than backward_passes_per_step (" +
                                                   std::to_string(options_.backward_passes_per_step) +
                                                   ") times before step()");
    if (++p.passes < options_.backward_passes_per_step) return;
    enqueue(p);
  }

  // Caller holds mutex_.
  void enqueue(Param& p) {
    ::torch::NoGradGuard no_grad;
    if (!p.tensor.grad().defined()) p.tensor.mutable_grad() = ::torch::zeros_like(p.tensor);
    p.grad = p.tensor.grad();
    p.buffer = p.grad.is_contiguous() ? p.grad : p.grad.contiguous();
    p.handle = engine_.enqueue_allreduce(p.name, p.buffer.data_ptr(), static_cast<std::size_t>(p.buffer.numel()),
                                         dtype_of(p.buffer), ReduceOp::avg);
    p.enqueued = true;
  }

  void reduce_gradients() {
    const auto backward_end = std::chrono::steady_clock::now();
    {
      std::lock_guard lock(mutex_);
      for (auto& p : params_)
        if (!p.enqueued) enqueue(p);
    }
    engine_.flush();
    std::exception_ptr failure;
    {
      std::lock_guard lock(mutex_);
      ::torch::NoGradGuard no_grad;
      for (auto& p : params_) {
        try {
          p.handle.wait();
          if (!p.buffer.is_same(p.grad)) p.grad.copy_(p.buffer);
        } catch (...) {
          if (!failure) failure = std::current_exception();
        }
        p.passes = 0;
        p.enqueued = false;
        p.grad = p.buffer = ::torch::Tensor();
        p.handle = Handle();
      }
    }
    const auto wait_end = std::chrono::steady_clock::now();
    // From the end of backward: the enqueues above may already have started allreduces.
    account(backward_end, std::chrono::duration<double>(wait_end - backward_end).count());
    if (failure) std::rethrow_exception(failure);
  }

  void account(std::chrono::steady_clock::time_point backward_end, double wait_seconds) {
    for (const auto& r : engine_.take_allreduce_records()) {
      stats_.allreduce_seconds += std::chrono::duration<double>(r.end - r.start).count();
      const auto hidden_end = std::min(r.end, backward_end);
      if (hidden_end > r.start) stats_.hidden_seconds += std::chrono::duration<double>(hidden_end - r.start).count();
      stats_.bytes += r.bytes;
    }
    stats_.wait_seconds += wait_seconds;
    stats_.steps += 1;
  }

  ::torch::optim::Optimizer& optimizer_;
  DistributedOptions options_;
  std::vector<Param> params_;  // before engine_: the buffers outlive the engine that writes them
  std::mutex mutex_;
  int step_calls_ = 0;
  bool synchronized_ = false;
  OverlapStats stats_;
  Engine engine_;
};

}  // namespace tutti::torch
