// MemoryRanges (src/device/memory_ranges.hpp): the ranges the CUDA device answers pointer
// questions from without asking CUDA. Plain C++, no GPU: made-up addresses, never dereferenced.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include "device/memory_ranges.hpp"

namespace {

using tutti::device::MemoryRanges;
using RangeKind = MemoryRanges::Kind;

const void* at(std::uintptr_t a) { return reinterpret_cast<const void*>(a); }

// The kind and stream address of `a`, or "unknown".
std::string looked_up(const MemoryRanges& ranges, std::uintptr_t a) {
  const auto found = ranges.find(at(a));
  if (!found) return "unknown";
  return std::string(found->kind == RangeKind::device ? "device " : "pinned ") + std::to_string(found->device_address);
}

TEST(MemoryRanges, FindsTheRangeAnAddressLiesIn) {
  MemoryRanges ranges;
  EXPECT_EQ(looked_up(ranges, 0x1000), "unknown");
  ranges.add(at(0x1000), 0x1000, RangeKind::device, at(0x1000));
  ranges.add(at(0x3000), 0x100, RangeKind::pinned, at(0x9000));  // mapped elsewhere for streams
  EXPECT_EQ(looked_up(ranges, 0xfff), "unknown");
  EXPECT_EQ(looked_up(ranges, 0x1000), "device " + std::to_string(0x1000));
  EXPECT_EQ(looked_up(ranges, 0x1fff), "device " + std::to_string(0x1fff));
  EXPECT_EQ(looked_up(ranges, 0x2000), "unknown");  // one past the end
  EXPECT_EQ(looked_up(ranges, 0x3000), "pinned " + std::to_string(0x9000));
  EXPECT_EQ(looked_up(ranges, 0x30ff), "pinned " + std::to_string(0x90ff));
  EXPECT_EQ(looked_up(ranges, 0x3100), "unknown");
  ranges.add(at(0x5000), 0, RangeKind::device, at(0x5000));  // nothing
  EXPECT_EQ(looked_up(ranges, 0x5000), "unknown");
}

TEST(MemoryRanges, RemoveForgetsOnlyTheRangeStartingThere) {
  MemoryRanges ranges;
  ranges.add(at(0x1000), 0x1000, RangeKind::device, at(0x1000));
  ranges.add(at(0x2000), 0x1000, RangeKind::pinned, at(0x2000));
  ranges.remove(at(0x1800));  // inside, not a start: nothing
  EXPECT_EQ(looked_up(ranges, 0x1800), "device " + std::to_string(0x1800));
  ranges.remove(at(0x1000));
  EXPECT_EQ(looked_up(ranges, 0x1800), "unknown");
  EXPECT_EQ(looked_up(ranges, 0x2000), "pinned " + std::to_string(0x2000));
  ranges.clear();
  EXPECT_EQ(looked_up(ranges, 0x2000), "unknown");
}

// Memory freed without the object hearing of it, its addresses made again: the new range replaces
// every stale one it overlaps, and no stale answer is left inside or around it.
TEST(MemoryRanges, ANewRangeReplacesTheStaleOnesItOverlaps) {
  MemoryRanges ranges;
  ranges.add(at(0x1000), 0x1000, RangeKind::device, at(0x1000));
  ranges.add(at(0x2000), 0x1000, RangeKind::device, at(0x2000));
  ranges.add(at(0x3000), 0x1000, RangeKind::device, at(0x3000));
  ranges.add(at(0x1800), 0x1000, RangeKind::pinned, at(0x7800));  // over the end of one, the start of the next
  EXPECT_EQ(looked_up(ranges, 0x1000), "unknown");
  EXPECT_EQ(looked_up(ranges, 0x1800), "pinned " + std::to_string(0x7800));
  EXPECT_EQ(looked_up(ranges, 0x27ff), "pinned " + std::to_string(0x87ff));
  EXPECT_EQ(looked_up(ranges, 0x2800), "unknown");                           // the rest of the stale 0x2000 range
  EXPECT_EQ(looked_up(ranges, 0x3000), "device " + std::to_string(0x3000));  // untouched
}

TEST(MemoryRanges, ConcurrentAddsRemovesAndLookups) {
  MemoryRanges ranges;
  std::vector<std::thread> threads;
  for (std::uintptr_t t = 0; t < 4; ++t)
    threads.emplace_back([&, t] {
      const std::uintptr_t base = 0x100000 * (t + 1);
      for (int i = 0; i < 2000; ++i) {
        ranges.add(at(base), 0x1000, RangeKind::device, at(base));
        const auto found = ranges.find(at(base + 0x10));
        ASSERT_TRUE(found && found->device_address == base + 0x10);
        ranges.remove(at(base));
        ASSERT_FALSE(ranges.find(at(base + 0x10)));
      }
    });
  for (auto& thread : threads) thread.join();
}

}  // namespace
