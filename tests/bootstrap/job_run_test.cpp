// The run handshake (bootstrap/run.hpp), with ranks as threads over an in-memory store: every
// rank of a run gets the same fresh prefix, whatever order the ranks start in; a run of a job
// with the same id never reads the keys an earlier run left, even one that died half-way; a
// second process claiming a rank of a running job is refused; failures name the job.
#include <gtest/gtest.h>

#include <chrono>
#include <future>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "bootstrap/run.hpp"
#include "memory_store.hpp"
#include "test_waits.hpp"
#include "tutti/types.hpp"

namespace tutti::bootstrap {
namespace {

using namespace std::chrono_literals;
using testing::error_code_of;

// Joins ranks `ranks` of a job of `size` at once (each a thread), in order, `stagger` apart.
std::vector<std::string> join_all(Store& store, const std::string& job, int size, const std::vector<int>& ranks,
                                  std::chrono::milliseconds stagger = 0ms, std::chrono::milliseconds timeout = 10s) {
  std::vector<std::future<std::string>> joined;
  for (const int rank : ranks) {
    joined.push_back(std::async(std::launch::async, [&, rank] { return join_run(store, job, rank, size, timeout); }));
    std::this_thread::sleep_for(stagger);
  }
  std::vector<std::string> prefixes;
  for (auto& f : joined) prefixes.push_back(f.get());
  return prefixes;
}

void expect_one_run(const std::vector<std::string>& prefixes, const std::string& job) {
  ASSERT_FALSE(prefixes.empty());
  for (const auto& prefix : prefixes) EXPECT_EQ(prefix, prefixes.front());
  const std::string& p = prefixes.front();
  ASSERT_EQ(p.size(), ("tutti/" + job + "/").size() + 17) << p;
  EXPECT_EQ(p.substr(0, 7 + job.size()), "tutti/" + job + "/");
  EXPECT_EQ(p.back(), '/');
  EXPECT_EQ(p.find_first_not_of("0123456789abcdef", 7 + job.size()), p.size() - 1) << p;
}

TEST(JobRun, EveryRankOfARunGetsTheSamePrefix) {
  testing::MemoryStore store;
  expect_one_run(join_all(store, "j", 5, {0, 1, 2, 3, 4}), "j");
}

TEST(JobRun, RanksThatStartBeforeRankZeroAreLetIn) {
  testing::MemoryStore store;
  expect_one_run(join_all(store, "j", 4, {3, 1, 2, 0}, 20ms), "j");
}

TEST(JobRun, EveryRunOfAJobIdHasAPrefixOfItsOwn) {
  testing::MemoryStore store;
  std::set<std::string> runs;
  for (int i = 0; i < 4; ++i) {
    const auto prefixes = join_all(store, "requeued", 3, i % 2 ? std::vector{2, 1, 0} : std::vector{0, 1, 2}, 5ms);
    expect_one_run(prefixes, "requeued");
    runs.insert(prefixes.front());
  }
  EXPECT_EQ(runs.size(), 4u);
}

TEST(JobRun, JobsWithDistinctIdsInOneStoreStayApart) {
  testing::MemoryStore store;
  auto a = std::async(std::launch::async, [&] { return join_all(store, "a", 3, {1, 0, 2}, 5ms); });
  auto b = std::async(std::launch::async, [&] { return join_all(store, "b", 3, {2, 1, 0}, 5ms); });
  expect_one_run(a.get(), "a");
  expect_one_run(b.get(), "b");
}

// Earlier runs that died half-way left tickets that were never welcomed, or welcomes that nobody
// took: the next run starts all the same, in either start order.
TEST(JobRun, ARunAfterRunsThatDiedHalfWay) {
  testing::MemoryStore store;
  EXPECT_EQ(error_code_of([&] { join_run(store, "h", 1, 2, 100ms); }), ErrorCode::timeout);  // rank 0 never came
  EXPECT_EQ(error_code_of([&] { join_run(store, "h", 0, 2, 100ms); }), ErrorCode::timeout);  // rank 1 never came
  expect_one_run(join_all(store, "h", 2, {1, 0}, 20ms), "h");
  EXPECT_EQ(error_code_of([&] { join_run(store, "h", 1, 3, 100ms); }), ErrorCode::timeout);
  expect_one_run(join_all(store, "h", 3, {0, 2, 1}, 20ms), "h");
}

TEST(JobRun, ASecondProcessWithTheSameRankIsRefused) {
  testing::MemoryStore store;
  auto zero = std::async(std::launch::async, [&] { return join_run(store, "d", 0, 3, 10s); });
  const std::string first = join_run(store, "d", 1, 3, 10s);  // in; rank 0 still waits for rank 2
  std::string message;
  EXPECT_EQ(error_code_of([&] { join_run(store, "d", 1, 3, 10s); }, &message), ErrorCode::invalid_argument);
  EXPECT_NE(message.find("rank 1 of job 'd' joined its run twice"), std::string::npos) << message;
  EXPECT_EQ(join_run(store, "d", 2, 3, 10s), first);
  EXPECT_EQ(zero.get(), first);
}

TEST(JobRun, TimeoutsNameTheJobAndTheSideThatWaited) {
  testing::MemoryStore store;
  std::string message;
  EXPECT_EQ(error_code_of([&] { join_run(store, "t", 0, 3, 50ms); }, &message), ErrorCode::timeout);
  EXPECT_NE(message.find("rank 0 of job 't': 0 of the other 2 ranks arrived within 50 ms"), std::string::npos)
      << message;
  EXPECT_EQ(error_code_of([&] { join_run(store, "t", 2, 3, 50ms); }, &message), ErrorCode::timeout);
  EXPECT_NE(message.find("rank 2 of job 't': rank 0 did not let it into the job"), std::string::npos) << message;
}

TEST(JobId, OnlyPlainIdsAreAccepted) {
  for (const std::string& id :
       std::vector<std::string>{"1234", "prterun-node-12@1", "job.7+x:y_z", std::string(128, 'a')})
    EXPECT_NO_THROW(check_job_id(id, "TUTTI_JOB_ID")) << id;
  for (const std::string& id : std::vector<std::string>{"", "a/b", "a b", "../x", "\n", std::string(129, 'a')}) {
    std::string message;
    EXPECT_EQ(error_code_of([&] { check_job_id(id, "TUTTI_JOB_ID"); }, &message), ErrorCode::invalid_argument) << id;
    EXPECT_NE(message.find("TUTTI_JOB_ID"), std::string::npos) << message;
  }
}

}  // namespace
}  // namespace tutti::bootstrap
