// What tutti-train's elastic state holds is everything training needs to go on: a Trainer stopped
// mid-epoch, its state (Trainer::save_state, compressor_state) given to a new Trainer, ends the
// epoch with parameters bitwise equal to a Trainer that never stopped, with and without a
// compressor that keeps memory; without the compressor's state it does not. The CPU generator
// comes back too. On synthetic data (no files needed), one rank.
#include <gtest/gtest.h>

#include <torch/torch.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "trainer.hpp"

namespace {

using tutti::train::Trainer;

constexpr std::int64_t samples = 256, batch = 16, stop_after = 5;  // 16 steps an epoch

tutti::train::Data synthetic() {
  torch::manual_seed(7);
  tutti::train::Data d;
  d.train_images = torch::randn({samples, 1, 28, 28});
  d.train_labels = torch::randint(10, {samples}, torch::kInt64);
  d.test_images = torch::randn({64, 1, 28, 28});
  d.test_labels = torch::randint(10, {64}, torch::kInt64);
  return d;
}

tutti::train::Settings settings(const std::string& compression) {
  tutti::train::Settings s;
  s.batch_size = batch;
  s.compression = compression;
  s.threads = 1;
  s.progress = false;
  return s;
}

std::vector<std::uint8_t> generator_bytes() {
  const torch::Tensor t = tutti::libtorch::cpu_generator_state();
  const auto* p = t.data_ptr<std::uint8_t>();
  return {p, p + t.numel()};
}

struct Stop {};

// Epoch 1's parameters' checksum: straight through, or stopped after `stop_after` steps and gone
// on by a new Trainer from the saved state (with or without the compressor's).
std::uint64_t epoch_checksum(const std::string& compression, bool stop, bool with_compressor) {
  torch::set_num_threads(1);
  const auto data = synthetic();
  const auto s = settings(compression);
  auto comm = tutti::local_group(1)[0];
  if (!stop) {
    Trainer t(comm, s, data);
    t.run_epoch(1);
    return t.parameter_checksum();
  }
  std::vector<std::byte> weights;
  tutti::compress::CompressorState compressor;
  std::vector<std::uint8_t> generator;
  {
    Trainer t(comm, s, data);
    torch::rand({3});  // the generator moves on from the Trainer's seed
    try {
      t.run_epoch(1, 0, [&](std::int64_t step, double) {
        if (step + 1 < stop_after) return;
        weights = t.save_state();
        compressor = t.compressor_state();
        generator = generator_bytes();
        throw Stop{};
      });
      ADD_FAILURE() << "the epoch was not stopped";
    } catch (const Stop&) {
    }
  }
  EXPECT_EQ(compressor.shared.empty(), compression == "none") << compression;
  Trainer t(comm, s, data);  // seeds the generator again
  t.load_state(weights);
  EXPECT_EQ(generator_bytes(), generator) << "the CPU generator's state";
  if (with_compressor) t.load_compressor_state(compressor.shared, compressor.local);
  t.run_epoch(1, 0, {}, stop_after * batch);
  return t.parameter_checksum();
}

}  // namespace

TEST(TrainState, GoesOnBitForBitFromTheSavedState) {
  for (const char* compression : {"none", "topk:0.1", "qsgd:8", "powersgd:1"})
    EXPECT_EQ(epoch_checksum(compression, true, true), epoch_checksum(compression, false, false)) << compression;
}

TEST(TrainState, WithoutTheCompressorsStateItDoesNot) {
  for (const char* compression : {"topk:0.1", "qsgd:8", "powersgd:1"})
    EXPECT_NE(epoch_checksum(compression, true, false), epoch_checksum(compression, false, false)) << compression;
}

TEST(TrainState, RefusesAnotherCompressionsState) {
  torch::set_num_threads(1);
  const auto data = synthetic();
  auto comm = tutti::local_group(1)[0];
  Trainer topk(comm, settings("topk:0.1"), data);
  topk.run_epoch(1);
  const auto state = topk.compressor_state();
  Trainer none(comm, settings("none"), data);
  EXPECT_THROW(none.load_compressor_state(state.shared, state.local), tutti::Error);
  Trainer qsgd(comm, settings("qsgd:8"), data);
  EXPECT_THROW(qsgd.load_compressor_state(state.shared, state.local), tutti::Error);
  EXPECT_THROW(none.load_state(std::vector<std::byte>(10)), tutti::Error);
}
