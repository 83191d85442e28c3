// The checkpoint_state.hpp functions.
#include <ATen/CPUGeneratorImpl.h>
#include <c10/util/Type.h>
#include <torch/optim/adagrad.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/optimizer.h>
#include <torch/optim/rmsprop.h>
#include <torch/optim/sgd.h>
#include <cstdint>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <typeinfo>
#include <utility>
#include <vector>

#include "libtorch/broadcast.hpp"
#include "libtorch/checkpoint_format.hpp"  // CheckpointEntry
#include "libtorch/checkpoint_state.hpp"
#include "tutti/torch_checkpoint.hpp"
#include "tutti/tutti.hpp"

namespace tutti::libtorch {

namespace detail {

std::optional<StateCodec> state_codec(torch::optim::Optimizer& optimizer) {
  namespace o = torch::optim;
  using T = torch::Tensor;
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

std::string optimizer_type(torch::optim::Optimizer& optimizer) { return c10::demangle(typeid(optimizer).name()); }

std::string shape_of(const torch::Tensor& t) {
  std::string s = std::string(c10::toString(t.scalar_type())) + "[";
  for (std::int64_t d = 0; d < t.dim(); ++d) s += (d ? "," : "") + std::to_string(t.size(d));
  return s + "]";
}

std::vector<CheckpointEntry> checkpoint_entries(const NamedTensors& params, torch::optim::Optimizer& optimizer) {
  std::vector<CheckpointEntry> entries;
  for (const auto& [name, t] : params) entries.push_back({"param/" + name, t});
  const auto codec = state_codec(optimizer);
  for (const auto& [name, t] : params) {
    const auto it = optimizer.state().find(state_key(t));
    if (it == optimizer.state().end()) continue;
    if (!codec)
      throw Error(ErrorCode::unsupported, "tutti::libtorch checkpoint: cannot save the state of " +
                                              optimizer_type(optimizer) + " (SGD, Adam, AdamW, Adagrad, RMSprop only)");
    for (auto& [field, value] : codec->read(*it->second)) entries.push_back({"state/" + name + "/" + field, value});
  }
  const auto kind = kind_of(optimizer);
  for (std::size_t g = 0; g < optimizer.param_groups().size(); ++g)
    entries.push_back({"group/" + std::to_string(g),
                       torch::tensor(group_options(kind, optimizer.param_groups()[g].options()), torch::kFloat64)});
  return entries;
}

std::vector<int> shard_owners(const std::vector<CheckpointEntry>& entries, int world) {
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

namespace {

torch::Tensor bytes_tensor(const std::vector<std::byte>& bytes) {
  auto t = torch::empty({static_cast<std::int64_t>(bytes.size())}, torch::kUInt8);
  if (!bytes.empty()) std::memcpy(t.data_ptr(), bytes.data(), bytes.size());
  return t;
}

}  // namespace

std::vector<CheckpointEntry> shared_extra_entries(const CheckpointExtras& extras) {
  std::vector<CheckpointEntry> entries;
  for (const auto& [name, t] : extras.buffers) entries.push_back({"buffer/" + name, t});
  if (extras.compressor)
    entries.push_back({"compressor/" + extras.compressor->compression().to_string(),
                       bytes_tensor(extras.compressor->save_state().shared)});
  return entries;
}

std::vector<CheckpointEntry> rank_extra_entries(const CheckpointExtras& extras, int rank) {
  const std::string prefix = "rank/" + std::to_string(rank) + "/";
  std::vector<CheckpointEntry> entries;
  if (extras.compressor)
    entries.push_back({prefix + "compressor/" + extras.compressor->compression().to_string(),
                       bytes_tensor(extras.compressor->save_state().local)});
  if (extras.generator) entries.push_back({prefix + "generator", cpu_generator_state()});
  return entries;
}

}  // namespace detail

torch::Tensor cpu_generator_state() {
  auto generator = at::detail::getDefaultCPUGenerator();
  std::lock_guard lock(generator.mutex());
  return generator.get_state();
}

void set_cpu_generator_state(const torch::Tensor& state) {
  auto generator = at::detail::getDefaultCPUGenerator();
  std::lock_guard lock(generator.mutex());
  generator.set_state(state);
}

}  // namespace tutti::libtorch
