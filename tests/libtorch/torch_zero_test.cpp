// ShardedOptimizer (ZeRO stages 1 and 2, <tutti/torch_zero.hpp>) with ranks as threads: several
// steps at p = 1 to 4 against torch::optim::SGD on the full batch in one process, parameters
// bitwise identical across ranks after every step, the memory accounting, and bad arguments
// raised on every rank.
#include <gtest/gtest.h>

#include <torch/torch.h>

#include <cstring>
#include <functional>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "harness.hpp"
#include "tutti/torch_zero.hpp"

namespace tutti {
namespace {

using testing::run_ranks;
using NamedTensors = std::vector<std::pair<std::string, torch::Tensor>>;

// 5*4 + 4 + 4*2 + 2 = 34 parameters: no padding at p = 1 and 2, two padding elements at p = 3
// (shards of 12) and p = 4 (shards of 9); every p > 1 cuts fc1.weight between two ranks.
struct NetImpl : torch::nn::Module {
  NetImpl()
      : fc1(register_module("fc1", torch::nn::Linear(5, 4))), fc2(register_module("fc2", torch::nn::Linear(4, 2))) {}
  torch::Tensor forward(const torch::Tensor& x) { return fc2->forward(torch::tanh(fc1->forward(x))); }
  torch::nn::Linear fc1, fc2;
};
// TORCH_MODULE(Net) by hand: the macro says `torch::`, which is tutti::libtorch in here.
class Net : public torch::nn::ModuleHolder<NetImpl> {
 public:
  using torch::nn::ModuleHolder<NetImpl>::ModuleHolder;
};

constexpr std::int64_t parameters_in_net = 34;
constexpr std::int64_t batch_size = 24;  // divisible by 1, 2, 3 and 4: equal shares per rank
constexpr int steps = 4;

// Models are built on the test's thread, all from one seed: the global generator is not for threads.
std::vector<Net> identical_models(int count) {
  std::vector<Net> models;
  for (int i = 0; i < count; ++i) {
    torch::manual_seed(7);
    models.emplace_back();
  }
  return models;
}

// The batch of step `step`: (inputs [24, 5], targets [24, 2]).
std::pair<torch::Tensor, torch::Tensor> batch(int step) {
  auto generator = ::at::detail::createCPUGenerator(500 + static_cast<std::uint64_t>(step));
  return {torch::randn({batch_size, 5}, generator), torch::randn({batch_size, 2}, generator)};
}

torch::Tensor flat_parameters(Net& model) {
  std::vector<torch::Tensor> flat;
  for (const auto& p : model->parameters()) flat.push_back(p.detach().reshape({-1}).clone());
  return torch::cat(flat);
}

bool same_bytes(const torch::Tensor& a, const torch::Tensor& b) {
  return a.nbytes() == b.nbytes() && std::memcmp(a.data_ptr(), b.data_ptr(), a.nbytes()) == 0;
}

// The parameters after each step of torch's SGD on the whole batch, in one process.
std::vector<torch::Tensor> reference_run(const tutti::libtorch::ShardedOptions& o) {
  Net model = identical_models(1)[0];
  torch::optim::SGD sgd(model->parameters(),
                        torch::optim::SGDOptions(o.lr).momentum(o.momentum).weight_decay(o.weight_decay));
  std::vector<torch::Tensor> after;
  for (int step = 0; step < steps; ++step) {
    sgd.zero_grad();
    auto [x, y] = batch(step);
    torch::mse_loss(model->forward(x), y).backward();
    sgd.step();
    after.push_back(flat_parameters(model));
  }
  return after;
}

// `steps` steps on p ranks, each on its 1/p of every batch: after every step, every rank's
// parameters must be bitwise rank 0's, and close to the reference. Not exactly the reference: the
// mean of per-rank mean gradients adds the same terms in another order than torch's mean over the
// whole batch (and divides twice), so gradients differ in their last bits, and the updates carry
// that on; 1e-6 relative is a few hundred times the rounding of f32 at these magnitudes.
// With overlap, buckets of 4 elements (16 bytes), so that every shard has several.
void check_against_sgd(int stage, int p, double weight_decay, bool overlap = false) {
  torch::set_num_threads(1);
  const tutti::libtorch::ShardedOptions options{
      .stage = stage, .lr = 0.1, .momentum = 0.9, .weight_decay = weight_decay, .overlap = overlap, .bucket_bytes = 16};
  const auto reference = reference_run(options);
  auto models = identical_models(p);
  const auto initial = flat_parameters(models[0]);
  std::vector<std::vector<torch::Tensor>> after(static_cast<std::size_t>(p));  // [rank][step]
  const std::int64_t share = batch_size / p;
  const auto shard = (parameters_in_net + p - 1) / p;
  const auto failures = run_ranks(p, [&](Communicator& comm) {
    auto& model = models[static_cast<std::size_t>(comm.rank())];
    tutti::libtorch::ShardedOptimizer optimizer(comm, model->named_parameters().pairs(), options);
    EXPECT_EQ(optimizer.parameter_count(), static_cast<std::size_t>(parameters_in_net));
    EXPECT_EQ(optimizer.shard_size(), static_cast<std::size_t>(shard));
    EXPECT_EQ(optimizer.optimizer_state_bytes(), static_cast<std::size_t>(shard) * 4);
    if (p > 1) {
      EXPECT_LT(optimizer.optimizer_state_bytes(), static_cast<std::size_t>(parameters_in_net) * 4);
    }
    const auto gradient_bytes = static_cast<std::size_t>(stage == 1 ? shard * p : shard) * 4;
    EXPECT_EQ(optimizer.gradient_bytes_held(), gradient_bytes);
    for (int step = 0; step < steps; ++step) {
      optimizer.zero_grad();
      auto [x, y] = batch(step);
      torch::mse_loss(model->forward(x.narrow(0, comm.rank() * share, share)), y.narrow(0, comm.rank() * share, share))
          .backward();
      optimizer.step();
      after[static_cast<std::size_t>(comm.rank())].push_back(flat_parameters(model));
      if (stage == 2) {  // only this rank's averaged shard is kept
        for (const auto& param : model->parameters()) EXPECT_FALSE(param.grad().defined());
      }
    }
    EXPECT_EQ(optimizer.steps(), static_cast<std::uint64_t>(steps));
    // Every parameter has a gradient: after backward's last hook, every bucket has started.
    const auto buckets = overlap ? static_cast<std::uint64_t>(p * ((shard + 3) / 4)) : 0;
    EXPECT_EQ(optimizer.overlapped_buckets(), buckets * steps);
    EXPECT_EQ(optimizer.optimizer_state_bytes(), static_cast<std::size_t>(shard) * 4);
    EXPECT_EQ(optimizer.gradient_bytes_held(), gradient_bytes);
  });
  ASSERT_EQ(failures, "");
  ASSERT_FALSE(torch::equal(reference[0], initial));  // the reference moved: a no-op cannot pass
  for (int r = 0; r < p; ++r) {
    ASSERT_EQ(after[static_cast<std::size_t>(r)].size(), static_cast<std::size_t>(steps));
    for (int step = 0; step < steps; ++step) {
      const auto& got = after[static_cast<std::size_t>(r)][static_cast<std::size_t>(step)];
      const auto& want = reference[static_cast<std::size_t>(step)];
      EXPECT_TRUE(same_bytes(got, after[0][static_cast<std::size_t>(step)])) << "rank " << r << " step " << step;
      const double error = (got - want).abs().max().item<double>();
      EXPECT_LE(error, 1e-6 * want.abs().max().item<double>()) << "rank " << r << " step " << step;
      // One rank averages nothing and runs torch's own tensor operations: the same bits.
      if (p == 1) {
        EXPECT_TRUE(same_bytes(got, want)) << "step " << step;
      }
    }
  }
}

TEST(TorchZero, Stage1OneRankMatchesSgd) { check_against_sgd(1, 1, 0.0); }
TEST(TorchZero, Stage1TwoRanksMatchSgd) { check_against_sgd(1, 2, 0.0); }
TEST(TorchZero, Stage1ThreeRanksWithPaddingMatchSgd) { check_against_sgd(1, 3, 0.0); }
TEST(TorchZero, Stage1FourRanksWithPaddingMatchSgd) { check_against_sgd(1, 4, 0.0); }
TEST(TorchZero, Stage2OneRankMatchesSgd) { check_against_sgd(2, 1, 0.0); }
TEST(TorchZero, Stage2TwoRanksMatchSgd) { check_against_sgd(2, 2, 0.0); }
TEST(TorchZero, Stage2ThreeRanksWithPaddingMatchSgd) { check_against_sgd(2, 3, 0.0); }
TEST(TorchZero, Stage2FourRanksWithPaddingMatchSgd) { check_against_sgd(2, 4, 0.0); }
TEST(TorchZero, Stage1WithWeightDecayMatchesSgd) { check_against_sgd(1, 3, 0.01); }
TEST(TorchZero, Stage2WithWeightDecayMatchesSgd) { check_against_sgd(2, 4, 0.01); }
TEST(TorchZero, Stage2OverlappedOneRankMatchesSgd) { check_against_sgd(2, 1, 0.0, true); }
TEST(TorchZero, Stage2OverlappedTwoRanksMatchSgd) { check_against_sgd(2, 2, 0.0, true); }
TEST(TorchZero, Stage2OverlappedThreeRanksWithPaddingMatchSgd) { check_against_sgd(2, 3, 0.01, true); }
TEST(TorchZero, Stage2OverlappedFourRanksWithPaddingMatchSgd) { check_against_sgd(2, 4, 0.0, true); }

// With overlap, rank 1 leaves fc2 out of its graph: its hooks never fire there, so rank 1 starts
// the buckets holding fc2 (and, in the fixed order, every bucket after them) in step(). The
// buckets must still pair up: the result is the run without overlap's, and the same on every rank.
TEST(TorchZero, OverlapWithAParameterWithoutGradientOnOneRank) {
  torch::set_num_threads(1);
  constexpr int p = 3;
  std::vector<torch::Tensor> results;
  for (bool overlap : {false, true}) {
    auto models = identical_models(p);
    const auto failures = run_ranks(p, [&](Communicator& comm) {
      auto& model = models[static_cast<std::size_t>(comm.rank())];
      tutti::libtorch::ShardedOptimizer optimizer(
          comm, model->named_parameters().pairs(),
          {.stage = 2, .lr = 0.1, .momentum = 0.9, .overlap = overlap, .bucket_bytes = 8});
      for (int step = 0; step < 3; ++step) {
        optimizer.zero_grad();
        auto [x, y] = batch(step);
        x = x.narrow(0, comm.rank() * 8, 8);
        y = y.narrow(0, comm.rank() * 8, 8);
        auto out = comm.rank() == 1 ? torch::tanh(model->fc1->forward(x)).narrow(1, 0, 2) : model->forward(x);
        torch::mse_loss(out, y).backward();
        optimizer.step();
      }
    });
    ASSERT_EQ(failures, "");
    for (int r = 1; r < p; ++r)
      EXPECT_TRUE(same_bytes(flat_parameters(models[static_cast<std::size_t>(r)]), flat_parameters(models[0])));
    results.push_back(flat_parameters(models[0]));
  }
  EXPECT_LE((results[1] - results[0]).abs().max().item<double>(), 1e-6 * results[0].abs().max().item<double>());
}

// With overlap, a second backward before step() would be lost (its gradients were copied at the
// first); zero_grad() between backward and step() would drop reduces in flight. Both are refused.
TEST(TorchZero, OverlapRefusesTwoBackwardPassesAndZeroGradBeforeStep) {
  torch::set_num_threads(1);
  auto model = identical_models(1)[0];
  const auto failures = run_ranks(1, [&](Communicator& comm) {
    tutti::libtorch::ShardedOptimizer optimizer(comm, model->named_parameters().pairs(),
                                                {.stage = 2, .lr = 0.1, .overlap = true});
    auto [x, y] = batch(0);
    torch::mse_loss(model->forward(x), y).backward();
    try {
      optimizer.zero_grad();
      ADD_FAILURE() << "zero_grad between backward and step";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::invalid_argument);
      EXPECT_NE(std::string(e.what()).find("being reduced"), std::string::npos) << e.what();
    }
    try {
      torch::mse_loss(model->forward(x), y).backward();
      ADD_FAILURE() << "a second backward before step";
    } catch (const std::exception& e) {
      EXPECT_NE(std::string(e.what()).find("was produced twice before step()"), std::string::npos) << e.what();
    }
    optimizer.step();  // still usable: the first backward's gradients
    EXPECT_EQ(optimizer.steps(), 1u);
  });
  EXPECT_EQ(failures, "");
}

// Without momentum SGD keeps no state, and neither does the sharded optimizer.
TEST(TorchZero, WithoutMomentumKeepsNoState) {
  torch::set_num_threads(1);
  auto models = identical_models(2);
  const auto failures = run_ranks(2, [&](Communicator& comm) {
    auto& model = models[static_cast<std::size_t>(comm.rank())];
    tutti::libtorch::ShardedOptimizer optimizer(comm, model->named_parameters().pairs(), {.stage = 2, .lr = 0.1});
    EXPECT_EQ(optimizer.optimizer_state_bytes(), 0u);
    auto [x, y] = batch(0);
    torch::mse_loss(model->forward(x.narrow(0, comm.rank() * 12, 12)), y.narrow(0, comm.rank() * 12, 12)).backward();
    optimizer.step();
  });
  ASSERT_EQ(failures, "");
  Net reference = identical_models(1)[0];
  torch::optim::SGD sgd(reference->parameters(), torch::optim::SGDOptions(0.1));
  auto [x, y] = batch(0);
  torch::mse_loss(reference->forward(x), y).backward();
  sgd.step();
  const auto want = flat_parameters(reference);
  EXPECT_TRUE(same_bytes(flat_parameters(models[0]), flat_parameters(models[1])));
  EXPECT_LE((flat_parameters(models[0]) - want).abs().max().item<double>(), 1e-6 * want.abs().max().item<double>());
}

// Constructs a ShardedOptimizer on p ranks with each rank's arguments; every rank must throw
// Error(invalid_argument) (none may wait in a collective the others never make) whose message
// holds that rank's expected text.
void expect_error_on_every_rank(int p, const std::function<NamedTensors(int rank)>& parameters,
                                const std::function<tutti::libtorch::ShardedOptions(int rank)>& options,
                                const std::function<std::string(int rank)>& expected) {
  std::vector<NamedTensors> named;
  for (int r = 0; r < p; ++r) named.push_back(parameters(r));  // on this thread: torch's generator
  std::mutex mutex;
  int errors = 0;
  const auto failures = run_ranks(p, [&](Communicator& comm) {
    try {
      tutti::libtorch::ShardedOptimizer optimizer(comm, named[static_cast<std::size_t>(comm.rank())],
                                                  options(comm.rank()));
      ADD_FAILURE() << "rank " << comm.rank() << ": no error";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::invalid_argument) << e.what();
      const std::string want = expected(comm.rank());
      EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << "want '" << want << "' in: " << e.what();
      std::lock_guard lock(mutex);
      ++errors;
    }
  });
  EXPECT_EQ(failures, "");
  EXPECT_EQ(errors, p);
}

NamedTensors net_parameters(int /*rank*/) {
  torch::manual_seed(7);
  return Net()->named_parameters().pairs();
}
tutti::libtorch::ShardedOptions good_options(int /*rank*/) { return {.stage = 1, .lr = 0.1, .momentum = 0.9}; }

TEST(TorchZero, RefusesStagesOtherThanOneAndTwo) {
  for (int stage : {0, 3}) {
    expect_error_on_every_rank(
        2, net_parameters, [&](int) { return tutti::libtorch::ShardedOptions{.stage = stage, .lr = 0.1}; },
        [&](int) { return "stage " + std::to_string(stage) + " is not supported"; });
  }
  // On one rank only: the other must fail too, not wait.
  expect_error_on_every_rank(
      2, net_parameters,
      [](int rank) { return tutti::libtorch::ShardedOptions{.stage = rank == 1 ? 3 : 1, .lr = 0.1}; },
      [](int rank) { return rank == 1 ? std::string("stage 3 is not supported") : "rank(s) 1 failed their checks"; });
}

TEST(TorchZero, RefusesNegativeSettingsAndOptionsThatDifferBetweenRanks) {
  expect_error_on_every_rank(
      2, net_parameters, [](int) { return tutti::libtorch::ShardedOptions{.stage = 1, .lr = -0.1}; },
      [](int) { return "lr must be finite and >= 0"; });
  expect_error_on_every_rank(
      2, net_parameters, [](int) { return tutti::libtorch::ShardedOptions{.stage = 1, .lr = 0.1, .overlap = true}; },
      [](int) { return "overlap needs stage 2"; });
  expect_error_on_every_rank(
      2, net_parameters,
      [](int) { return tutti::libtorch::ShardedOptions{.stage = 2, .lr = 0.1, .overlap = true, .bucket_bytes = 3}; },
      [](int) { return "bucket_bytes must be at least 4"; });
  expect_error_on_every_rank(
      3, net_parameters,
      [](int rank) { return tutti::libtorch::ShardedOptions{.stage = 1, .lr = rank == 2 ? 0.2 : 0.1}; },
      [](int rank) { return rank == 2 ? std::string("differ from rank 0's") : "rank(s) 2 failed their checks"; });
}

TEST(TorchZero, RefusesANonFloatParameterOnOneRank) {
  expect_error_on_every_rank(
      2,
      [](int rank) {
        auto named = net_parameters(rank);
        if (rank == 1) named[2].second = named[2].second.detach().to(torch::kDouble).requires_grad_();
        return named;
      },
      good_options,
      [](int rank) {
        return rank == 1 ? std::string("parameter fc2.weight is Double, not Float") : "rank(s) 1 failed their checks";
      });
}

TEST(TorchZero, RefusesANonLeafParameter) {
  expect_error_on_every_rank(
      2,
      [](int rank) {
        auto named = net_parameters(rank);
        named[1].second = named[1].second * 2;  // requires grad, computed from a leaf
        return named;
      },
      good_options, [](int) { return "parameter fc1.bias is not a leaf tensor"; });
}

TEST(TorchZero, RefusesParameterNamesThatDifferBetweenRanks) {
  expect_error_on_every_rank(
      3,
      [](int rank) {
        auto named = net_parameters(rank);
        if (rank == 2) named[3].first = "fc2.b";
        return named;
      },
      good_options,
      [](int rank) {
        return rank == 2 ? std::string("parameter 3 is fc2.b Float[2] here but fc2.bias Float[2] on rank 0")
                         : "rank(s) 2 failed their checks";
      });
  expect_error_on_every_rank(  // a parameter fewer on rank 1
      2,
      [](int rank) {
        auto named = net_parameters(rank);
        if (rank == 1) named.pop_back();
        return named;
      },
      good_options,
      [](int rank) {
        return rank == 1 ? std::string("parameter 3 of rank 0 (fc2.bias Float[2]) has no counterpart here")
                         : "rank(s) 1 failed their checks";
      });
}

TEST(TorchZero, RefusesDuplicateNames) {
  expect_error_on_every_rank(
      1,
      [](int rank) {
        auto named = net_parameters(rank);
        named[1].first = named[0].first;
        return named;
      },
      good_options, [](int) { return "parameter fc1.weight appears twice"; });
}

// Frozen parameters are left out of the flat vector and never changed.
TEST(TorchZero, LeavesParametersWithoutGradAlone) {
  torch::set_num_threads(1);
  auto models = identical_models(2);
  for (auto& m : models) m->fc1->bias.requires_grad_(false);
  const auto frozen = models[0]->fc1->bias.clone();
  const auto failures = run_ranks(2, [&](Communicator& comm) {
    auto& model = models[static_cast<std::size_t>(comm.rank())];
    tutti::libtorch::ShardedOptimizer optimizer(comm, model->named_parameters().pairs(),
                                                {.stage = 2, .lr = 0.1, .momentum = 0.9, .weight_decay = 0.1});
    EXPECT_EQ(optimizer.parameter_count(), static_cast<std::size_t>(parameters_in_net - 4));
    auto [x, y] = batch(0);
    torch::mse_loss(model->forward(x.narrow(0, comm.rank() * 12, 12)), y.narrow(0, comm.rank() * 12, 12)).backward();
    optimizer.step();
  });
  ASSERT_EQ(failures, "");
  for (auto& m : models) EXPECT_TRUE(same_bytes(m->fc1->bias, frozen));
  EXPECT_FALSE(torch::equal(models[0]->fc1->weight, identical_models(1)[0]->fc1->weight));
}

}  // namespace
}  // namespace tutti
