// Checkpoints that someone else can write into (<tutti/torch.hpp>): a planted symbolic link or
// file is never followed by the writer nor by the reader; a forged shard or MANIFEST, a FIFO, a
// link to /dev/zero are refused with an Error naming the file, in bounded time and memory (each
// such read runs in a child process with a deadline and a cap on its address space, so that a
// regression fails the test instead of hanging it or exhausting the machine); the ranks load the
// checkpoint rank 0 chose even when a newer one is published meanwhile; a damaged newest MANIFEST
// is named in a warning.
#include <gtest/gtest.h>

#include <torch/torch.h>

#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "harness.hpp"
#include "libtorch/checkpoint.hpp"  // read_checkpoint, decode_shard: the internals under attack
#include "torch_checkpoint_support.hpp"
#include "tutti/torch.hpp"

namespace tutti {
namespace {

using namespace testing;
namespace fs = std::filesystem;
namespace cd = tutti::libtorch::detail;

// What `fn` did in a child process given `seconds` and `extra_mb` more address space than this
// process has: "error CODE: WHAT", "exception: WHAT", "returned", "timed out" or "signal N".
std::string in_child(const std::function<void()>& fn, int seconds = 10, long extra_mb = 512) {
  int pipe_fds[2];
  if (::pipe(pipe_fds) != 0) return "no pipe";
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::close(pipe_fds[0]);
    long pages = 0;
    std::ifstream("/proc/self/statm") >> pages;
    const rlim_t cap = static_cast<rlim_t>(pages) * static_cast<rlim_t>(::sysconf(_SC_PAGESIZE)) +
                       static_cast<rlim_t>(extra_mb) * (1 << 20);
    const rlimit limit{cap, cap};
    ::setrlimit(RLIMIT_AS, &limit);
    std::string result;
    try {
      fn();
      result = "returned";
    } catch (const Error& e) {
      result = "error " + std::string(to_string(e.code())) + ": " + e.what();
    } catch (const std::exception& e) {
      result = std::string("exception: ") + e.what();
    }
    if (::write(pipe_fds[1], result.data(), result.size()) < 0) ::_exit(3);
    ::_exit(0);
  }
  ::close(pipe_fds[1]);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(seconds);
  int status = 0;
  while (::waitpid(pid, &status, WNOHANG) == 0) {
    if (std::chrono::steady_clock::now() > deadline) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      ::close(pipe_fds[0]);
      return "timed out";
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  std::string text;
  char buffer[4096];
  ssize_t n;
  while ((n = ::read(pipe_fds[0], buffer, sizeof buffer)) > 0) text.append(buffer, static_cast<std::size_t>(n));
  ::close(pipe_fds[0]);
  if (WIFSIGNALED(status)) return "signal " + std::to_string(WTERMSIG(status));
  return text;
}

std::string contents(const std::string& path) {
  std::ostringstream out;
  out << std::ifstream(path, std::ios::binary).rdbuf();
  return out.str();
}

template <class T>
void put(std::string& out, T value) {
  out.append(reinterpret_cast<const char*>(&value), sizeof value);
}

// A shard of rank 0 of 1 whose header claims `entries` entries, followed by `tail`, with a
// valid checksum.
std::string forged_shard(std::uint32_t entries, const std::string& tail = {}) {
  std::string out = "TUTTICKS";
  for (std::uint32_t v : {1u, 0u, 1u, entries}) put(out, v);
  out += tail;
  put<std::uint64_t>(out, cd::fnv1a(out.data(), out.size()));
  return out;
}

TEST(TorchCheckpointHostile, PlantedTemporaryLinksAreNotFollowed) {
  TempDir dir;
  const std::string victim = dir.path + "/victim", ck = dir.path + "/ck";
  std::ofstream(victim) << "precious";
  fs::create_directories(ck);
  fs::create_symlink(victim, ck + "/shard-0-of-1.tmp");
  fs::create_symlink(victim, ck + "/MANIFEST.tmp");
  fs::create_symlink(victim, ck + "/shard-0-of-1");  // at the published name too
  write_one(dir.path, "ck");
  EXPECT_EQ(contents(victim), "precious") << "the writer wrote through a planted link";
  for (const char* name : {"shard-0-of-1", "MANIFEST"}) {
    EXPECT_FALSE(fs::is_symlink(ck + "/" + name)) << name;
    EXPECT_TRUE(fs::is_regular_file(ck + "/" + name)) << name;
  }
  EXPECT_EQ(cd::read_checkpoint(ck, 1).manifest.world_size, 1);
}

TEST(TorchCheckpointHostile, CheckpointDirectoryThatIsALinkIsRefused) {
  TempDir dir;
  fs::create_directories(dir.path + "/elsewhere");
  fs::create_directory_symlink(dir.path + "/elsewhere", dir.path + "/ck");
  try {
    write_one(dir.path, "ck");
    ADD_FAILURE() << "a checkpoint written through a link";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(dir.path + "/ck"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(fs::is_empty(dir.path + "/elsewhere"));
}

// A directory every user can write (not sticky), or another user's, is refused; a sticky one is not.
TEST(TorchCheckpointHostile, CheckpointDirectoryOthersControlIsRefused) {
  TempDir dir;
  fs::create_directories(dir.path + "/open");
  fs::permissions(dir.path + "/open", fs::perms::all);
  EXPECT_THROW(write_one(dir.path, "open"), Error);
  EXPECT_FALSE(fs::exists(dir.path + "/open/MANIFEST"));
  fs::create_directories(dir.path + "/sticky");
  fs::permissions(dir.path + "/sticky", fs::perms::all | fs::perms::sticky_bit);
  write_one(dir.path, "sticky");
  EXPECT_TRUE(fs::exists(dir.path + "/sticky/MANIFEST"));
  if (::geteuid() != 0) GTEST_SKIP() << "another user's directory: needs root to make one";
  fs::create_directories(dir.path + "/theirs");
  ASSERT_EQ(::chown((dir.path + "/theirs").c_str(), 65534, 65534), 0);
  try {
    write_one(dir.path, "theirs");
    ADD_FAILURE() << "a checkpoint written into another user's directory";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("belongs to uid 65534"), std::string::npos) << e.what();
  }
}

TEST(TorchCheckpointHostile, ShardThatIsALinkIsRefused) {
  TempDir dir;
  write_one(dir.path, "ck");
  const std::string shard = dir.path + "/ck/shard-0-of-1";
  fs::rename(shard, dir.path + "/moved");
  fs::create_symlink(dir.path + "/moved", shard);
  const auto outcome = in_child([&] { cd::read_checkpoint(dir.path + "/ck", 1); });
  EXPECT_EQ(outcome.rfind("error invalid_argument", 0), 0u) << outcome;
  EXPECT_NE(outcome.find(shard), std::string::npos) << outcome;

  fs::remove(shard);
  fs::create_symlink("/dev/zero", shard);
  const auto zero = in_child([&] { cd::read_checkpoint(dir.path + "/ck", 1); });
  EXPECT_EQ(zero.rfind("error invalid_argument", 0), 0u) << zero;
  EXPECT_NE(zero.find(shard), std::string::npos) << zero;
}

TEST(TorchCheckpointHostile, FifoManifestIsRefusedAtOnce) {
  TempDir dir;
  write_one(dir.path, "ck");
  const std::string manifest = dir.path + "/ck/MANIFEST";
  fs::remove(manifest);
  ASSERT_EQ(::mkfifo(manifest.c_str(), 0600), 0);
  const auto read = in_child([&] { cd::read_checkpoint(dir.path + "/ck", 1); });
  EXPECT_EQ(read.rfind("error invalid_argument", 0), 0u) << read;
  EXPECT_NE(read.find(manifest), std::string::npos) << read;
  const auto scan = in_child([&] {
    if (tutti::libtorch::latest_checkpoint(dir.path)) throw std::runtime_error("a FIFO made a checkpoint");
  });
  EXPECT_EQ(scan, "returned") << scan;
}

TEST(TorchCheckpointHostile, ForgedCountsAreRefusedBeforeAllocating) {
  for (std::uint32_t entries : {50'000'000u, 0xFFFFFFFFu}) {
    const std::string shard = forged_shard(entries);
    ASSERT_EQ(shard.size(), 32u);
    const auto outcome = in_child([&] { cd::decode_shard(shard, "forged", 0, 1); }, 10, 256);
    EXPECT_EQ(outcome.rfind("error invalid_argument", 0), 0u) << entries << ": " << outcome;
    EXPECT_NE(outcome.find("forged"), std::string::npos) << outcome;
  }
  // One entry of 2^40 floats whose bytes the file does not hold.
  std::string entry;
  put<std::uint32_t>(entry, 1);
  entry += "w";
  put<std::int32_t>(entry, static_cast<std::int32_t>(c10::ScalarType::Float));
  put<std::uint32_t>(entry, 1);
  put<std::int64_t>(entry, std::int64_t{1} << 40);
  put<std::uint64_t>(entry, std::uint64_t{4} << 40);
  const std::string huge = forged_shard(1, entry);
  const auto outcome = in_child([&] { cd::decode_shard(huge, "forged", 0, 1); }, 10, 256);
  EXPECT_EQ(outcome.rfind("error invalid_argument", 0), 0u) << outcome;
}

TEST(TorchCheckpointHostile, DamagedNewestManifestIsNamedAndTheOlderOneUsed) {
  TempDir dir;
  write_one(dir.path, "a", 2);
  write_one(dir.path, "b", 4);
  {
    std::fstream f(dir.path + "/b/MANIFEST", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(5);
    f.put('X');
  }
  ::testing::internal::CaptureStderr();
  const auto latest = tutti::libtorch::latest_checkpoint(dir.path);
  const std::string warnings = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(latest.value_or(""), dir.path + "/a");
  EXPECT_NE(warnings.find(dir.path + "/b/MANIFEST"), std::string::npos) << warnings;
}

// Ranks 0 and 1 as threads, each with SGD and a DistributedOptimizer over nets[rank]; "" when
// every rank's `body(comm, optimizer, net)` returned.
template <class Body>
std::string with_optimizers(std::vector<Net>& nets, Body body) {
  return run_ranks(2, [&](Communicator& comm) {
    auto& net = nets[static_cast<std::size_t>(comm.rank())];
    torch::optim::SGD sgd(net->parameters(), torch::optim::SGDOptions(0.1));
    tutti::libtorch::DistributedOptimizer optimizer(comm, sgd, net->named_parameters().pairs());
    body(comm, optimizer, net);
  });
}

// Rank 0 looks (and finds step 2, unless it is slower than the 50 ms rank 1 waits); a checkpoint
// of step 4 is then published before rank 1 calls: both must load the same one. (When each rank
// looked for itself, rank 0 loaded step 2 and rank 1 step 4, and both reported success.)
TEST(TorchCheckpointHostile, RanksLoadTheCheckpointRankZeroChose) {
  TempDir dir;
  std::vector<Net> writers{Net(), Net()};
  ASSERT_EQ(with_optimizers(writers,
                            [&](Communicator& comm, auto& optimizer, Net& model) {
                              train(optimizer, model, comm.rank(), 0, 2);
                              optimizer.checkpoint(dir.path + "/ck/step-2");
                              train(optimizer, model, comm.rank(), 2, 4);
                              optimizer.checkpoint(dir.path + "/staging/step-4");
                            }),
            "");
  std::atomic<bool> chosen{false};
  std::vector<std::string> paths(2);
  std::vector<std::uint64_t> steps(2);
  std::vector<Net> readers{Net(), Net()};
  ASSERT_EQ(with_optimizers(readers,
                            [&](Communicator& comm, auto& optimizer, Net&) {
                              const auto r = static_cast<std::size_t>(comm.rank());
                              if (r == 0) chosen = true;  // and looks at once, in the call below
                              if (r == 1) {
                                while (!chosen) std::this_thread::sleep_for(std::chrono::milliseconds(1));
                                std::this_thread::sleep_for(std::chrono::milliseconds(50));
                                fs::rename(dir.path + "/staging/step-4", dir.path + "/ck/step-4");
                              }
                              paths[r] = tutti::libtorch::latest_checkpoint(comm, dir.path + "/ck").value_or("");
                              optimizer.load_checkpoint(paths[r]);
                              steps[r] = optimizer.optimizer_steps();
                            }),
            "");
  EXPECT_EQ(paths[0], paths[1]);
  EXPECT_EQ(steps[0], steps[1]);
}

// Only rank 1 cannot load (its model differs): both ranks throw the same Error, its own.
TEST(TorchCheckpointHostile, OneRanksLoadErrorIsEveryRanksError) {
  TempDir dir;
  std::vector<Net> writers{Net(), Net()};
  ASSERT_EQ(
      with_optimizers(writers, [&](Communicator&, auto& optimizer, Net&) { optimizer.checkpoint(dir.path + "/ck"); }),
      "");
  std::vector<Net> readers{Net(), Net(6)};
  std::vector<std::string> errors(2);
  std::vector<ErrorCode> codes(2, ErrorCode::system);
  ASSERT_EQ(with_optimizers(readers,
                            [&](Communicator& comm, auto& optimizer, Net&) {
                              const auto r = static_cast<std::size_t>(comm.rank());
                              try {
                                optimizer.load_checkpoint(dir.path + "/ck");
                              } catch (const Error& e) {
                                errors[r] = e.what();
                                codes[r] = e.code();
                              }
                            }),
            "");
  EXPECT_EQ(errors[0], errors[1]);
  EXPECT_EQ(codes[0], ErrorCode::mismatch);
  EXPECT_EQ(codes[1], ErrorCode::mismatch);
  EXPECT_NE(errors[0].find("rank 1 could not load it"), std::string::npos) << errors[0];
  EXPECT_NE(errors[0].find("another model"), std::string::npos) << errors[0];
}

// A directory to resume from that does not exist is every rank's error, naming it.
TEST(TorchCheckpointHostile, MissingDirectoryIsEveryRanksError) {
  TempDir dir;
  std::vector<std::string> errors(2);
  ASSERT_EQ(run_ranks(2,
                      [&](Communicator& comm) {
                        try {
                          tutti::libtorch::latest_checkpoint(comm, dir.path + "/missing");
                        } catch (const Error& e) {
                          errors[static_cast<std::size_t>(comm.rank())] = e.what();
                        }
                      }),
            "");
  EXPECT_EQ(errors[0], errors[1]);
  EXPECT_NE(errors[0].find(dir.path + "/missing does not exist"), std::string::npos) << errors[0];
}

}  // namespace
}  // namespace tutti
