// The offload pool on the emulated device: the budget, contents across swaps, prefetch, errors.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "tutti/offload.hpp"

namespace {

using tutti::Error;
using tutti::ErrorCode;
using tutti::offload::Access;
using tutti::offload::Block;
using tutti::offload::Options;
using tutti::offload::Pool;

Options emulated(bool swap = true) {
  Options options;
  options.swap = swap;
  options.device = tutti::gpu::DeviceKind::emulated;
  options.timeout = std::chrono::milliseconds(20000);
  return options;
}

// A block filled with a pattern that depends on the block's number and every byte's position.
Block filled(Pool& pool, std::size_t bytes, std::uint32_t seed) {
  const Block block = pool.allocate(bytes);
  auto* p = static_cast<unsigned char*>(pool.data(block));
  for (std::size_t i = 0; i < bytes; ++i) p[i] = static_cast<unsigned char>((i * 131 + seed * 7919 + (i >> 8)) & 0xff);
  pool.release(block);
  return block;
}

// Acquires the block and checks every byte against the pattern `filled` wrote.
void expect_pattern(Pool& pool, Block block, std::uint32_t seed) {
  const std::size_t bytes = pool.size(block);
  const auto* p = static_cast<const unsigned char*>(pool.acquire(block, Access::read));
  std::size_t wrong = 0;
  for (std::size_t i = 0; i < bytes; ++i)
    wrong += p[i] != static_cast<unsigned char>((i * 131 + seed * 7919 + (i >> 8)) & 0xff);
  pool.release(block);
  EXPECT_EQ(wrong, 0U) << "block of seed " << seed;
}

std::string message_of(const std::function<void()>& call, ErrorCode expected) {
  try {
    call();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), expected) << e.what();
    return e.what();
  }
  ADD_FAILURE() << "no error raised";
  return {};
}

TEST(Offload, BudgetIsNeverExceededAndContentsSurviveSwaps) {
  constexpr std::size_t block_bytes = 4096;
  Pool pool(3 * block_bytes, emulated());
  std::vector<Block> blocks;
  for (std::uint32_t i = 0; i < 10; ++i) {
    blocks.push_back(filled(pool, block_bytes, i));
    EXPECT_LE(pool.counters().in_use_bytes, pool.budget());
  }
  // Visit them in two orders, each visit evicting another block.
  for (std::uint32_t i = 0; i < 10; ++i) expect_pattern(pool, blocks[i], i);
  for (std::uint32_t i = 10; i-- > 0;) expect_pattern(pool, blocks[i], i);
  const auto c = pool.counters();
  EXPECT_EQ(c.peak_bytes, 3 * block_bytes);  // the budget, exactly
  EXPECT_GT(c.swap_outs, 7U);
  EXPECT_GT(c.swap_ins, 7U);
  EXPECT_EQ(c.swapped_out_bytes, c.swap_outs * block_bytes);
  EXPECT_EQ(c.swapped_in_bytes, c.swap_ins * block_bytes);
  for (Block b : blocks) pool.free(b);
  EXPECT_EQ(pool.counters().in_use_bytes, 0U);
  EXPECT_EQ(pool.counters().host_bytes, 0U);
}

TEST(Offload, OddSizesCountRoundedToTheDeviceAlignment) {
  Pool pool(1024, emulated());
  const Block a = filled(pool, 1, 1);
  const Block b = filled(pool, 257, 2);  // 512 bytes
  EXPECT_EQ(pool.counters().in_use_bytes, 256U + 512U);
  const Block c = filled(pool, 300, 3);  // 512 more: evicts a (least recently used)
  EXPECT_FALSE(pool.resident(a));
  EXPECT_TRUE(pool.resident(b));
  EXPECT_EQ(pool.counters().peak_bytes, 1024U);
  expect_pattern(pool, a, 1);
  expect_pattern(pool, b, 2);
  expect_pattern(pool, c, 3);
  EXPECT_LE(pool.counters().peak_bytes, 1024U);
}

TEST(Offload, AcquireAfterPrefetchDoesNotCopyAgain) {
  constexpr std::size_t block_bytes = 1 << 16;
  Pool pool(2 * block_bytes, emulated());
  const Block a = filled(pool, block_bytes, 1);
  const Block b = filled(pool, block_bytes, 2);
  const Block c = filled(pool, block_bytes, 3);  // evicts a
  ASSERT_FALSE(pool.resident(a));
  const auto before = pool.counters();
  EXPECT_TRUE(pool.prefetch(a));  // evicts b, starts a's copy in
  EXPECT_TRUE(pool.resident(a));
  EXPECT_FALSE(pool.resident(b));
  const auto during = pool.counters();
  EXPECT_EQ(during.swap_ins, before.swap_ins + 1);
  expect_pattern(pool, a, 1);
  const auto after = pool.counters();
  EXPECT_EQ(after.swap_ins, during.swap_ins);  // the acquire used the prefetched copy
  EXPECT_EQ(after.acquire_hits, during.acquire_hits + 1);
  EXPECT_EQ(after.prefetch_hits, during.prefetch_hits + 1);
  EXPECT_TRUE(pool.prefetch(a));  // resident already: nothing to do
  EXPECT_EQ(pool.counters().swap_ins, after.swap_ins);
  expect_pattern(pool, b, 2);
  expect_pattern(pool, c, 3);
}

TEST(Offload, SwapOutStartsEarlyAndEvictionThenCopiesNothing) {
  constexpr std::size_t block_bytes = 8192;
  Pool pool(2 * block_bytes, emulated());
  const Block a = filled(pool, block_bytes, 1);
  const Block b = filled(pool, block_bytes, 2);
  EXPECT_TRUE(pool.swap_out(a));
  EXPECT_TRUE(pool.resident(a));  // the device copy stays until room is needed
  EXPECT_EQ(pool.counters().swap_outs, 1U);
  const Block c = filled(pool, block_bytes, 3);  // evicts a: its host copy is current
  EXPECT_FALSE(pool.resident(a));
  EXPECT_EQ(pool.counters().swap_outs, 1U);
  expect_pattern(pool, a, 1);
  // Read only: a keeps its host copy, so evicting it again copies nothing either.
  const auto outs = pool.counters().swap_outs;
  expect_pattern(pool, b, 2);
  EXPECT_EQ(pool.counters().swap_outs, outs + 1);  // evicted c (its first copy out)
  expect_pattern(pool, c, 3);                      // evicts a: no copy (it was only read)
  EXPECT_EQ(pool.counters().swap_outs, outs + 1);
  // A held block cannot be swapped out.
  pool.acquire(c);
  EXPECT_FALSE(pool.swap_out(c));
  pool.release(c);
}

TEST(Offload, WrittenBlocksAreCopiedOutAgain) {
  Pool pool(512, emulated());
  const Block a = filled(pool, 256, 1);
  const Block b = filled(pool, 256, 2);
  const Block c = filled(pool, 256, 3);                                   // a goes out
  auto* p = static_cast<unsigned char*>(pool.acquire(a, Access::write));  // b goes out
  std::memset(p, 0x5a, 256);
  pool.release(a);
  expect_pattern(pool, b, 2);                                      // c goes out
  p = static_cast<unsigned char*>(pool.acquire(c, Access::read));  // a goes out again: it was written
  pool.release(c);
  p = static_cast<unsigned char*>(pool.acquire(a, Access::read));
  std::size_t wrong = 0;
  for (int i = 0; i < 256; ++i) wrong += p[i] != 0x5a;
  pool.release(a);
  EXPECT_EQ(wrong, 0U);
}

TEST(Offload, OutOfMemoryNamesNeedBudgetInUseAndPinned) {
  Pool pool(1024, emulated());
  const Block a = pool.allocate(512);  // held
  const Block b = pool.allocate(256);  // held
  const std::string what = message_of([&] { pool.allocate(512); }, ErrorCode::system);
  EXPECT_NE(what.find("out of device memory: need 512, budget 1024, in use 768 (768 pinned)"), std::string::npos)
      << what;
  EXPECT_EQ(pool.counters().in_use_bytes, 768U);  // nothing changed
  pool.release(b);
  const Block c = pool.allocate(512);  // b (unheld) goes out; a stays
  EXPECT_FALSE(pool.resident(b));
  EXPECT_TRUE(pool.resident(a));
  // Larger than the whole budget: an error at once, whatever is held.
  message_of([&] { pool.allocate(2048); }, ErrorCode::system);
  // b cannot come back while a and c are held; prefetch says so instead of failing.
  EXPECT_FALSE(pool.prefetch(b));
  message_of([&] { pool.acquire(b); }, ErrorCode::system);
  pool.release(c);
  EXPECT_TRUE(pool.prefetch(b));
  pool.release(a);
}

TEST(Offload, WithoutSwappingTheBudgetIsAHardLimit) {
  Pool pool(1024, emulated(false));
  const Block a = filled(pool, 512, 1);
  const Block b = filled(pool, 512, 2);  // unheld, but swapping is off: nothing can leave
  EXPECT_FALSE(pool.swap_out(a));
  const std::string what = message_of([&] { pool.allocate(256); }, ErrorCode::system);
  EXPECT_NE(what.find("need 256, budget 1024, in use 1024 (0 pinned); swapping is off"), std::string::npos) << what;
  pool.free(a);
  const Block c = pool.allocate(256);  // fits now
  pool.release(c);
  const auto counters = pool.counters();
  EXPECT_EQ(counters.swap_outs, 0U);
  EXPECT_EQ(counters.swap_ins, 0U);
  expect_pattern(pool, b, 2);
}

TEST(Offload, BadArgumentsAreRejected) {
  message_of([] { Pool pool(0, emulated()); }, ErrorCode::invalid_argument);
  Pool pool(1024, emulated());
  message_of([&] { pool.allocate(0); }, ErrorCode::invalid_argument);
  message_of([&] { pool.acquire(Block{42}); }, ErrorCode::invalid_argument);
  const Block a = filled(pool, 64, 1);
  message_of([&] { pool.release(a); }, ErrorCode::invalid_argument);  // not held
  message_of([&] { pool.data(a); }, ErrorCode::invalid_argument);
  pool.free(a);
  message_of([&] { pool.free(a); }, ErrorCode::invalid_argument);  // freed already
  pool.free(Block{});                                              // no-op
}

TEST(Offload, DeviceKindFromTheEnvironment) {
  ::setenv("TUTTI_DEVICE", "nonsense", 1);
  message_of([] { Pool pool(1024); }, ErrorCode::invalid_argument);
  ::setenv("TUTTI_DEVICE", "emulated", 1);
  Pool pool(1024);
  EXPECT_EQ(pool.device_name(), "emulated");
  EXPECT_TRUE(pool.host_addressable());
  ::unsetenv("TUTTI_DEVICE");
}

}  // namespace
