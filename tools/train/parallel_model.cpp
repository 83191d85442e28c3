#include "parallel_model.hpp"

namespace tutti::train {

std::pair<int, int> stage_units(int stages, int stage) {
  return {stage * NetImpl::units / stages, (stage + 1) * NetImpl::units / stages};
}

Layout Layout::of(const Settings& s, int rank, int size) {
  const int stage_ranks = s.pipeline * s.tensor_parallel;
  if (s.pipeline > NetImpl::units)
    throw UsageError("--pipeline " + std::to_string(s.pipeline) + ": the network has " +
                     std::to_string(NetImpl::units) +
                     " units (conv1, conv2, fc1, fc2), so a stage would have no layers");
  if (size % stage_ranks != 0)
    throw UsageError(std::to_string(size) + " ranks do not form a grid of pipeline " + std::to_string(s.pipeline) +
                     " x tensor " + std::to_string(s.tensor_parallel) + ": the job needs a multiple of " +
                     std::to_string(stage_ranks) + " ranks");
  if ((128 * s.width) % s.tensor_parallel != 0)
    throw UsageError("--tensor-parallel " + std::to_string(s.tensor_parallel) + " does not divide fc1's " +
                     std::to_string(128 * s.width) + " outputs");
  Layout l;
  l.data = size / stage_ranks;
  l.pipeline = s.pipeline;
  l.tensor = s.tensor_parallel;
  l.t = rank % l.tensor;
  l.p = rank / l.tensor % l.pipeline;
  l.d = rank / stage_ranks;
  std::tie(l.first_unit, l.end_unit) = stage_units(l.pipeline, l.p);
  return l;
}

Groups::Groups(Communicator& world, const Layout& l)
    : data(world.split(l.p * l.tensor + l.t, l.d)),
      pipeline(world.split(l.d * l.tensor + l.t, l.p)),
      tensor(world.split(l.d * l.pipeline + l.p, l.t)) {}

ModelPart::ModelPart(const Settings& s, const Layout& layout, Communicator& tensor) : layout_(layout) {
  torch::manual_seed(s.seed);
  net_ = Net(s.width);
  if (layout.tensor > 1) {
    fc1_ = tutti::libtorch::ColumnParallelLinear(tensor, net_->fc1);
    fc2_ = tutti::libtorch::RowParallelLinear(tensor, net_->fc2);
  }
}

torch::Tensor ModelPart::forward(torch::Tensor x) {
  for (int unit = layout_.first_unit; unit < layout_.end_unit; ++unit) {
    if (unit == 2 && fc1_)
      x = torch::relu(fc1_->forward(x));
    else if (unit == 3 && fc2_)
      x = fc2_->forward(x);
    else
      x = net_->forward_unit(unit, x);
  }
  return x;
}

std::vector<std::pair<std::string, torch::Tensor>> ModelPart::named_parameters() const {
  static constexpr const char* unit_names[NetImpl::units] = {"conv1", "conv2", "fc1", "fc2"};
  std::vector<std::pair<std::string, torch::Tensor>> out;
  for (int unit = layout_.first_unit; unit < layout_.end_unit; ++unit) {
    const std::string name = unit_names[unit];
    const torch::nn::Module* module = net_->named_children()[name].get();
    if (unit == 2 && fc1_) module = fc1_.get();
    if (unit == 3 && fc2_) module = fc2_.get();
    for (const auto& item : module->named_parameters()) out.emplace_back(name + "." + item.key(), item.value());
  }
  return out;
}

std::vector<std::int64_t> ModelPart::input_shape() {
  torch::NoGradGuard no_grad;
  auto x = torch::zeros({1, 1, 28, 28});
  for (int unit = 0; unit < layout_.first_unit; ++unit) x = net_->forward_unit(unit, x);
  auto shape = x.sizes().vec();
  shape.erase(shape.begin());
  // fc1's output, split over the tensor group, is fc2's input there.
  if (layout_.first_unit == 3 && layout_.tensor > 1) shape.back() /= layout_.tensor;
  return shape;
}

}  // namespace tutti::train
