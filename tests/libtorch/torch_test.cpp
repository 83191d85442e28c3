// The libtorch glue (<tutti/torch.hpp>), with ranks as threads: dtype_of, broadcast_parameters,
// broadcast_optimizer_state, and DistributedOptimizer against a single-process reference
// (overlap on and off, gradient accumulation, a parameter without a gradient, argument errors),
// and with every gradient compressor.
#include <gtest/gtest.h>

#include <torch/torch.h>

#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "harness.hpp"
#include "tutti/torch.hpp"

namespace tutti {
namespace {

using testing::run_ranks;
using NamedTensors = std::vector<std::pair<std::string, torch::Tensor>>;

// A small network with a buffer, so that broadcast_parameters has both kinds to move.
struct SmallNetImpl : torch::nn::Module {
  SmallNetImpl()
      : fc1(register_module("fc1", torch::nn::Linear(5, 4))), fc2(register_module("fc2", torch::nn::Linear(4, 3))) {
    counter = register_buffer("counter", torch::zeros({2}, torch::kInt64));
  }
  torch::Tensor forward(const torch::Tensor& x) { return fc2->forward(torch::tanh(fc1->forward(x))); }
  torch::nn::Linear fc1, fc2;
  torch::Tensor counter;
};
// TORCH_MODULE(SmallNet) by hand: the macro says `torch::`, which is tutti::libtorch in here.
class SmallNet : public torch::nn::ModuleHolder<SmallNetImpl> {
 public:
  using torch::nn::ModuleHolder<SmallNetImpl>::ModuleHolder;
};

// Models are built on the test's thread, one seed each: the global generator is not for threads.
std::vector<SmallNet> models_with_seeds(std::vector<std::uint64_t> seeds) {
  std::vector<SmallNet> models;
  for (auto seed : seeds) {
    torch::manual_seed(seed);
    models.emplace_back();
  }
  return models;
}

// Batch `index` of a fixed pseudo-random data set: (inputs [n, 5], targets [n, 3]).
std::pair<torch::Tensor, torch::Tensor> batch(int index, std::int64_t n) {
  auto generator = ::at::detail::createCPUGenerator(1000 + static_cast<std::uint64_t>(index));
  return {torch::randn({n, 5}, generator), torch::randn({n, 3}, generator)};
}

torch::Tensor loss_of(SmallNet& model, const std::pair<torch::Tensor, torch::Tensor>& data) {
  return torch::mse_loss(model->forward(data.first), data.second);
}

void expect_close(const torch::Tensor& got, const torch::Tensor& want, const std::string& what) {
  const double scale = std::max(1.0, want.abs().max().item<double>());
  const double error = (got - want).abs().max().item<double>();
  EXPECT_LE(error, 1e-6 * scale) << what;
}

void expect_same_parameters(SmallNet& a, SmallNet& b, bool exactly) {
  auto pa = a->named_parameters(), pb = b->named_parameters();
  for (const auto& item : pa) {
    if (exactly)
      EXPECT_TRUE(torch::equal(item.value(), pb[item.key()])) << item.key();
    else
      expect_close(item.value(), pb[item.key()], item.key());
  }
}

TEST(TorchGlue, DtypeOf) {
  EXPECT_EQ(tutti::libtorch::dtype_of(torch::zeros({1}, torch::kFloat32)), DataType::f32);
  EXPECT_EQ(tutti::libtorch::dtype_of(torch::zeros({1}, torch::kFloat64)), DataType::f64);
  EXPECT_EQ(tutti::libtorch::dtype_of(torch::zeros({1}, torch::kFloat16)), DataType::f16);
  EXPECT_EQ(tutti::libtorch::dtype_of(torch::zeros({1}, torch::kBFloat16)), DataType::bf16);
  EXPECT_EQ(tutti::libtorch::dtype_of(torch::zeros({1}, torch::kInt64)), DataType::i64);
  EXPECT_EQ(tutti::libtorch::dtype_of(torch::zeros({1}, torch::kUInt8)), DataType::u8);
  try {
    tutti::libtorch::dtype_of(torch::zeros({1}, torch::kBool));
    FAIL() << "no error for Bool";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::invalid_argument);
    EXPECT_NE(std::string(e.what()).find("Bool"), std::string::npos) << e.what();
  }
  EXPECT_THROW(tutti::libtorch::dtype_of(torch::zeros({1}, torch::kComplexFloat)), Error);
  EXPECT_THROW(tutti::libtorch::dtype_of(torch::Tensor()), Error);
}

TEST(TorchGlue, BroadcastParametersCopiesRootsParametersAndBuffers) {
  torch::set_num_threads(1);
  auto models = models_with_seeds({1, 2, 3});
  auto reference = models_with_seeds({2})[0];  // rank 1's model, as it is before the broadcast
  models[1]->counter.fill_(7);
  reference->counter.fill_(7);
  ASSERT_FALSE(torch::equal(models[0]->fc1->weight, models[1]->fc1->weight));
  const auto failures = run_ranks(3, [&](Communicator& comm) {
    tutti::libtorch::broadcast_parameters(comm, *models[static_cast<std::size_t>(comm.rank())], 1);
  });
  ASSERT_EQ(failures, "");
  for (auto& m : models) {
    expect_same_parameters(m, reference, true);
    EXPECT_TRUE(torch::equal(m->counter, reference->counter));
  }
}

TEST(TorchGlue, BroadcastParametersRefusesDifferentShapesOnEveryRank) {
  torch::manual_seed(0);
  std::vector<torch::nn::Linear> models{torch::nn::Linear(5, 4), torch::nn::Linear(5, 3)};
  std::mutex mutex;
  int errors = 0;
  const auto failures = run_ranks(2, [&](Communicator& comm) {
    try {
      tutti::libtorch::broadcast_parameters(comm, *models[static_cast<std::size_t>(comm.rank())], 0);
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::invalid_argument);
      std::lock_guard lock(mutex);
      ++errors;
    }
  });
  EXPECT_EQ(failures, "");
  EXPECT_EQ(errors, 2);  // every rank throws; none waits in a broadcast the other never makes
}

// One step on p ranks, each with its own batch (and `passes` accumulated backward passes), must
// equal one step of a single process on all the batches together.
void check_against_reference(bool overlap, int passes) {
  torch::set_num_threads(1);
  constexpr int p = 2;
  constexpr std::int64_t per_rank = 4;
  constexpr double lr = 0.1;
  auto models = models_with_seeds({11, 12});
  const std::uint64_t seed = 11;  // rank 0's model is the initial state after the broadcast
  torch::manual_seed(seed);
  SmallNet reference;
  const auto failures = run_ranks(p, [&](Communicator& comm) {
    auto& model = models[static_cast<std::size_t>(comm.rank())];
    tutti::libtorch::broadcast_parameters(comm, *model, 0);
    torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(lr).momentum(0.9));
    tutti::libtorch::DistributedOptions options;
    options.overlap = overlap;
    options.backward_passes_per_step = passes;
    tutti::libtorch::DistributedOptimizer optimizer(comm, sgd, model->named_parameters().pairs(), std::move(options));
    for (int pass = 0; pass < passes; ++pass) {
      optimizer.zero_grad();
      (loss_of(model, batch(comm.rank() * passes + pass, per_rank)) / passes).backward();
      optimizer.step();
    }
    EXPECT_EQ(optimizer.overlap_stats().steps, 1u);
    EXPECT_GT(optimizer.overlap_stats().bytes, 0u);
  });
  ASSERT_EQ(failures, "");

  torch::optim::SGD sgd(reference->parameters(), torch::optim::SGDOptions(lr).momentum(0.9));
  std::vector<torch::Tensor> inputs, targets;
  for (int b = 0; b < p * passes; ++b) {
    auto [x, y] = batch(b, per_rank);
    inputs.push_back(x);
    targets.push_back(y);
  }
  sgd.zero_grad();
  loss_of(reference, {torch::cat(inputs), torch::cat(targets)}).backward();
  sgd.step();

  expect_same_parameters(models[0], models[1], true);  // bit-identical across ranks
  expect_same_parameters(models[0], reference, false);
}

TEST(TorchGlue, DistributedOptimizerMatchesSingleProcessWithOverlap) { check_against_reference(true, 1); }
TEST(TorchGlue, DistributedOptimizerMatchesSingleProcessWithoutOverlap) { check_against_reference(false, 1); }
TEST(TorchGlue, DistributedOptimizerAccumulatesBackwardPasses) { check_against_reference(true, 2); }

TEST(TorchGlue, ParameterWithoutGradientOnOneRankIsReducedAsZeros) {
  torch::set_num_threads(1);
  auto models = models_with_seeds({5, 5});
  const auto failures = run_ranks(2, [&](Communicator& comm) {
    auto& model = models[static_cast<std::size_t>(comm.rank())];
    torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(0.1));
    tutti::libtorch::DistributedOptimizer optimizer(comm, sgd, model->named_parameters().pairs());
    for (int step = 0; step < 3; ++step) {
      optimizer.zero_grad();
      auto [x, y] = batch(step * 2 + comm.rank(), 4);
      // Rank 1 leaves fc2 out of its graph: its hooks never fire there.
      auto out = comm.rank() == 0 ? model->forward(x) : torch::tanh(model->fc1->forward(x)).narrow(1, 0, 3);
      torch::mse_loss(out, y).backward();
      optimizer.step();
    }
  });
  ASSERT_EQ(failures, "");
  expect_same_parameters(models[0], models[1], true);
}

TEST(TorchGlue, DistributedOptimizerRefusesBadArguments) {
  auto comms = local_group(1);
  torch::manual_seed(0);
  SmallNet model;
  torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(0.1));
  NamedTensors duplicate = model->named_parameters().pairs();
  duplicate[1].first = duplicate[0].first;
  try {
    tutti::libtorch::DistributedOptimizer optimizer(comms[0], sgd, duplicate);
    FAIL() << "no error for a duplicate name";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::invalid_argument);
    EXPECT_NE(std::string(e.what()).find("duplicate parameter name fc1.weight"), std::string::npos) << e.what();
  }
  NamedTensors missing = model->named_parameters().pairs();
  missing.pop_back();
  EXPECT_THROW(tutti::libtorch::DistributedOptimizer(comms[0], sgd, missing), Error);
  tutti::libtorch::DistributedOptions options;
  options.backward_passes_per_step = 0;
  EXPECT_THROW(tutti::libtorch::DistributedOptimizer(comms[0], sgd, model->named_parameters().pairs(), options), Error);
}

// Three steps on 2 ranks with each compressor: parameters stay bit-identical across ranks, they
// moved, and with fp16/bf16 (every element sent, rounded) they stay close to the uncompressed run.
TEST(TorchGlue, DistributedOptimizerWithEveryCompressor) {
  torch::set_num_threads(1);
  auto train = [](const std::string& compression) {
    auto models = models_with_seeds({21, 22});
    const auto failures = run_ranks(2, [&](Communicator& comm) {
      auto& model = models[static_cast<std::size_t>(comm.rank())];
      tutti::libtorch::broadcast_parameters(comm, *model, 0);
      torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
      tutti::libtorch::DistributedOptions options;
      options.compression = compress::Compression::parse(compression);
      options.compression_seed = 3;
      tutti::libtorch::DistributedOptimizer optimizer(comm, sgd, model->named_parameters().pairs(), std::move(options));
      for (int step = 0; step < 3; ++step) {
        optimizer.zero_grad();
        loss_of(model, batch(step * 2 + comm.rank(), 4)).backward();
        optimizer.step();
      }
      EXPECT_EQ(optimizer.overlap_stats().steps, 3u);
      EXPECT_GT(optimizer.overlap_stats().bytes, 0u);
    });
    EXPECT_EQ(failures, "") << compression;
    return models;
  };
  auto exact = train("none");
  auto initial = models_with_seeds({21});
  for (const char* c : {"fp16", "bf16", "qsgd:8", "qsgd:4", "powersgd:1", "topk:0.3"}) {
    auto models = train(c);
    expect_same_parameters(models[0], models[1], true);
    EXPECT_FALSE(torch::equal(models[0]->fc1->weight, initial[0]->fc1->weight)) << c;
    if (std::string(c) == "fp16" || std::string(c) == "bf16")
      for (const auto& item : models[0]->named_parameters()) {
        const double error = (item.value() - exact[0]->named_parameters()[item.key()]).abs().max().item<double>();
        EXPECT_LE(error, 1e-2) << c << " " << item.key();
      }
  }
}

// top-k chooses among all the elements of a fused bucket (the k largest of both tensors here),
// and among each tensor's alone with fusion off: the parameters that moved say which.
TEST(TorchGlue, TopKChoosesAcrossTheBucket) {
  auto moved = [](std::size_t fusion_threshold) {
    std::vector<torch::Tensor> moved(2);
    const auto failures = run_ranks(2, [&](Communicator& comm) {
      auto a = torch::zeros({4}).requires_grad_(true), b = torch::zeros({4}).requires_grad_(true);
      torch::optim::SGD sgd(std::vector<torch::Tensor>{a, b}, torch::optim::SGDOptions(1.0));
      tutti::libtorch::DistributedOptions options;
      options.compression = compress::Compression::parse("topk:0.25");  // k = 2 of a bucket of 8, 1 of 4
      options.engine.fusion_threshold = fusion_threshold;
      tutti::libtorch::DistributedOptimizer optimizer(comm, sgd, {{"a", a}, {"b", b}}, std::move(options));
      optimizer.zero_grad();
      ((a * torch::tensor({10.f, 9.f, 8.f, 7.f})).sum() + (b * torch::tensor({1.f, 2.f, 3.f, 4.f})).sum()).backward();
      optimizer.step();
      if (comm.rank() == 0) moved = {a.detach().clone(), b.detach().clone()};
    });
    EXPECT_EQ(failures, "");
    return moved;
  };
  const auto bucket = moved(std::size_t{64} << 20);
  EXPECT_TRUE(torch::equal(bucket[0], torch::tensor({-10.f, -9.f, 0.f, 0.f}))) << bucket[0];
  EXPECT_TRUE(torch::equal(bucket[1], torch::zeros({4}))) << bucket[1];
  const auto per_tensor = moved(0);
  EXPECT_TRUE(torch::equal(per_tensor[0], torch::tensor({-10.f, 0.f, 0.f, 0.f}))) << per_tensor[0];
  EXPECT_TRUE(torch::equal(per_tensor[1], torch::tensor({0.f, 0.f, 0.f, -4.f}))) << per_tensor[1];
}

TEST(TorchGlue, DistributedOptimizerCompressesF32Only) {
  auto comms = local_group(1);
  torch::manual_seed(0);
  SmallNet model;
  model->to(torch::kFloat64);
  torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(0.1));
  tutti::libtorch::DistributedOptions options;
  options.compression = compress::Compression::parse("fp16");
  try {
    tutti::libtorch::DistributedOptimizer optimizer(comms[0], sgd, model->named_parameters().pairs(), options);
    FAIL() << "no error for f64 parameters with fp16 compression";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::invalid_argument);
    EXPECT_NE(std::string(e.what()).find("takes f32 gradients only"), std::string::npos) << e.what();
  }
}

TEST(TorchGlue, BroadcastOptimizerStateSgd) {
  torch::set_num_threads(1);
  auto models = models_with_seeds({3, 3});
  std::vector<std::unique_ptr<torch::optim::SGD>> optimizers;
  for (std::size_t r = 0; r < 2; ++r)
    optimizers.push_back(std::make_unique<torch::optim::SGD>(
        models[r]->parameters(), torch::optim::SGDOptions(r == 0 ? 0.25 : 0.5).momentum(0.9)));
  // Root has momentum buffers (one step taken), rank 1 none.
  loss_of(models[0], batch(0, 4)).backward();
  optimizers[0]->step();
  const auto failures = run_ranks(2, [&](Communicator& comm) {
    tutti::libtorch::broadcast_optimizer_state(comm, *optimizers[static_cast<std::size_t>(comm.rank())], 0);
  });
  ASSERT_EQ(failures, "");
  EXPECT_EQ(optimizers[1]->param_groups()[0].options().get_lr(), 0.25);
  const auto p0 = models[0]->parameters(), p1 = models[1]->parameters();
  for (std::size_t i = 0; i < p0.size(); ++i) {
    const auto key0 = c10::guts::to_string(p0[i].unsafeGetTensorImpl());
    const auto key1 = c10::guts::to_string(p1[i].unsafeGetTensorImpl());
    ASSERT_TRUE(optimizers[1]->state().count(key1)) << i;
    const auto& s0 = static_cast<torch::optim::SGDParamState&>(*optimizers[0]->state().at(key0));
    const auto& s1 = static_cast<torch::optim::SGDParamState&>(*optimizers[1]->state().at(key1));
    EXPECT_TRUE(torch::equal(s0.momentum_buffer(), s1.momentum_buffer())) << i;
  }
}

TEST(TorchGlue, BroadcastOptimizerStateAdam) {
  torch::set_num_threads(1);
  auto models = models_with_seeds({4, 4});
  std::vector<std::unique_ptr<torch::optim::Adam>> optimizers;
  for (std::size_t r = 0; r < 2; ++r)
    optimizers.push_back(std::make_unique<torch::optim::Adam>(
        models[r]->parameters(), torch::optim::AdamOptions(r == 0 ? 1e-3 : 1e-2).amsgrad(r == 0)));
  for (int step = 0; step < 2; ++step) {
    optimizers[0]->zero_grad();
    loss_of(models[0], batch(step, 4)).backward();
    optimizers[0]->step();
  }
  const auto failures = run_ranks(2, [&](Communicator& comm) {
    const auto r = static_cast<std::size_t>(comm.rank());
    tutti::libtorch::broadcast_parameters(comm, *models[r], 0);
    tutti::libtorch::broadcast_optimizer_state(comm, *optimizers[r], 0);
  });
  ASSERT_EQ(failures, "");
  const auto& options1 = static_cast<torch::optim::AdamOptions&>(optimizers[1]->param_groups()[0].options());
  EXPECT_EQ(options1.lr(), 1e-3);
  EXPECT_TRUE(options1.amsgrad());
  const auto p0 = models[0]->parameters(), p1 = models[1]->parameters();
  for (std::size_t i = 0; i < p0.size(); ++i) {
    const auto& s0 = static_cast<torch::optim::AdamParamState&>(
        *optimizers[0]->state().at(c10::guts::to_string(p0[i].unsafeGetTensorImpl())));
    const auto& s1 = static_cast<torch::optim::AdamParamState&>(
        *optimizers[1]->state().at(c10::guts::to_string(p1[i].unsafeGetTensorImpl())));
    EXPECT_EQ(s1.step(), 2);
    EXPECT_TRUE(torch::equal(s0.exp_avg(), s1.exp_avg())) << i;
    EXPECT_TRUE(torch::equal(s0.exp_avg_sq(), s1.exp_avg_sq())) << i;
    ASSERT_TRUE(s1.max_exp_avg_sq().defined()) << i;
    EXPECT_TRUE(torch::equal(s0.max_exp_avg_sq(), s1.max_exp_avg_sq())) << i;
  }
  // Both continue identically from here.
  for (std::size_t r = 0; r < 2; ++r) {
    optimizers[r]->zero_grad();
    loss_of(models[r], batch(9, 4)).backward();
    optimizers[r]->step();
  }
  expect_same_parameters(models[0], models[1], true);
}

TEST(TorchGlue, BroadcastOptimizerStateRefusesOtherOptimizersWithState) {
  auto models = models_with_seeds({6, 6});
  std::vector<std::unique_ptr<torch::optim::Adagrad>> optimizers;  // Adagrad has state from the start
  for (auto& m : models) optimizers.push_back(std::make_unique<torch::optim::Adagrad>(m->parameters()));
  std::mutex mutex;
  std::vector<std::string> messages;
  const auto failures = run_ranks(2, [&](Communicator& comm) {
    try {
      tutti::libtorch::broadcast_optimizer_state(comm, *optimizers[static_cast<std::size_t>(comm.rank())], 0);
    } catch (const Error& e) {
      std::lock_guard lock(mutex);
      messages.emplace_back(e.what());
    }
  });
  ASSERT_EQ(failures, "");
  ASSERT_EQ(messages.size(), 2u);
  for (const auto& m : messages) EXPECT_NE(m.find("Adagrad"), std::string::npos) << m;
}

}  // namespace
}  // namespace tutti
