// elastic::Job::rebuild with ranks as threads of this process, over an in-memory store: a member
// of the new generation that dies between the rendezvous and the new communicator (here: its store
// fails it there) leaves the others' tutti::init waiting for it; they meet again in the next
// generation without it, rather than end the job.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "memory_store.hpp"
#include "threads.hpp"
#include "tutti/elastic.hpp"

namespace {

using tutti::Error;
using tutti::ErrorCode;
using namespace std::chrono_literals;

// The shared store, as one rank sees it: once `dies_at` is in a key, the rank's next use of the
// store ends it (an error no elastic wait catches), as if its process died there.
class Dying final : public tutti::KeyValueStore {
 public:
  Dying(tutti::KeyValueStore& store, std::string dies_at) : store_(store), dies_at_(std::move(dies_at)) {}
  void set(const std::string& key, const std::string& value) override {
    check(key);
    store_.set(key, value);
  }
  std::string get(const std::string& key, std::chrono::milliseconds timeout) override {
    check(key);
    return store_.get(key, timeout);
  }
  std::int64_t add(const std::string& key, std::int64_t delta) override {
    check(key);
    return store_.add(key, delta);
  }

 private:
  void check(const std::string& key) const {
    if (!dies_at_.empty() && key.find(dies_at_) != std::string::npos)
      throw Error(ErrorCode::system, "test: this rank dies at " + key);
  }
  tutti::KeyValueStore& store_;
  std::string dies_at_;
};

TEST(ElasticRebuild, AMemberThatDiesBeforeTheNewCommunicatorIsLeftOutOfTheNextGeneration) {
  tutti::testing::MemoryStore store;
  tutti::elastic::Options options;
  options.timeout = 1500ms;
  std::vector<int> sizes(3, 0), generations(3, -1);
  const auto start = std::chrono::steady_clock::now();
  const std::string failures = tutti::testing::on_threads(3, [&](int rank) {
    Dying mine(store, rank == 2 ? "/g1/world/" : "");
    tutti::elastic::Job job(mine, rank, 3, options);
    std::vector<std::int32_t> v(16, 1);
    job.communicator().allreduce(std::span<std::int32_t>(v), tutti::ReduceOp::sum);
    for (auto x : v) ASSERT_EQ(x, 3);
    if (rank == 2) {  // comes to generation 1's rendezvous, then dies before its communicator
      try {
        job.rebuild("test: generation 0 failed");
        ADD_FAILURE() << "rank 2 built generation 1";
      } catch (const Error& e) {
        EXPECT_EQ(e.code(), ErrorCode::system) << e.what();
      }
      return;
    }
    job.rebuild("test: generation 0 failed");
    generations[static_cast<std::size_t>(rank)] = job.generation();
    sizes[static_cast<std::size_t>(rank)] = job.communicator().size();
    EXPECT_EQ(job.members().size(), 2u);
    EXPECT_EQ(job.communicator().rank(), rank);
    std::vector<std::int32_t> w(16, rank + 1);
    job.communicator().allreduce(std::span<std::int32_t>(w), tutti::ReduceOp::sum);
    for (auto x : w) ASSERT_EQ(x, 3);
  });
  EXPECT_EQ(failures, "");
  for (int r : {0, 1}) {
    EXPECT_EQ(generations[static_cast<std::size_t>(r)], 2) << "rank " << r;
    EXPECT_EQ(sizes[static_cast<std::size_t>(r)], 2) << "rank " << r;
  }
  // Generation 1's init waits out the timeout for rank 2, generation 2's rendezvous too.
  EXPECT_LT(std::chrono::steady_clock::now() - start, 20s);
}

}  // namespace
