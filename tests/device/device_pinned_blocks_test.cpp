// PinnedBlocks (the CUDA device's cache of pinned blocks, src/device/cuda/pinned_blocks.hpp) over
// an allocator of the test's own: plain C++, no GPU. The case that matters: close() frees blocks
// while a stream's host function gives a block back on another thread. cudaFreeHost waits for every
// stream of the context, so a free that held the cache's lock while the host function needed it
// would never return (the deadlock on destroying a device after a timeout).
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <future>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

#include "device/cuda/pinned_blocks.hpp"

namespace {

using namespace std::chrono_literals;
using tutti::device::cuda::PinnedBlocks;

// The allocator: malloc and free, every block remembered, with a hook run inside each release.
struct Allocator {
  std::mutex mutex;
  std::set<void*> live;
  std::vector<std::size_t> sizes;
  std::function<void()> inside_release;
  PinnedBlocks blocks{[this](void** block, std::size_t bytes) {
                        // Refused as cudaHostAlloc would (cudaErrorMemoryAllocation's value) without
                        // asking malloc, which sanitizers abort on for such a size.
                        *block = bytes > (std::size_t{1} << 48) ? nullptr : std::malloc(bytes);
                        if (*block == nullptr) return 2;
                        std::lock_guard lock(mutex);
                        live.insert(*block);
                        sizes.push_back(bytes);
                        return 0;
                      },
                      [this](void* block) {
                        if (inside_release) inside_release();
                        std::lock_guard lock(mutex);
                        EXPECT_EQ(live.erase(block), 1u) << "a block freed twice or never made";
                        std::free(block);
                      }};
  ~Allocator() {
    for (void* block : live) std::free(block);
  }
};

TEST(PinnedBlocks, PowerOfTwoBlocksAreReusedOnceGivenBack) {
  Allocator a;
  void* first = nullptr;
  ASSERT_EQ(a.blocks.take(5000, false, first), 0);
  ASSERT_NE(first, nullptr);
  ASSERT_EQ(a.sizes, std::vector<std::size_t>{8192});
  void* second = nullptr;
  ASSERT_EQ(a.blocks.take(10, false, second), 0);  // 4 KiB at least
  ASSERT_EQ(a.sizes, (std::vector<std::size_t>{8192, 4096}));
  EXPECT_TRUE(a.blocks.give_back(first));
  EXPECT_FALSE(a.blocks.give_back(first)) << "given back twice";
  void* again = nullptr;
  ASSERT_EQ(a.blocks.take(8000, true, again), 0);
  EXPECT_EQ(again, first) << "the cached 8 KiB block was not reused";
  EXPECT_EQ(a.sizes.size(), 2u);
  int unknown = 0;
  EXPECT_FALSE(a.blocks.give_back(&unknown));
}

TEST(PinnedBlocks, AllocatorRefusalIsReturned) {
  Allocator a;
  void* block = &a;
  EXPECT_EQ(a.blocks.take((std::size_t{1} << 63) | 1, false, block),
            2);  // past any power of two: the allocator refuses
  EXPECT_EQ(block, nullptr);
}

TEST(PinnedBlocks, CloseFreesAllButTransientBlocksStillOut) {
  Allocator a;
  void *cached = nullptr, *held = nullptr, *transient = nullptr;
  ASSERT_EQ(a.blocks.take(4096, false, cached), 0);
  ASSERT_EQ(a.blocks.take(4096, false, held), 0);
  ASSERT_EQ(a.blocks.take(4096, true, transient), 0);
  ASSERT_TRUE(a.blocks.give_back(cached));
  a.blocks.close();
  EXPECT_EQ(a.live, std::set<void*>{transient}) << "close frees the cached and the held block, not the transient one";
  // A host function that runs after the device went: the block is forgotten, neither cached nor freed.
  EXPECT_TRUE(a.blocks.give_back(transient));
  EXPECT_EQ(a.live.size(), 1u);
}

// close() frees with the lock released: a host function giving a block back on another thread,
// which the free waits for (as cudaFreeHost waits for the stream running it), completes.
TEST(PinnedBlocks, CloseDoesNotHoldTheLockAcrossAFree) {
  Allocator a;
  void *cached = nullptr, *transient = nullptr;
  ASSERT_EQ(a.blocks.take(4096, false, cached), 0);
  ASSERT_EQ(a.blocks.take(1 << 20, true, transient), 0);
  ASSERT_TRUE(a.blocks.give_back(cached));
  bool given_back = false, completed = false;
  std::thread host_function;
  a.inside_release = [&] {
    if (host_function.joinable()) return;
    std::promise<bool> done;
    std::future<bool> result = done.get_future();
    host_function =
        std::thread([&, done = std::move(done)]() mutable { done.set_value(a.blocks.give_back(transient)); });
    // A lock held across this free would keep the host function waiting: bounded, so that the
    // old behaviour fails the case instead of hanging it.
    completed = result.wait_for(5s) == std::future_status::ready;
    if (completed) given_back = result.get();
  };
  a.blocks.close();
  ASSERT_TRUE(host_function.joinable());
  host_function.join();
  EXPECT_TRUE(completed) << "the host function's give_back waited for close()'s free: a lock held across it";
  EXPECT_TRUE(given_back);
  EXPECT_EQ(a.live, std::set<void*>{transient});
}

}  // namespace
