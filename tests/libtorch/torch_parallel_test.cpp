// The model-parallel libtorch glue, with ranks as threads: pipeline_schedule (every schedule is
// complete, ordered, deadlock-free and within its memory bound), PipelineStage against the same
// network run whole in one thread (bit for bit: the same operations on the same micro-batches),
// and Column/RowParallelLinear against the whole linear layers (forward, input and weight
// gradients).
#include <gtest/gtest.h>

#include <torch/torch.h>

#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "harness.hpp"
#include "tutti/torch.hpp"

namespace tutti {
namespace {

using testing::run_ranks;
using tutti::libtorch::pipeline_schedule;
using tutti::libtorch::PipelineAction;
using tutti::libtorch::PipelineSchedule;

std::string spell(const std::vector<PipelineAction>& actions) {
  std::string s;
  for (const auto& a : actions)
    s += (s.empty() ? "" : " ") + std::string(a.forward ? "F" : "B") + std::to_string(a.micro_batch);
  return s;
}

TEST(PipelineSchedule, SmallCasesSpelledOut) {
  EXPECT_EQ(spell(pipeline_schedule(PipelineSchedule::gpipe, 2, 0, 3)), "F0 F1 F2 B0 B1 B2");
  EXPECT_EQ(spell(pipeline_schedule(PipelineSchedule::one_f_one_b, 4, 0, 4)), "F0 F1 F2 F3 B0 B1 B2 B3");
  EXPECT_EQ(spell(pipeline_schedule(PipelineSchedule::one_f_one_b, 4, 1, 4)), "F0 F1 F2 B0 F3 B1 B2 B3");
  EXPECT_EQ(spell(pipeline_schedule(PipelineSchedule::one_f_one_b, 4, 3, 4)), "F0 B0 F1 B1 F2 B2 F3 B3");
  EXPECT_EQ(spell(pipeline_schedule(PipelineSchedule::one_f_one_b, 4, 0, 2)), "F0 F1 B0 B1");
  EXPECT_EQ(spell(pipeline_schedule(PipelineSchedule::gpipe, 1, 0, 1)), "F0 B0");
}

TEST(PipelineSchedule, BadArguments) {
  for (auto [stages, stage, m] : {std::tuple{0, 0, 1}, {2, 2, 1}, {2, -1, 1}, {2, 0, 0}})
    EXPECT_THROW(pipeline_schedule(PipelineSchedule::gpipe, stages, stage, m), Error) << stages << " " << stage;
}

// Runs every stage's schedule against the others: a forward waits for the previous stage's
// forward of the micro-batch, a backward for the next stage's backward; sends never wait. Returns
// the number of rounds until all stages finished (each round, every stage whose next action is
// ready runs it), or -1 if the stages deadlock.
int rounds_to_finish(PipelineSchedule schedule, int stages, int m) {
  std::vector<std::vector<PipelineAction>> plan;
  for (int s = 0; s < stages; ++s) plan.push_back(pipeline_schedule(schedule, stages, s, m));
  std::vector<std::size_t> next(static_cast<std::size_t>(stages), 0);
  std::map<std::tuple<int, bool, int>, bool> done;  // (stage, forward, micro-batch)
  for (int round = 1;; ++round) {
    std::vector<std::tuple<int, bool, int>> ran;
    for (int s = 0; s < stages; ++s) {
      const auto i = static_cast<std::size_t>(s);
      if (next[i] == plan[i].size()) continue;
      const PipelineAction a = plan[i][next[i]];
      const bool ready = a.forward ? s == 0 || done.count({s - 1, true, a.micro_batch})
                                   : s == stages - 1 || done.count({s + 1, false, a.micro_batch});
      if (!ready) continue;
      ran.emplace_back(s, a.forward, a.micro_batch);
      ++next[i];
    }
    for (const auto& key : ran) done[key] = true;
    bool finished = true;
    for (int s = 0; s < stages; ++s)
      finished = finished && next[static_cast<std::size_t>(s)] == plan[static_cast<std::size_t>(s)].size();
    if (finished) return round;
    if (ran.empty()) return -1;
  }
}

TEST(PipelineSchedule, CompleteOrderedBoundedAndDeadlockFree) {
  for (auto schedule : {PipelineSchedule::gpipe, PipelineSchedule::one_f_one_b})
    for (int stages = 1; stages <= 5; ++stages)
      for (int m = 1; m <= 9; ++m) {
        const std::string where = std::string(tutti::libtorch::to_string(schedule)) + " N=" + std::to_string(stages) +
                                  " M=" + std::to_string(m);
        for (int s = 0; s < stages; ++s) {
          const auto actions = pipeline_schedule(schedule, stages, s, m);
          ASSERT_EQ(actions.size(), static_cast<std::size_t>(2 * m)) << where;
          int forwards = 0, backwards = 0, alive = 0, most_alive = 0;
          for (const auto& a : actions) {
            // Forwards and backwards each in micro-batch order; a backward after its forward.
            if (a.forward) {
              EXPECT_EQ(a.micro_batch, forwards++) << where;
              most_alive = std::max(most_alive, ++alive);
            } else {
              EXPECT_EQ(a.micro_batch, backwards++) << where;
              EXPECT_LT(a.micro_batch, forwards) << where;
              --alive;
            }
          }
          // 1F1B keeps at most N - stage micro-batches' activations; GPipe all of them.
          EXPECT_EQ(most_alive, schedule == PipelineSchedule::gpipe ? m : std::min(stages - s, m))
              << where << " stage " << s;
        }
        // With unit-time actions both finish in 2(M + N - 1) rounds: the bubble's 2(N - 1).
        EXPECT_EQ(rounds_to_finish(schedule, stages, m), 2 * (m + stages - 1)) << where;
      }
}

TEST(PipelineSchedule, BubbleTheory) {
  EXPECT_DOUBLE_EQ(tutti::libtorch::pipeline_bubble_theory(1, 4), 0.0);
  EXPECT_DOUBLE_EQ(tutti::libtorch::pipeline_bubble_theory(2, 4), 1.0 / 5.0);
  EXPECT_DOUBLE_EQ(tutti::libtorch::pipeline_bubble_theory(4, 8), 3.0 / 11.0);
  EXPECT_EQ(tutti::libtorch::pipeline_schedule_from_name("1f1b"), PipelineSchedule::one_f_one_b);
  EXPECT_EQ(tutti::libtorch::pipeline_schedule_from_name("gpipe"), PipelineSchedule::gpipe);
  EXPECT_FALSE(tutti::libtorch::pipeline_schedule_from_name("GPipe"));
}

// Three linear layers with tanh between, one per stage; an MSE loss on the last.
struct Chain {
  std::vector<torch::nn::Linear> layers;
  explicit Chain(std::uint64_t seed) {
    torch::manual_seed(seed);
    for (auto [in, out] : {std::pair{6, 5}, {5, 4}, {4, 3}}) layers.emplace_back(in, out);
  }
  torch::Tensor stage_forward(int stage, const torch::Tensor& x) {
    auto y = layers[static_cast<std::size_t>(stage)]->forward(x);
    return stage < 2 ? torch::tanh(y) : y;
  }
};

torch::Tensor data_of(int index, std::vector<std::int64_t> shape) {
  auto generator = ::at::detail::createCPUGenerator(500 + static_cast<std::uint64_t>(index));
  return torch::randn(shape, generator);
}

void pipeline_matches_whole_network(PipelineSchedule schedule, int m) {
  constexpr std::int64_t micro = 4;
  const auto inputs = data_of(0, {m * micro, 6}).chunk(m);
  const auto targets = data_of(1, {m * micro, 3}).chunk(m);
  auto loss_of = [&](const torch::Tensor& out, int k) {
    return torch::mse_loss(out, targets[static_cast<std::size_t>(k)]) / m;
  };
  // The reference: the same micro-batches through the whole chain, in one thread, twice (two steps).
  Chain whole(7);
  double want_loss = 0;
  for (int step = 0; step < 2; ++step)
    for (int k = 0; k < m; ++k) {
      auto x = inputs[static_cast<std::size_t>(k)];
      for (int s = 0; s < 3; ++s) x = whole.stage_forward(s, x);
      auto loss = loss_of(x, k);
      if (step == 1) want_loss += loss.item<double>();
      loss.backward();
    }
  std::vector<Chain> chains;
  for (int r = 0; r < 3; ++r) chains.emplace_back(7);
  std::mutex mutex;
  std::vector<double> got_loss(3, -1);
  const auto failures = run_ranks(3, [&](Communicator& comm) {
    const int s = comm.rank();
    Chain& chain = chains[static_cast<std::size_t>(s)];
    const std::vector<std::int64_t> shape{s == 0 ? 6 : s == 1 ? 5 : 4};
    tutti::libtorch::PipelineStage stage(
        comm, [&](const torch::Tensor& x) { return chain.stage_forward(s, x); }, shape, schedule, m);
    std::vector<torch::Tensor> mine =
        s == 0 ? std::vector<torch::Tensor>(inputs.begin(), inputs.end()) : std::vector<torch::Tensor>{};
    double loss = 0;
    for (int step = 0; step < 2; ++step) loss = stage.run(micro, mine, loss_of);
    EXPECT_EQ(stage.stats().steps, 2u);
    EXPECT_GT(stage.stats().compute_seconds, 0);
    std::lock_guard lock(mutex);
    got_loss[static_cast<std::size_t>(s)] = loss;
  });
  ASSERT_EQ(failures, "");
  EXPECT_EQ(got_loss[2], want_loss);  // the same operations: bit for bit
  EXPECT_EQ(got_loss[0], 0);
  for (int s = 0; s < 3; ++s) {
    const auto& layer = chains[static_cast<std::size_t>(s)].layers[static_cast<std::size_t>(s)];
    const auto& reference = whole.layers[static_cast<std::size_t>(s)];
    EXPECT_TRUE(torch::equal(layer->weight.grad(), reference->weight.grad())) << "stage " << s;
    EXPECT_TRUE(torch::equal(layer->bias.grad(), reference->bias.grad())) << "stage " << s;
  }
}

TEST(PipelineStage, GPipeMatchesTheWholeNetwork) { pipeline_matches_whole_network(PipelineSchedule::gpipe, 4); }
TEST(PipelineStage, OneFOneBMatchesTheWholeNetwork) {
  pipeline_matches_whole_network(PipelineSchedule::one_f_one_b, 5);
}
TEST(PipelineStage, OneMicroBatch) { pipeline_matches_whole_network(PipelineSchedule::one_f_one_b, 1); }

TEST(PipelineStage, WrongInputsOnTheFirstStage) {
  const auto failures = run_ranks(1, [&](Communicator& comm) {
    tutti::libtorch::PipelineStage stage(
        comm, [](const torch::Tensor& x) { return x; }, {3}, PipelineSchedule::gpipe, 2);
    const auto loss = [](const torch::Tensor& out, int) { return out.sum(); };
    EXPECT_THROW(stage.run(4, {torch::zeros({4, 3})}, loss), Error);                        // one, not two
    EXPECT_THROW(stage.run(4, {torch::zeros({4, 3}), torch::zeros({3, 3})}, loss), Error);  // 3 samples
  });
  EXPECT_EQ(failures, "");
}

void expect_close(const torch::Tensor& got, const torch::Tensor& want, const std::string& what) {
  ASSERT_EQ(got.sizes(), want.sizes()) << what;
  const double scale = std::max(1.0, want.abs().max().item<double>());
  EXPECT_LE((got - want).abs().max().item<double>(), 1e-6 * scale) << what;
}

// fc2(relu(fc1(x))) split over T ranks against the whole pair.
void tensor_parallel_matches(int t) {
  torch::manual_seed(3);
  torch::nn::Linear fc1(8, 12), fc2(12, 5);
  const auto x = data_of(2, {7, 8});
  const auto target = data_of(3, {7, 5});
  auto whole_x = x.clone().requires_grad_(true);
  auto want = fc2->forward(torch::relu(fc1->forward(whole_x)));
  torch::mse_loss(want, target).backward();
  const std::int64_t share = 12 / t;
  const auto failures = run_ranks(t, [&](Communicator& comm) {
    tutti::libtorch::ColumnParallelLinear column(comm, fc1);
    tutti::libtorch::RowParallelLinear row(comm, fc2);
    auto mine = x.clone().requires_grad_(true);
    auto got = row->forward(torch::relu(column->forward(mine)));
    torch::mse_loss(got, target).backward();
    const auto r = comm.rank();
    expect_close(got, want.detach(), "output");
    expect_close(mine.grad(), whole_x.grad(), "input gradient");  // summed over the ranks in backward
    expect_close(column->weight.grad(), fc1->weight.grad().slice(0, r * share, (r + 1) * share), "fc1 weight");
    expect_close(column->bias.grad(), fc1->bias.grad().slice(0, r * share, (r + 1) * share), "fc1 bias");
    expect_close(row->weight.grad(), fc2->weight.grad().slice(1, r * share, (r + 1) * share), "fc2 weight");
    expect_close(row->bias.grad(), fc2->bias.grad(), "fc2 bias");
  });
  EXPECT_EQ(failures, "");
}

TEST(TensorParallel, TwoRanks) { tensor_parallel_matches(2); }
TEST(TensorParallel, FourRanks) { tensor_parallel_matches(4); }

TEST(TensorParallel, FeaturesThatDoNotSplit) {
  torch::nn::Linear fc(8, 10), wide(10, 4);  // on this thread: the global generator is not for threads
  const auto failures = run_ranks(3, [&](Communicator& comm) {
    EXPECT_THROW(tutti::libtorch::ColumnParallelLinear(comm, fc), Error);  // 10 outputs over 3
    EXPECT_THROW(tutti::libtorch::RowParallelLinear(comm, wide), Error);   // 10 inputs over 3
  });
  EXPECT_EQ(failures, "");
}

}  // namespace
}  // namespace tutti
