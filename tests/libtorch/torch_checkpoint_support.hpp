// Shared by the checkpoint tests (torch_checkpoint_test.cpp, torch_checkpoint_hostile_test.cpp):
// a small model, a temporary directory, integer-valued training steps, and a 1-rank checkpoint.
#pragma once

#include <gtest/gtest.h>

#include <torch/torch.h>

#include <stdlib.h>

#include <cstdint>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "libtorch/broadcast.hpp"  // state_key
#include "tutti/torch.hpp"

namespace tutti::testing {

struct NetImpl : torch::nn::Module {
  explicit NetImpl(std::int64_t hidden = 4)
      : fc1(register_module("fc1", torch::nn::Linear(5, hidden))),
        fc2(register_module("fc2", torch::nn::Linear(hidden, 3))) {}
  torch::Tensor forward(const torch::Tensor& x) { return fc2->forward(torch::tanh(fc1->forward(x))); }
  torch::nn::Linear fc1, fc2;
};
class Net : public torch::nn::ModuleHolder<NetImpl> {
 public:
  using torch::nn::ModuleHolder<NetImpl>::ModuleHolder;
};

// A directory of its own, removed with everything in it.
struct TempDir {
  TempDir() {
    std::string pattern = (std::filesystem::temp_directory_path() / "tutti-ckpt-XXXXXX").string();
    path = ::mkdtemp(pattern.data());
  }
  ~TempDir() { std::filesystem::remove_all(path); }
  std::string path;
};

// Integer-valued data, so that the sums of gradients over ranks are exact.
inline std::pair<torch::Tensor, torch::Tensor> batch(int index) {
  auto generator = ::at::detail::createCPUGenerator(500 + static_cast<std::uint64_t>(index));
  return {torch::randint(-2, 3, {4, 5}, generator).to(torch::kFloat32),
          torch::randint(-2, 3, {4, 3}, generator).to(torch::kFloat32)};
}

inline void train(tutti::libtorch::DistributedOptimizer& optimizer, Net& model, int rank, int first, int last) {
  for (int step = first; step < last; ++step) {
    optimizer.zero_grad();
    auto [x, y] = batch(step * 2 + rank);
    torch::mse_loss(model->forward(x), y).backward();
    optimizer.step();
  }
}

// Every parameter and every momentum buffer, as one flat tensor.
inline torch::Tensor state_of(Net& model, torch::optim::Optimizer& optimizer) {
  std::vector<torch::Tensor> parts;
  for (const auto& p : model->parameters()) {
    parts.push_back(p.detach().reshape({-1}));
    auto it = optimizer.state().find(tutti::libtorch::detail::state_key(p));
    if (it == optimizer.state().end()) continue;
    if (auto* sgd = dynamic_cast<torch::optim::SGDParamState*>(it->second.get()))
      parts.push_back(sgd->momentum_buffer().reshape({-1}));
    if (auto* adam = dynamic_cast<torch::optim::AdamParamState*>(it->second.get())) {
      parts.push_back(adam->exp_avg().reshape({-1}));
      parts.push_back(adam->exp_avg_sq().reshape({-1}));
      parts.push_back(torch::full({1}, static_cast<float>(adam->step())));
    }
  }
  return torch::cat(parts).clone();
}

// Writes a checkpoint of a 1-rank job after `steps` steps into dir/name; returns the state saved.
inline torch::Tensor write_one(const std::string& dir, const std::string& name, int steps = 2) {
  auto comms = local_group(1);
  torch::manual_seed(3);
  Net model;
  torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  tutti::libtorch::DistributedOptimizer optimizer(comms[0], sgd, model->named_parameters().pairs());
  train(optimizer, model, 0, 0, steps);
  optimizer.checkpoint(dir + "/" + name);
  return state_of(model, sgd);
}

}  // namespace tutti::testing
