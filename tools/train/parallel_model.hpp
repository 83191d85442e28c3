// tutti-train's layout of ranks (data x pipeline x tensor) and each rank's part of the network.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "model.hpp"
#include "settings.hpp"
#include "tutti/torch.hpp"
#include "tutti/tutti.hpp"

namespace tutti::train {

/// Where a rank sits in the grid. Ranks are numbered tensor fastest, then pipeline, then data:
/// rank = (d * pipeline + p) * tensor + t, so that a tensor-parallel group (the most traffic)
/// holds neighbouring ranks, on one host where hosts hold consecutive ranks.
struct Layout {
  int data = 1, pipeline = 1, tensor = 1;         // the grid's sides
  int d = 0, p = 0, t = 0;                        // this rank's coordinates
  int first_unit = 0, end_unit = NetImpl::units;  // this rank's stage: units [first_unit, end_unit)

  /// The layout s asks for over `size` ranks, as seen by `rank`. Throws UsageError naming the
  /// mismatch: ranks not divisible by pipeline x tensor, more stages than units (a stage with no
  /// layers), a tensor split that does not divide fc1's outputs.
  static Layout of(const Settings& s, int rank, int size);
  bool first_stage() const { return p == 0; }
  bool last_stage() const { return p == pipeline - 1; }
};

/// Units [first, end) of stage `stage` of `stages`: an even split of NetImpl::units, the
/// remainder to the last stages.
std::pair<int, int> stage_units(int stages, int stage);

/// The communicators of a rank's three groups (each made by split: collective over the world).
struct Groups {
  Communicator data, pipeline, tensor;
  Groups(Communicator& world, const Layout& layout);
};

/// This rank's part of the network: its stage's units, with fc1 split by columns and fc2 by rows
/// over the tensor group. Every rank builds the whole network from the seed first and keeps its
/// part, so that every layout starts from the single-rank run's weights.
class ModelPart {
 public:
  ModelPart(const Settings& s, const Layout& layout, Communicator& tensor);

  /// The stage's units applied to x.
  torch::Tensor forward(torch::Tensor x);
  /// The part's parameters with the whole network's names (conv1.weight, fc1.bias, …).
  std::vector<std::pair<std::string, torch::Tensor>> named_parameters() const;
  /// The shape of one sample of the stage's input (what the previous stage's units return).
  std::vector<std::int64_t> input_shape();
  /// The whole network (its units outside this part are not trained here).
  Net& net() { return net_; }

 private:
  Layout layout_;
  Net net_{nullptr};
  tutti::libtorch::ColumnParallelLinear fc1_{nullptr};  // tensor > 1 only
  tutti::libtorch::RowParallelLinear fc2_{nullptr};
};

}  // namespace tutti::train
