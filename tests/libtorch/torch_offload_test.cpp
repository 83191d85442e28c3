// The out-of-core layers and SGD (tutti/torch_offload.hpp) against plain libtorch on the same
// weights: gradients and parameters after several steps are compared element by element, under a
// budget small enough that activations and momentum are swapped out and back.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>
#include <vector>

#include "out_of_core.hpp"
#include "tutti/torch.hpp"

namespace {

using tutti::offload::Pool;

// The shape of tutti-train's network, narrower: conv 1->4, conv 4->8, fc 392->32, fc 32->10.
struct SmallNet : torch::nn::Module {
  SmallNet()
      : conv1(register_module("conv1", torch::nn::Conv2d(torch::nn::Conv2dOptions(1, 4, 3).padding(1)))),
        conv2(register_module("conv2", torch::nn::Conv2d(torch::nn::Conv2dOptions(4, 8, 3).padding(1)))),
        fc1(register_module("fc1", torch::nn::Linear(8 * 7 * 7, 32))),
        fc2(register_module("fc2", torch::nn::Linear(32, 10))) {}

  torch::Tensor forward(const torch::Tensor& x) {
    auto y = torch::max_pool2d(torch::relu(conv1->forward(x)), 2);
    y = torch::max_pool2d(torch::relu(conv2->forward(y)), 2).flatten(1);
    return fc2->forward(torch::relu(fc1->forward(y)));
  }

  torch::Tensor forward(tutti::libtorch::ActivationStore& store, const torch::Tensor& x) {
    auto y = tutti::libtorch::conv2d_relu_maxpool2d(store, x, conv1->weight, conv1->bias, 1, 2);
    y = tutti::libtorch::conv2d_relu_maxpool2d(store, y, conv2->weight, conv2->bias, 1, 2).flatten(1);
    y = tutti::libtorch::linear(store, y, fc1->weight, fc1->bias, true);
    return tutti::libtorch::linear(store, y, fc2->weight, fc2->bias, false);
  }

  torch::nn::Conv2d conv1;
  torch::nn::Conv2d conv2;
  torch::nn::Linear fc1;
  torch::nn::Linear fc2;
};

// Two networks with the same weights.
void copy_weights(SmallNet& from, SmallNet& to) {
  torch::NoGradGuard no_grad;
  auto src = from.parameters();
  auto dst = to.parameters();
  for (std::size_t i = 0; i < src.size(); ++i) dst[i].copy_(src[i]);
}

struct Batch {
  torch::Tensor images, labels;
};

Batch batch(int step) {
  torch::manual_seed(1000 + step);
  return {torch::randn({8, 1, 28, 28}), torch::randint(0, 10, {8}, torch::kInt64)};
}

tutti::offload::Options emulated(bool swap = true) {
  tutti::offload::Options options;
  options.swap = swap;
  options.device = tutti::gpu::DeviceKind::emulated;
  return options;
}

// Device bytes the parameters and their gradients take, whole 256-byte blocks.
std::size_t parameter_bytes(SmallNet& net) {
  std::size_t bytes = 0;
  for (const auto& p : net.parameters()) bytes += 2 * Pool::charge(p.nbytes());
  return bytes;
}

// Every element of each tensor equal, bit for bit; names the first that differs.
void expect_identical(const std::vector<torch::Tensor>& got, const std::vector<torch::Tensor>& want,
                      const std::string& what) {
  ASSERT_EQ(got.size(), want.size());
  for (std::size_t i = 0; i < got.size(); ++i) {
    ASSERT_TRUE(got[i].defined()) << what << " " << i;
    ASSERT_EQ(got[i].sizes(), want[i].sizes()) << what << " " << i;
    const auto differ = got[i].ne(want[i]).sum().item<std::int64_t>();
    EXPECT_EQ(differ, 0) << what << " " << i << ": " << differ << " elements differ, max |diff| "
                         << (got[i] - want[i]).abs().max().item<float>();
  }
}

std::vector<torch::Tensor> grads_of(torch::nn::Module& net) {
  std::vector<torch::Tensor> grads;
  for (const auto& p : net.parameters()) grads.push_back(p.grad().clone());
  return grads;
}

std::vector<torch::Tensor> values_of(torch::nn::Module& net) {
  std::vector<torch::Tensor> values;
  for (const auto& p : net.parameters()) values.push_back(p.detach().clone());
  return values;
}

TEST(TorchOffload, GradientsEqualLibtorchsUnderATightBudget) {
  torch::manual_seed(7);
  SmallNet net, reference;
  copy_weights(net, reference);
  const Batch b = batch(0);
  // Room for the parameters, their gradients, and the largest layer's saved tensors (80 KiB, held at once in
  // its backward), about two thirds of all the saved activations (148 KiB).
  Pool pool(parameter_bytes(net) + 96 * 1024, emulated());
  tutti::libtorch::PooledParameters placed(pool, net.parameters());
  tutti::libtorch::ActivationStore store(pool);

  const auto loss = torch::nn::functional::cross_entropy(net.forward(store, b.images), b.labels);
  EXPECT_EQ(store.groups(), 4U);
  loss.backward();
  EXPECT_EQ(store.groups(), 0U);  // backward freed every group
  const auto want_loss = torch::nn::functional::cross_entropy(reference.forward(b.images), b.labels);
  reference.zero_grad();
  want_loss.backward();

  EXPECT_EQ(loss.item<float>(), want_loss.item<float>());
  expect_identical(grads_of(net), grads_of(reference), "gradient");
  const auto c = pool.counters();
  EXPECT_LE(c.peak_bytes, pool.budget());
  EXPECT_GT(c.swap_outs, 0U);
  EXPECT_GT(c.swap_ins, 0U);
  EXPECT_GT(c.prefetch_hits, 0U);  // a backward found its blocks prefetched by the layer after it
  // The gradients were accumulated into the pool's blocks, not into memory of libtorch's own.
  EXPECT_EQ(c.in_use_bytes, placed.bytes());
}

TEST(TorchOffload, SgdStepsEqualLibtorchsAndMomentumIsSwapped) {
  torch::manual_seed(11);
  SmallNet net, reference;
  copy_weights(net, reference);
  Pool pool(parameter_bytes(net) + 96 * 1024, emulated());
  tutti::libtorch::PooledParameters placed(pool, net.parameters());
  tutti::libtorch::ActivationStore store(pool);
  const auto options = torch::optim::SGDOptions(0.05).momentum(0.9).weight_decay(1e-4);
  tutti::libtorch::OffloadedSGD sgd(pool, net.parameters(), options);
  torch::optim::SGD reference_sgd(reference.parameters(), options);

  for (int step = 0; step < 5; ++step) {
    const Batch b = batch(step);
    store.clear();
    sgd.zero_grad();
    const auto loss = torch::nn::functional::cross_entropy(net.forward(store, b.images), b.labels);
    loss.backward();
    sgd.step();
    reference_sgd.zero_grad();
    const auto want = torch::nn::functional::cross_entropy(reference.forward(b.images), b.labels);
    want.backward();
    reference_sgd.step();
    EXPECT_EQ(loss.item<float>(), want.item<float>()) << "step " << step;
    expect_identical(values_of(net), values_of(reference), "parameter after step " + std::to_string(step));
  }
  EXPECT_EQ(sgd.buffers(), net.parameters().size());
  const auto c = pool.counters();
  EXPECT_LE(c.peak_bytes, pool.budget());
  // Each step swaps every momentum buffer out, and the next brings back those the forward evicted.
  EXPECT_GE(c.swap_outs, 4 * net.parameters().size());
  EXPECT_GT(c.swap_ins, 0U);
}

TEST(TorchOffload, WithRoomForEverythingNothingIsCopied) {
  torch::manual_seed(17);
  SmallNet net;
  Pool pool(4 << 20, emulated());
  tutti::libtorch::PooledParameters placed(pool, net.parameters());
  tutti::libtorch::ActivationStore store(pool);
  tutti::libtorch::OffloadedSGD sgd(pool, net.parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
  for (int step = 0; step < 3; ++step) {
    const Batch b = batch(step);
    store.clear();
    sgd.zero_grad();
    torch::nn::functional::cross_entropy(net.forward(store, b.images), b.labels).backward();
    sgd.step();
  }
  const auto c = pool.counters();
  EXPECT_EQ(c.swap_outs, 0U);
  EXPECT_EQ(c.swap_ins, 0U);
  EXPECT_EQ(c.host_bytes, 0U);
  EXPECT_EQ(sgd.buffers(), net.parameters().size());
}

TEST(TorchOffload, WithoutSwappingForwardFailsWhereTheBudgetEnds) {
  torch::manual_seed(3);
  SmallNet net;
  Pool pool(parameter_bytes(net) + 48 * 1024, emulated(false));
  tutti::libtorch::PooledParameters placed(pool, net.parameters());
  tutti::libtorch::ActivationStore store(pool);
  const Batch b = batch(0);
  // The first layer's saved input (25 KiB) and indices (49 KiB) already exceed 48 KiB.
  try {
    net.forward(store, b.images);
    ADD_FAILURE() << "forward fit in a budget too small for its first layer";
  } catch (const tutti::Error& e) {
    EXPECT_EQ(e.code(), tutti::ErrorCode::system);
    EXPECT_NE(std::string(e.what()).find("out of device memory"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("swapping is off"), std::string::npos) << e.what();
  }
  EXPECT_EQ(store.groups(), 0U);  // the failed layer saved nothing
  EXPECT_EQ(pool.counters().in_use_bytes, placed.bytes());
  // With room for everything, the same pool trains without swapping.
  Pool roomy(parameter_bytes(net) + 512 * 1024, emulated(false));
  tutti::libtorch::ActivationStore roomy_store(roomy);
  torch::nn::functional::cross_entropy(net.forward(roomy_store, b.images), b.labels).backward();
  EXPECT_EQ(roomy.counters().swap_outs, 0U);
}

TEST(TorchOffload, ParametersGetTheirOwnMemoryBackWithTheirValues) {
  torch::manual_seed(5);
  SmallNet net;
  const auto before = values_of(net);
  {
    Pool pool(1 << 20, emulated());
    tutti::libtorch::PooledParameters placed(pool, net.parameters());
    torch::NoGradGuard no_grad;
    for (auto& p : net.parameters()) p.add_(1);
  }
  std::vector<torch::Tensor> want;
  for (const auto& t : before) want.push_back(t + 1);
  expect_identical(values_of(net), want, "parameter after the pool is gone");
  for (const auto& p : net.parameters()) EXPECT_TRUE(p.grad().defined());
}

}  // namespace

namespace {

// tutti-train's OutOfCore (tools/train/out_of_core.hpp) over its own Net: the loss, gradients
// and SGD steps of the network's own forward, under a budget that swaps.
TEST(TorchOffload, TrainOutOfCoreFollowsTheNetsOwnTraining) {
  torch::manual_seed(13);
  tutti::train::Net net(1), reference(1);
  {
    torch::NoGradGuard no_grad;
    auto src = net->parameters();
    auto dst = reference->parameters();
    for (std::size_t i = 0; i < src.size(); ++i) dst[i].copy_(src[i]);
  }
  std::size_t parameters = 0;
  for (const auto& p : net->parameters()) parameters += 2 * Pool::charge(p.nbytes());
  ::setenv("TUTTI_DEVICE", "emulated", 1);
  // Beyond the parameters and gradients: room for fc1's momentum (784 KiB) or conv1's saved
  // tensors (490 KiB), less than the 1 MiB of activations a step saves.
  constexpr std::size_t room = 896 * 1024;
  tutti::train::OutOfCore ooc(*net, parameters + room, true);
  ::unsetenv("TUTTI_DEVICE");
  EXPECT_EQ(ooc.parameter_bytes(), parameters);
  std::vector<void*> placed;  // where the parameters and gradients live: pool blocks
  for (const auto& p : net->parameters()) {
    placed.push_back(p.data_ptr());
    placed.push_back(p.grad().data_ptr());
  }
  const auto options = torch::optim::SGDOptions(0.05).momentum(0.9);
  auto sgd = ooc.make_sgd(options);
  torch::optim::SGD reference_sgd(reference->parameters(), options);
  for (int step = 0; step < 3; ++step) {
    torch::manual_seed(2000 + step);
    const auto images = torch::randn({16, 1, 28, 28});
    const auto labels = torch::randint(0, 10, {16}, torch::kInt64);
    sgd->zero_grad();
    const auto loss = ooc.forward(images, labels);
    loss.backward();
    sgd->step();
    reference_sgd.zero_grad();
    const auto want = tutti::train::loss_of(reference->forward(images), labels);
    want.backward();
    reference_sgd.step();
    EXPECT_EQ(loss.item<float>(), want.item<float>()) << "step " << step;
    expect_identical(values_of(*net), values_of(*reference), "parameter after step " + std::to_string(step));
  }
  // zero_grad zeroed and backward accumulated in place: nothing moved out of the pool.
  std::vector<void*> now;
  for (const auto& p : net->parameters()) {
    now.push_back(p.data_ptr());
    now.push_back(p.grad().data_ptr());
  }
  EXPECT_EQ(now, placed);
  const auto c = ooc.counters();
  EXPECT_LE(c.peak_bytes, parameters + room);
  EXPECT_GT(c.swapped_out_bytes, 0U);
  EXPECT_GT(c.swapped_in_bytes, 0U);
  // Evaluation (grad mode off) is the net's own forward: nothing is saved or swapped.
  torch::NoGradGuard no_grad;
  const auto before = ooc.counters().swap_ins;
  const auto images = torch::randn({4, 1, 28, 28});
  const auto labels = torch::randint(0, 10, {4}, torch::kInt64);
  EXPECT_EQ(ooc.forward(images, labels).item<float>(),
            tutti::train::loss_of(reference->forward(images), labels).item<float>());
  EXPECT_EQ(ooc.counters().swap_ins, before);
}

}  // namespace
