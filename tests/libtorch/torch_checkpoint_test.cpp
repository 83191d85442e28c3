// Checkpoints of DistributedOptimizer (<tutti/torch.hpp>), with ranks as threads: a checkpoint
// taken in the background restores parameters and optimizer state bit for bit (SGD with
// momentum, Adam) and training goes on to the same bits; an incomplete, damaged or foreign
// checkpoint is refused before anything changes; a failed write surfaces on wait_checkpoint on
// every rank and publishes nothing; the shard and MANIFEST parsers refuse every truncation.
#include <gtest/gtest.h>

#include <torch/torch.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "harness.hpp"
#include "libtorch/checkpoint_format.hpp"  // the parsers, directly
#include "torch_checkpoint_support.hpp"
#include "tutti/torch.hpp"

namespace tutti {
namespace {

using namespace testing;
namespace fs = std::filesystem;

template <class Optimizer, class Options>
void check_resume(const Options& options) {
  TempDir dir;
  const std::string path = dir.path + "/step-3";
  std::vector<torch::Tensor> saved(2), continued(2), resumed(2);
  torch::manual_seed(7);
  std::vector<Net> models{Net(), Net()};
  torch::manual_seed(8);  // other weights: load must overwrite them
  std::vector<Net> fresh{Net(), Net()};
  const auto failures = run_ranks(2, [&](Communicator& comm) {
    const auto r = static_cast<std::size_t>(comm.rank());
    tutti::libtorch::broadcast_parameters(comm, *models[r], 0);
    Optimizer opt(models[r]->parameters(), options);
    tutti::libtorch::DistributedOptimizer optimizer(comm, opt, models[r]->named_parameters().pairs());
    train(optimizer, models[r], comm.rank(), 0, 3);
    saved[r] = state_of(models[r], opt);
    optimizer.checkpoint_async(path, {{"epoch", "2"}});
    train(optimizer, models[r], comm.rank(), 3, 6);  // while the checkpoint is written
    optimizer.wait_checkpoint();
    continued[r] = state_of(models[r], opt);

    Optimizer opt2(fresh[r]->parameters(), options);
    tutti::libtorch::DistributedOptimizer optimizer2(comm, opt2, fresh[r]->named_parameters().pairs());
    const auto metadata = optimizer2.load_checkpoint(path);
    EXPECT_EQ(metadata.at("epoch"), "2");
    EXPECT_EQ(optimizer2.optimizer_steps(), 3u);
    EXPECT_TRUE(torch::equal(state_of(fresh[r], opt2), saved[r])) << "rank " << r << ": restored state";
    train(optimizer2, fresh[r], comm.rank(), 3, 6);
    resumed[r] = state_of(fresh[r], opt2);
  });
  ASSERT_EQ(failures, "");
  for (std::size_t r = 0; r < 2; ++r) EXPECT_TRUE(torch::equal(resumed[r], continued[r])) << "rank " << r;
  EXPECT_TRUE(fs::exists(path + "/MANIFEST"));
  EXPECT_TRUE(fs::exists(path + "/shard-0-of-2") && fs::exists(path + "/shard-1-of-2"));
  // Each rank wrote a part: neither shard holds everything.
  EXPECT_GT(fs::file_size(path + "/shard-1-of-2"), 100u);
}

TEST(TorchCheckpoint, SgdMomentumResumesBitwise) {
  torch::set_num_threads(1);
  check_resume<torch::optim::SGD>(torch::optim::SGDOptions(0.1).momentum(0.9));
}

TEST(TorchCheckpoint, AdamResumesBitwise) {
  torch::set_num_threads(1);
  check_resume<torch::optim::Adam>(torch::optim::AdamOptions(0.01));
}

// Loads dir into a fresh 1-rank model (hidden units `hidden`); expects `code` and `text` in the
// error, and the model and optimizer untouched.
void expect_refused(const std::string& dir, ErrorCode code, const std::string& text, std::int64_t hidden = 4) {
  auto comms = local_group(1);
  torch::manual_seed(11);
  Net model(hidden);
  torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  tutti::libtorch::DistributedOptimizer optimizer(comms[0], sgd, model->named_parameters().pairs());
  const auto before = state_of(model, sgd);
  try {
    optimizer.load_checkpoint(dir);
    ADD_FAILURE() << "no error loading " << dir;
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), code) << e.what();
    EXPECT_NE(std::string(e.what()).find(text), std::string::npos) << e.what();
  }
  EXPECT_TRUE(torch::equal(state_of(model, sgd), before)) << "the refused load changed the model";
  EXPECT_TRUE(sgd.state().empty());
}

// With a compressor that keeps memory (top-k's residuals, each rank's own) and a module buffer,
// a resumed run goes on to the same bits: the checkpoint holds the compressor's state and the
// buffers. A checkpoint without a buffer the model has is refused.
TEST(TorchCheckpoint, CompressorAndBuffersResumeBitwise) {
  TempDir dir;
  const std::string path = dir.path + "/step-3";
  std::vector<torch::Tensor> continued(2), resumed(2);
  torch::manual_seed(7);
  std::vector<Net> models{Net(), Net()};
  torch::manual_seed(8);
  std::vector<Net> fresh{Net(), Net()};
  for (auto* set : {&models, &fresh})
    for (auto& m : *set) m->register_buffer("seen", torch::zeros({3}));
  auto train_counting = [](tutti::libtorch::DistributedOptimizer& optimizer, Net& model, int rank, int first,
                           int last) {
    for (int step = first; step < last; ++step) {
      train(optimizer, model, rank, step, step + 1);
      torch::NoGradGuard no_grad;
      model->named_buffers()["seen"].add_(static_cast<float>(step + 1));
    }
  };
  auto everything = [](Net& model, torch::optim::Optimizer& opt) {
    return torch::cat({state_of(model, opt), model->named_buffers()["seen"]}).clone();
  };
  const auto failures = run_ranks(2, [&](Communicator& comm) {
    const auto r = static_cast<std::size_t>(comm.rank());
    tutti::libtorch::broadcast_parameters(comm, *models[r], 0);
    auto options = [](Net& model) {
      tutti::libtorch::DistributedOptions o;
      o.compression = compress::Compression::parse("topk:0.3");
      o.buffers = model->named_buffers().pairs();
      o.checkpoint_generator = false;  // one generator for both threads: tested on one rank below
      return o;
    };
    torch::optim::SGD opt(models[r]->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
    tutti::libtorch::DistributedOptimizer optimizer(comm, opt, models[r]->named_parameters().pairs(),
                                                    options(models[r]));
    train_counting(optimizer, models[r], comm.rank(), 0, 3);
    optimizer.checkpoint_async(path);
    train_counting(optimizer, models[r], comm.rank(), 3, 6);
    optimizer.wait_checkpoint();
    continued[r] = everything(models[r], opt);

    torch::optim::SGD opt2(fresh[r]->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
    tutti::libtorch::DistributedOptimizer optimizer2(comm, opt2, fresh[r]->named_parameters().pairs(),
                                                     options(fresh[r]));
    optimizer2.load_checkpoint(path);
    EXPECT_TRUE(torch::equal(fresh[r]->named_buffers()["seen"], torch::full({3}, 6.0f))) << "the buffer";
    train_counting(optimizer2, fresh[r], comm.rank(), 3, 6);
    resumed[r] = everything(fresh[r], opt2);
  });
  ASSERT_EQ(failures, "");
  for (std::size_t r = 0; r < 2; ++r) EXPECT_TRUE(torch::equal(resumed[r], continued[r])) << "rank " << r;

  // A model with a buffer the checkpoint lacks.
  write_one(dir.path, "plain");
  const auto refused = run_ranks(1, [&](Communicator& comm) {
    Net model;
    model->register_buffer("seen", torch::zeros({3}));
    torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
    tutti::libtorch::DistributedOptions o;
    o.buffers = model->named_buffers().pairs();
    tutti::libtorch::DistributedOptimizer optimizer(comm, sgd, model->named_parameters().pairs(), o);
    try {
      optimizer.load_checkpoint(dir.path + "/plain");
      ADD_FAILURE() << "a checkpoint without the buffer was loaded";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::mismatch);
      EXPECT_NE(std::string(e.what()).find("written without the buffer seen"), std::string::npos) << e.what();
    }
  });
  EXPECT_EQ(refused, "");
}

// The CPU generator: a resumed run draws the numbers the run would have drawn after the checkpoint.
TEST(TorchCheckpoint, GeneratorResumes) {
  TempDir dir;
  const auto failures = run_ranks(1, [&](Communicator& comm) {
    Net model;
    torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(0.1));
    tutti::libtorch::DistributedOptimizer optimizer(comm, sgd, model->named_parameters().pairs());
    train(optimizer, model, 0, 0, 1);
    torch::manual_seed(11);
    torch::rand({5});
    optimizer.checkpoint(dir.path + "/ck");
    const auto next = torch::rand({5});
    torch::manual_seed(12);
    optimizer.load_checkpoint(dir.path + "/ck");
    EXPECT_TRUE(torch::equal(torch::rand({5}), next));
  });
  EXPECT_EQ(failures, "");
}

TEST(TorchCheckpoint, RefusesIncompleteDamagedAndForeignCheckpoints) {
  TempDir dir;
  write_one(dir.path, "a");
  fs::copy(dir.path + "/a", dir.path + "/incomplete");
  fs::remove(dir.path + "/incomplete/MANIFEST");
  expect_refused(dir.path + "/incomplete", ErrorCode::invalid_argument, "no MANIFEST");

  fs::copy(dir.path + "/a", dir.path + "/flipped");
  {
    std::fstream f(dir.path + "/flipped/shard-0-of-1", std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(200);
    char c = 0;
    f.get(c);
    f.seekp(200);
    f.put(static_cast<char>(c ^ 0x10));
  }
  expect_refused(dir.path + "/flipped", ErrorCode::invalid_argument, "shard-0-of-1 is damaged");

  fs::copy(dir.path + "/a", dir.path + "/cut");
  fs::resize_file(dir.path + "/cut/shard-0-of-1", fs::file_size(dir.path + "/cut/shard-0-of-1") - 1);
  expect_refused(dir.path + "/cut", ErrorCode::invalid_argument, "is damaged");

  expect_refused(dir.path + "/a", ErrorCode::mismatch,
                 "another model: parameter 0 is fc1.weight Float[4,5] there, "
                 "fc1.weight Float[6,5] here",
                 6);
  expect_refused(dir.path + "/nonexistent", ErrorCode::invalid_argument, "no MANIFEST");

  // Written by two ranks, loaded by one.
  auto models = std::vector<Net>{Net(), Net()};
  ASSERT_EQ(run_ranks(2,
                      [&](Communicator& comm) {
                        auto& model = models[static_cast<std::size_t>(comm.rank())];
                        torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
                        tutti::libtorch::DistributedOptimizer optimizer(comm, sgd, model->named_parameters().pairs());
                        optimizer.checkpoint(dir.path + "/two");
                      }),
            "");
  expect_refused(dir.path + "/two", ErrorCode::mismatch, "written by 2 ranks, this job has 1");
}

TEST(TorchCheckpoint, RefusesToOverwriteAndBadMetadata) {
  TempDir dir;
  write_one(dir.path, "a");
  auto comms = local_group(1);
  Net model;
  torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(0.1));
  tutti::libtorch::DistributedOptimizer optimizer(comms[0], sgd, model->named_parameters().pairs());
  EXPECT_THROW(optimizer.checkpoint_async(dir.path + "/a"), Error);
  EXPECT_THROW(optimizer.checkpoint_async(dir.path + "/b", {{"epoch", "two words"}}), Error);
  EXPECT_THROW(optimizer.checkpoint_async(dir.path + "/b", {{"optimizer_steps", "1"}}), Error);
  std::ofstream(dir.path + "/file") << "x";
  try {
    optimizer.checkpoint_async(dir.path + "/file/c");
    ADD_FAILURE() << "no error for a directory under a file";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::system) << e.what();
  }
}

// Rank 1 cannot write its shard (its temporary name is taken by a directory): the error comes
// from wait_checkpoint on both ranks, and no MANIFEST is written.
TEST(TorchCheckpoint, FailedWriteSurfacesOnEveryRankAndPublishesNothing) {
  TempDir dir;
  const std::string path = dir.path + "/step-1";
  fs::create_directories(path + "/shard-1-of-2.tmp");
  std::vector<Net> models{Net(), Net()};
  std::vector<std::string> errors(2);
  ASSERT_EQ(run_ranks(2,
                      [&](Communicator& comm) {
                        auto& model = models[static_cast<std::size_t>(comm.rank())];
                        torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(0.1));
                        tutti::libtorch::DistributedOptimizer optimizer(comm, sgd, model->named_parameters().pairs());
                        optimizer.checkpoint_async(path);
                        try {
                          optimizer.wait_checkpoint();
                        } catch (const Error& e) {
                          errors[static_cast<std::size_t>(comm.rank())] = e.what();
                        }
                        optimizer.wait_checkpoint();  // reported once, not again
                      }),
            "");
  EXPECT_NE(errors[1].find("cannot create " + path + "/shard-1-of-2.tmp"), std::string::npos) << errors[1];
  EXPECT_NE(errors[0].find("rank(s) 1 could not write their shards"), std::string::npos) << errors[0];
  EXPECT_FALSE(fs::exists(path + "/MANIFEST"));
  EXPECT_FALSE(tutti::libtorch::latest_checkpoint(dir.path).has_value());
}

// Rank 1's snapshot fails (its directory cannot be made): it gets the error at once, rank 0 from
// wait_checkpoint, nothing is published, and the next checkpoint works on both.
TEST(TorchCheckpoint, FailedSnapshotOnOneRankFailsTheCheckpointOnTheOthers) {
  TempDir dir;
  std::ofstream(dir.path + "/file") << "x";
  std::vector<Net> models{Net(), Net()};
  std::vector<std::string> errors(2);
  ASSERT_EQ(run_ranks(2,
                      [&](Communicator& comm) {
                        const auto r = static_cast<std::size_t>(comm.rank());
                        auto& model = models[r];
                        torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(0.1));
                        tutti::libtorch::DistributedOptimizer optimizer(comm, sgd, model->named_parameters().pairs());
                        try {
                          optimizer.checkpoint_async(r == 0 ? dir.path + "/a" : dir.path + "/file/a");
                          optimizer.wait_checkpoint();
                        } catch (const Error& e) {
                          errors[r] = e.what();
                        }
                        optimizer.checkpoint(dir.path + "/b");
                      }),
            "");
  EXPECT_NE(errors[1].find("cannot create the directory"), std::string::npos) << errors[1];
  EXPECT_NE(errors[0].find("rank(s) 1 could not write their shards"), std::string::npos) << errors[0];
  EXPECT_FALSE(fs::exists(dir.path + "/a/MANIFEST"));
  EXPECT_TRUE(fs::exists(dir.path + "/b/MANIFEST"));
}

TEST(TorchCheckpoint, LatestIsTheCompleteOneWithMostSteps) {
  TempDir dir;
  EXPECT_FALSE(tutti::libtorch::latest_checkpoint(dir.path).has_value());
  EXPECT_FALSE(tutti::libtorch::latest_checkpoint(dir.path + "/nonexistent").has_value());
  write_one(dir.path, "b");
  fs::create_directories(dir.path + "/z-never-completed");
  EXPECT_EQ(tutti::libtorch::latest_checkpoint(dir.path), dir.path + "/b");
  fs::copy(dir.path + "/b", dir.path + "/a");
  EXPECT_EQ(tutti::libtorch::latest_checkpoint(dir.path).value_or("").back(), 'b');  // same steps: either; not z
}

// Every truncation of a shard and of a MANIFEST is refused with an Error (never a crash or a
// partial read); so is any one flipped byte of the MANIFEST.
TEST(TorchCheckpoint, ParsersRefuseEveryTruncation) {
  using namespace tutti::libtorch::detail;
  std::vector<CheckpointEntry> entries{{"param/w", torch::arange(6, torch::kFloat32).reshape({2, 3})},
                                       {"state/w/step", torch::full({1}, 5, torch::kInt64)}};
  const std::string shard = encode_shard(1, 2, entries);
  const auto back = decode_shard(shard, "s", 1, 2);
  ASSERT_EQ(back.size(), 2u);
  EXPECT_EQ(back[0].name, "param/w");
  EXPECT_TRUE(torch::equal(back[0].tensor, entries[0].tensor));
  EXPECT_TRUE(torch::equal(back[1].tensor, entries[1].tensor));
  EXPECT_THROW(decode_shard(shard, "s", 0, 2), Error);
  for (std::size_t n = 0; n < shard.size(); ++n) EXPECT_THROW(decode_shard(shard.substr(0, n), "s", 1, 2), Error) << n;

  Manifest m;
  m.world_size = 2;
  m.optimizer = "torch::optim::SGD";
  m.metadata = {{"epoch", "3"}, {"optimizer_steps", "40"}};
  m.params = {{"w", "Float[2,3]"}};
  m.shards = {{100, 0xabc}, {200, 0xdef}};
  const std::string text = encode_manifest(m);
  const Manifest read = decode_manifest(text, "M");
  EXPECT_EQ(read.world_size, 2);
  EXPECT_EQ(read.optimizer, m.optimizer);
  EXPECT_EQ(read.metadata, m.metadata);
  EXPECT_EQ(read.params, m.params);
  ASSERT_EQ(read.shards.size(), 2u);
  EXPECT_EQ(read.shards[1].bytes, 200u);
  EXPECT_EQ(read.shards[1].checksum, 0xdefu);
  for (std::size_t n = 0; n < text.size(); ++n) EXPECT_THROW(decode_manifest(text.substr(0, n), "M"), Error) << n;
  for (std::size_t i = 0; i < text.size(); ++i) {
    std::string flipped = text;
    flipped[i] = static_cast<char>(flipped[i] ^ 0x01);
    EXPECT_THROW(decode_manifest(flipped, "M"), Error) << i;
  }
}

}  // namespace
}  // namespace tutti
