#include "out_of_core.hpp"

namespace tutti::train {
namespace {

offload::Options options_of(bool swap) {
  offload::Options options;
  options.swap = swap;
  return options;
}

}  // namespace

OutOfCore::OutOfCore(NetImpl& net, std::size_t budget_bytes, bool swap)
    : net_(net), pool_(budget_bytes, options_of(swap)), parameters_(pool_, net.parameters()), store_(pool_) {}

OutOfCore::~OutOfCore() = default;

torch::Tensor OutOfCore::forward(const torch::Tensor& images, const torch::Tensor& labels) {
  if (!torch::GradMode::is_enabled()) return loss_of(net_.forward(images), labels);
  store_.clear();
  // NetImpl's four units, each through its offloaded twin (NetImpl::forward_unit).
  auto x = tutti::libtorch::conv2d_relu_maxpool2d(store_, images, net_.conv1->weight, net_.conv1->bias, 1, 2);
  x = tutti::libtorch::conv2d_relu_maxpool2d(store_, x, net_.conv2->weight, net_.conv2->bias, 1, 2).flatten(1);
  x = tutti::libtorch::linear(store_, x, net_.fc1->weight, net_.fc1->bias, true);
  x = tutti::libtorch::linear(store_, x, net_.fc2->weight, net_.fc2->bias, false);
  return loss_of(x, labels);
}

std::unique_ptr<tutti::libtorch::OffloadedSGD> OutOfCore::make_sgd(const torch::optim::SGDOptions& options) {
  return std::make_unique<tutti::libtorch::OffloadedSGD>(pool_, net_.parameters(), options);
}

}  // namespace tutti::train
