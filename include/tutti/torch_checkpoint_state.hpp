// libtorch glue: what a checkpoint holds (torch_checkpoint.hpp): the parameters, the optimizer's
// per-parameter state taken apart field by field, and the param groups' options, as named
// tensors, and which rank writes which. Part of <tutti/torch.hpp>; header-only.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <typeinfo>
#include <utility>
#include <vector>

#include <c10/util/Type.h>
#include <torch/optim/adagrad.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/optimizer.h>
#include <torch/optim/rmsprop.h>
#include <torch/optim/sgd.h>

#include "tutti/torch_broadcast.hpp"
#include "tutti/torch_checkpoint_format.hpp"  // CheckpointEntry
#include "tutti/tutti.hpp"

namespace tutti::torch {

namespace detail {

using NamedTensors = std::vector<std::pair<std::string, ::torch::Tensor>>;

/// How the per-parameter state of one torch::optim optimizer is taken apart and rebuilt: its
/// tensor fields (each shaped like the parameter) and its step counter (an i64[1] named "step").
struct StateCodec {
  std::vector<std::string> fields;
  std::function<NamedTensors(::torch::optim::OptimizerParamState&)> read;
  std::function<std::unique_ptr<::torch::optim::OptimizerParamState>(const std::map<std::string, ::torch::Tensor>&)>
      make;
};

template <class S>
StateCodec codec_of(std::vector<std::pair<std::string, ::torch::Tensor& (*)(S&)>> tensors,
                    std::int64_t& (*step)(S&) = nullptr) {
  StateCodec codec;
  if (step) codec.fields.push_back("step");
  for (const auto& field : tensors) codec.fields.push_back(field.first);
  codec.read = [tensors, step](::torch::optim::OptimizerParamState& base) {
    auto& s = static_cast<S&>(base);  // the optimizer's type chose S
    NamedTensors out;
    if (step) out.emplace_back("step", ::torch::full({1}, step(s), ::torch::kInt64));
    for (const auto& [name, get] : tensors)
      if (get(s).defined()) out.emplace_back(name, get(s));
    return out;
  };
  codec.make = [tensors, step](const std::map<std::string, ::torch::Tensor>& values) {
    auto s = std::make_unique<S>();
    if (step) step(*s) = values.at("step").template item<std::int64_t>();
    for (const auto& [name, get] : tensors)
      if (auto it = values.find(name); it != values.end()) get(*s) = it->second;
    return std::unique_ptr<::torch::optim::OptimizerParamState>(std::move(s));
  };
  return codec;
}

/// The codec of `optimizer`'s type; nullopt for a type other than SGD, Adam, AdamW, Adagrad, RMSprop.
inline std::optional<StateCodec> state_codec(::torch::optim::Optimizer& optimizer) {
  namespace o = ::torch::optim;
  using T = ::torch::Tensor;
  if (dynamic_cast<o::SGD*>(&optimizer))
    return codec_of<o::SGDParamState>(
        {{"momentum_buffer", +[](o::SGDParamState& s) -> T& { return s.momentum_buffer(); }}});
  auto adam = [](auto* state) {
    using S = std::remove_pointer_t<decltype(state)>;
    return codec_of<S>(
        {{"exp_avg", +[](S& s) -> T& { return s.exp_avg(); }},
         {"exp_avg_sq", +[](S& s) -> T& { return s.exp_avg_sq(); }},
         {"max_exp_avg_sq", +[](S& s) -> T& { return s.max_exp_avg_sq(); }}},
        +[](S& s) -> std::int64_t& { return s.step(); });
  };
  if (dynamic_cast<o::Adam*>(&optimizer)) return adam(static_cast<o::AdamParamState*>(nullptr));
  if (dynamic_cast<o::AdamW*>(&optimizer)) return adam(static_cast<o::AdamWParamState*>(nullptr));
  using G = o::AdagradParamState;
  if (dynamic_cast<o::Adagrad*>(&optimizer))
    return codec_of<G>(
        {{"sum", +[](G& s) -> T& { return s.sum(); }}}, +[](G& s) -> std::int64_t& { return s.step(); });
  using R = o::RMSpropParamState;
  if (dynamic_cast<o::RMSprop*>(&optimizer))
    return codec_of<R>(
        {{"square_avg", +[](R& s) -> T& { return s.square_avg(); }},
         {"momentum_buffer", +[](R& s) -> T& { return s.momentum_buffer(); }},
         {"grad_avg", +[](R& s) -> T& { return s.grad_avg(); }}},
        +[](R& s) -> std::int64_t& { return s.step(); });
  return std::nullopt;
}

inline std::string optimizer_type(::torch::optim::Optimizer& optimizer) {
  return c10::demangle(typeid(optimizer).name());
}

/// "Float[128,1568]": what the MANIFEST records of a parameter.
inline std::string shape_of(const ::torch::Tensor& t) {
  std::string s = std::string(c10::toString(t.scalar_type())) + "[";
  for (std::int64_t d = 0; d < t.dim(); ++d) s += (d ? "," : "") + std::to_string(t.size(d));
  return s + "]";
}

/// Everything a checkpoint holds, as live tensors (not copies), in an order every rank shares:
/// "param/NAME", "state/NAME/FIELD", "group/G" (the group's options, f64). Error(unsupported)
/// for optimizer state of a type no codec knows.
inline std::vector<CheckpointEntry> checkpoint_entries(const NamedTensors& params,
                                                       ::torch::optim::Optimizer& optimizer) {
  std::vector<CheckpointEntry> entries;
  for (const auto& [name, t] : params) entries.push_back({"param/" + name, t});
  const auto codec = state_codec(optimizer);
  for (const auto& [name, t] : params) {
    const auto it = optimizer.state().find(state_key(t));
    if (it == optimizer.state().end()) continue;
    if (!codec)
      throw Error(ErrorCode::unsupported, "tutti::torch checkpoint: cannot save the state of " +
                                              optimizer_type(optimizer) + " (SGD, Adam, AdamW, Adagrad, RMSprop only)");
    for (auto& [field, value] : codec->read(*it->second)) entries.push_back({"state/" + name + "/" + field, value});
  }
  const auto kind = kind_of(optimizer);
  for (std::size_t g = 0; g < optimizer.param_groups().size(); ++g)
    entries.push_back({"group/" + std::to_string(g),
                       ::torch::tensor(group_options(kind, optimizer.param_groups()[g].options()), ::torch::kFloat64)});
  return entries;
}

/// The rank that writes each entry: greedy by bytes, so that shards are about equal in size.
inline std::vector<int> shard_owners(const std::vector<CheckpointEntry>& entries, int world) {
  std::vector<std::uint64_t> load(static_cast<std::size_t>(world));
  std::vector<int> owners;
  for (const auto& e : entries) {
    std::size_t least = 0;
    for (std::size_t r = 1; r < load.size(); ++r)
      if (load[r] < load[least]) least = r;
    owners.push_back(static_cast<int>(least));
    load[least] += e.tensor.nbytes() + e.name.size() + 32;
  }
  return owners;
}

}  // namespace detail
}  // namespace tutti::torch
