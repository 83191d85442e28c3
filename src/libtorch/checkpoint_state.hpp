// libtorch glue: what a checkpoint holds (torch_checkpoint.hpp): the parameters, the optimizer's
// per-parameter state taken apart field by field, and the param groups' options, as named
// tensors, and which rank writes which. Private to Tutti::torch (checkpoint_state.cpp).
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

#include "libtorch/broadcast.hpp"
#include "libtorch/checkpoint_format.hpp"  // CheckpointEntry
#include "tutti/compress.hpp"
#include "tutti/tutti.hpp"

namespace tutti::libtorch {

namespace detail {

using NamedTensors = std::vector<std::pair<std::string, torch::Tensor>>;

/// How the per-parameter state of one torch::optim optimizer is taken apart and rebuilt: its
/// tensor fields (each shaped like the parameter) and its step counter (an i64[1] named "step").
struct StateCodec {
  std::vector<std::string> fields;
  std::function<NamedTensors(torch::optim::OptimizerParamState&)> read;
  std::function<std::unique_ptr<torch::optim::OptimizerParamState>(const std::map<std::string, torch::Tensor>&)> make;
};

template <class S>
StateCodec codec_of(std::vector<std::pair<std::string, torch::Tensor& (*)(S&)>> tensors,
                    std::int64_t& (*step)(S&) = nullptr) {
  StateCodec codec;
  if (step) codec.fields.push_back("step");
  for (const auto& field : tensors) codec.fields.push_back(field.first);
  codec.read = [tensors, step](torch::optim::OptimizerParamState& base) {
    auto& s = static_cast<S&>(base);  // the optimizer's type chose S
    NamedTensors out;
    if (step) out.emplace_back("step", torch::full({1}, step(s), torch::kInt64));
    for (const auto& [name, get] : tensors)
      if (get(s).defined()) out.emplace_back(name, get(s));
    return out;
  };
  codec.make = [tensors, step](const std::map<std::string, torch::Tensor>& values) {
    auto s = std::make_unique<S>();
    if (step) step(*s) = values.at("step").template item<std::int64_t>();
    for (const auto& [name, get] : tensors)
      if (auto it = values.find(name); it != values.end()) get(*s) = it->second;
    return std::unique_ptr<torch::optim::OptimizerParamState>(std::move(s));
  };
  return codec;
}

/// The codec of `optimizer`'s type; nullopt for a type other than SGD, Adam, AdamW, Adagrad, RMSprop.
std::optional<StateCodec> state_codec(torch::optim::Optimizer& optimizer);

std::string optimizer_type(torch::optim::Optimizer& optimizer);

/// "Float[128,1568]": what the MANIFEST records of a parameter.
std::string shape_of(const torch::Tensor& t);

/// Everything a checkpoint holds, as live tensors (not copies), in an order every rank shares:
/// "param/NAME", "state/NAME/FIELD", "group/G" (the group's options, f64). Error(unsupported)
/// for optimizer state of a type no codec knows.
std::vector<CheckpointEntry> checkpoint_entries(const NamedTensors& params, torch::optim::Optimizer& optimizer);

/// The rank that writes each entry: greedy by bytes, so that shards are about equal in size.
std::vector<int> shard_owners(const std::vector<CheckpointEntry>& entries, int world);

/// What a DistributedOptimizer's checkpoint holds beside the parameters and the optimizer.
struct CheckpointExtras {
  NamedTensors buffers;                                // "buffer/NAME", written like parameters
  compress::GradientCompressor* compressor = nullptr;  // "compressor/TEXT" and "rank/R/compressor/TEXT"
  bool generator = false;                              // "rank/R/generator": the CPU generator's state
};

/// The entries of `extras` that are the same on every rank (buffers, the compressor's shared
/// state), in an order every rank shares: sharded like the rest.
std::vector<CheckpointEntry> shared_extra_entries(const CheckpointExtras& extras);
/// This rank's own ("rank/R/..."): the compressor's residuals and the generator, which this rank
/// writes into its shard itself.
std::vector<CheckpointEntry> rank_extra_entries(const CheckpointExtras& extras, int rank);

}  // namespace detail
}  // namespace tutti::libtorch
