// The pinned staging pool (src/device/staging_pool.hpp) that host_transfer and the engine's device
// tensors share, on the emulated device: reuse only once the stream released a buffer, smallest
// fit, replacement of a free buffer too small, chaining at the cap (the stream waits, the host
// does not), retire, cancel, and the user's drop hook. Streams are held by flags, every wait has a
// deadline: no case asserts a time.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <vector>

#include "device/emulated.hpp"
#include "device/staging_pool.hpp"

namespace device_staging_pool_test {

using tutti::device::Device;
using tutti::device::EmulatedDevice;
using tutti::device::StagingPool;
using tutti::device::Stream;
using namespace std::chrono_literals;

constexpr auto long_wait = 20s;  // only a hang reaches it

std::uint32_t released(const StagingPool::Buffer& b) { return Device::load_flag(b.line(0)); }

TEST(StagingPool, ABufferIsReusedOnlyOnceItsStreamReleasedIt) {
  EmulatedDevice device;
  const Stream s = device.create_stream();
  StagingPool pool(device, 3);
  auto* gate = static_cast<std::uint32_t*>(device.allocate_pinned(4));

  const auto first = pool.take(1000, 7, s);
  ASSERT_NE(first.buffer, nullptr);
  EXPECT_FALSE(first.chained);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(first.buffer->data()) % 256, 0u) << "data 256-byte aligned";
  EXPECT_GE(first.buffer->capacity, 1000u);
  EXPECT_EQ(released(*first.buffer), 6u) << "released starts just below the ticket";
  EXPECT_FALSE(pool.is_free(*first.buffer));
  device.wait_value(gate, 1, s);
  pool.release(*first.buffer, s);

  // Held: the next use gets a buffer of its own.
  const auto second = pool.take(500, 8, s);
  EXPECT_NE(second.buffer, first.buffer) << "a buffer its stream has not released was reused";
  pool.release(*second.buffer, s);
  device.set_flag(gate, 1);
  device.synchronize(s, long_wait);
  EXPECT_EQ(released(*first.buffer), 7u);
  EXPECT_TRUE(pool.is_free(*first.buffer));

  // Both free: the smallest that fits.
  const StagingPool::Buffer* smaller = first.buffer->capacity <= second.buffer->capacity ? first.buffer : second.buffer;
  const auto third = pool.take(100, 9, s);
  EXPECT_EQ(third.buffer, smaller);
  EXPECT_EQ(pool.buffers().size(), 2u);
  pool.release(*third.buffer, s);
  device.synchronize(s, long_wait);
  device.destroy_stream(s);
}

TEST(StagingPool, AFreeBufferTooSmallIsReplacedAndItsUserDropped) {
  EmulatedDevice device;
  const Stream s = device.create_stream();
  StagingPool pool(device, 1);
  const auto small = pool.take(4096, 1, s);
  int dropped = 0;
  small.buffer->on_drop = [&] { ++dropped; };
  pool.release(*small.buffer, s);
  device.synchronize(s, long_wait);
  const auto big = pool.take(1 << 20, 2, s);
  EXPECT_EQ(pool.buffers().size(), 1u) << "the free buffer too small was not replaced";
  EXPECT_GE(big.buffer->capacity, std::size_t{1} << 20);
  EXPECT_EQ(dropped, 1) << "the replaced buffer's user was not told";
  std::vector<std::byte> data(1 << 20, std::byte{5});
  std::memcpy(big.buffer->data(), data.data(), data.size());  // the whole capacity is usable
  pool.release(*big.buffer, s);
  device.synchronize(s, long_wait);
  device.destroy_stream(s);
}

// At the cap, a use that may chain takes the least recently used buffer that fits and its stream
// waits for that buffer's release; the host call returns at once. One that may not chain grows the
// pool instead.
TEST(StagingPool, AtTheCapTheStreamWaitsNotTheHost) {
  EmulatedDevice device;
  const Stream held = device.create_stream(), other = device.create_stream();
  StagingPool pool(device, 1, 2);
  auto* gate = static_cast<std::uint32_t*>(device.allocate_pinned(4));
  auto* mark = static_cast<std::uint32_t*>(device.allocate_pinned(4));
  device.wait_value(gate, 1, held);
  const auto a = pool.take(4096, 1, held);
  pool.release(*a.buffer, held);
  const auto b = pool.take(4096, 2, held);
  pool.release(*b.buffer, held);

  const auto c = pool.take(4096, 3, other, true);  // returns: the host does not wait
  EXPECT_TRUE(c.chained);
  EXPECT_EQ(c.buffer, a.buffer) << "not the least recently used";
  EXPECT_EQ(released(*a.buffer), 0u) << "a chained buffer's released word must stay its earlier use's";
  device.write_value(mark, 1, other);
  pool.release(*c.buffer, other);
  EXPECT_ANY_THROW(device.synchronize(other, 200ms)) << "the chained stream ran before the buffer was released";
  EXPECT_EQ(Device::load_flag(mark), 0u);

  const auto d = pool.take(4096, 4, other, false);  // may not chain: grows past the cap
  EXPECT_FALSE(d.chained);
  EXPECT_EQ(pool.buffers().size(), 3u);
  pool.release(*d.buffer, other);

  device.set_flag(gate, 1);
  device.synchronize(other, long_wait);
  EXPECT_EQ(Device::load_flag(mark), 1u);
  EXPECT_EQ(released(*a.buffer), 3u);
  device.destroy_stream(held);
  device.destroy_stream(other);
}

TEST(StagingPool, RetiredNeverReusedCancelledFreeAgain) {
  EmulatedDevice device;
  const Stream s = device.create_stream();
  StagingPool pool(device, 1, 1);
  const auto a = pool.take(4096, 1, s);
  StagingPool::retire(*a.buffer);
  EXPECT_FALSE(pool.is_free(*a.buffer));
  const auto b = pool.take(4096, 2, s, true);  // the only buffer is retired: never chained onto
  EXPECT_NE(b.buffer, a.buffer);
  EXPECT_FALSE(b.chained);
  pool.cancel(b);  // not enqueued at all: free again
  EXPECT_TRUE(pool.is_free(*b.buffer));
  const auto c = pool.take(4096, 2, s);
  EXPECT_EQ(c.buffer, b.buffer);
  pool.release(*c.buffer, s);
  device.synchronize(s, long_wait);
  EXPECT_TRUE(pool.is_free(*c.buffer));
  device.destroy_stream(s);
}

}  // namespace device_staging_pool_test
