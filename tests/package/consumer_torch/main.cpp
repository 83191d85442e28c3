// Builds against an installed Tutti::torch (find_package(Tutti COMPONENTS torch)) and trains one
// step of a linear layer over 2 ranks on threads: rank 0's weights are broadcast, each rank's
// gradient is its own, and DistributedOptimizer averages them. Checks the weights exactly.
#include <cstdio>
#include <thread>
#include <vector>

#include <torch/torch.h>

#include <tutti/torch.hpp>

int main() {
  auto comms = tutti::local_group(2);
  std::vector<torch::Tensor> weights(2);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r)
    threads.emplace_back([&, r] {
      torch::NoGradGuard init;
      torch::nn::Linear layer(torch::nn::LinearOptions(2, 1).bias(false));
      layer->weight.fill_(r == 0 ? 1.0f : 5.0f);  // rank 0's 1s win
      tutti::libtorch::broadcast_parameters(comms[r], *layer, 0);
      torch::optim::SGD sgd(layer->parameters(), torch::optim::SGDOptions(0.5));
      tutti::libtorch::DistributedOptimizer opt(comms[r], sgd, layer->named_parameters().pairs());
      torch::AutoGradMode grad(true);
      opt.zero_grad();
      // d(sum(w·x))/dw = x: rank 0's x = (1, 2), rank 1's (3, 4); the average (2, 3).
      layer->forward(torch::tensor({{1.0f + 2 * r, 2.0f + 2 * r}})).sum().backward();
      opt.step();
      weights[r] = layer->weight.detach().clone();
    });
  for (auto& t : threads) t.join();
  const auto expected = torch::tensor({{1.0f - 0.5f * 2, 1.0f - 0.5f * 3}});  // w - lr · average
  for (int r = 0; r < 2; ++r)
    if (!torch::equal(weights[r], expected)) {
      std::printf("torch_consumer: rank %d's weights are wrong\n", r);
      return 1;
    }
  std::printf("torch_consumer: Tutti::torch, one averaged SGD step over 2 threads: weights (0, -0.5)\n");
  return 0;
}
