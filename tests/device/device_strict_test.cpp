// The strict mode of the emulated device (device/emulated_context.hpp): hardware queues shared
// round-robin with head-of-line blocking, one context per ordinal shared by devices, implicit
// waits that name the call that would hang, quarantined freed memory, sticky faults, destroyed
// streams that keep held waits pending. Every case uses an ordinal of its own (a context of its
// own) and bounds every wait: a stream that must stay blocked is checked with a short synchronize
// that must time out, never with a timing of work that runs.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "device/emulated.hpp"
#include "test_waits.hpp"

namespace device_strict_test {

using tutti::DataType;
using tutti::Error;
using tutti::ErrorCode;
using tutti::ReduceOp;
using tutti::device::Device;
using tutti::device::EmulatedDevice;
using tutti::device::Stream;
using tutti::device::detail::StrictSettings;
using tutti::testing::error_code_of;
using namespace std::chrono_literals;

constexpr auto long_wait = 20s;     // for work that should take microseconds; only a hang reaches it
constexpr auto short_wait = 300ms;  // a stream that must stay blocked: synchronize must time out

StrictSettings settings(int queues, std::chrono::milliseconds hold_limit = 0ms) {
  StrictSettings s;
  s.queues = queues;
  s.hold_limit = hold_limit;
  return s;
}

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

// The message of the timeout a blocked stream's synchronize raises ("" if it was not blocked).
std::string blocked(Device& device, Stream s) {
  std::string message;
  try {
    device.synchronize(s, short_wait);
  } catch (const Error& e) {
    if (e.code() == ErrorCode::timeout) message = e.what();
  }
  return message;
}

std::uint32_t* flag_of(Device& device) { return static_cast<std::uint32_t*>(device.allocate_pinned(4)); }

TEST(EmulatedStrict, OptInAndNamed) {
  EXPECT_FALSE(EmulatedDevice().strict());
  EmulatedDevice strict(settings(8), 101);
  EXPECT_TRUE(strict.strict());
  EXPECT_EQ(strict.name(), "emulated (strict)");
}

// make_device reads TUTTI_EMULATED_STRICT; the settings read CUDA_DEVICE_MAX_CONNECTIONS. A
// malformed value is refused by name. (No other thread runs here: setenv is safe.)
TEST(EmulatedStrict, FromTheEnvironment) {
  const char* before = std::getenv("TUTTI_EMULATED_STRICT");
  const std::string saved = before ? before : "";
  ::setenv("TUTTI_EMULATED_STRICT", "1", 1);
  EXPECT_EQ(tutti::device::make_device(tutti::device::Kind::emulated, 110)->name(), "emulated (strict)");
  ::setenv("TUTTI_EMULATED_STRICT", "0", 1);
  EXPECT_EQ(tutti::device::make_device(tutti::device::Kind::emulated, 110)->name(), "emulated");
  ::setenv("TUTTI_EMULATED_STRICT", "yes", 1);
  std::string message;
  EXPECT_EQ(error_code_of([&] { tutti::device::make_device(tutti::device::Kind::emulated); }, &message),
            ErrorCode::invalid_argument);
  EXPECT_TRUE(contains(message, "TUTTI_EMULATED_STRICT")) << message;
  if (before)
    ::setenv("TUTTI_EMULATED_STRICT", saved.c_str(), 1);
  else
    ::unsetenv("TUTTI_EMULATED_STRICT");
  const char* connections = std::getenv("CUDA_DEVICE_MAX_CONNECTIONS");
  const std::string saved_connections = connections ? connections : "";
  ::setenv("CUDA_DEVICE_MAX_CONNECTIONS", "3", 1);
  EXPECT_EQ(StrictSettings::from_env().queues, 3);
  ::setenv("CUDA_DEVICE_MAX_CONNECTIONS", "33", 1);
  EXPECT_EQ(error_code_of([] { StrictSettings::from_env(); }, &message), ErrorCode::invalid_argument);
  EXPECT_TRUE(contains(message, "CUDA_DEVICE_MAX_CONNECTIONS")) << message;
  if (connections)
    ::setenv("CUDA_DEVICE_MAX_CONNECTIONS", saved_connections.c_str(), 1);
  else
    ::unsetenv("CUDA_DEVICE_MAX_CONNECTIONS");
}

// Streams take the queues round-robin: with 2 queues, streams 0 and 2 share queue 0. A held wait
// on stream 0 holds the work enqueued after it on stream 2, not stream 1's, and not stream 2's
// work enqueued before it (submission order).
TEST(EmulatedStrict, AHeldWaitBlocksTheStreamsBehindItInItsQueue) {
  EmulatedDevice device(settings(2), 102);
  std::uint32_t* gate = flag_of(device);
  std::uint32_t* marks = static_cast<std::uint32_t*>(device.allocate_pinned(16));
  const Stream s0 = device.create_stream(), s1 = device.create_stream(), s2 = device.create_stream();
  device.write_value(marks + 0, 1, s2);  // before the wait: runs
  device.synchronize(s2, long_wait);
  device.wait_value(gate, 1, s0);
  device.write_value(marks + 1, 1, s2);  // behind the held wait in queue 0
  device.write_value(marks + 2, 1, s1);  // queue 1: free
  device.synchronize(s1, long_wait);
  EXPECT_EQ(Device::load_flag(marks + 2), 1u);
  const std::string message = blocked(device, s2);
  EXPECT_TRUE(contains(message, "stream 0 (hardware queue 0 of 2)")) << message;
  EXPECT_TRUE(contains(message, "wait_value")) << message;
  EXPECT_EQ(Device::load_flag(marks + 1), 0u) << "stream 2 ran past the held wait of stream 0";
  device.set_flag(gate, 1);
  device.synchronize(s2, long_wait);
  EXPECT_EQ(Device::load_flag(marks + 1), 1u);
  for (Stream s : {s0, s1, s2}) device.destroy_stream(s);
}

// Two devices of one ordinal share the context (ranks as threads on one GPU); another ordinal
// has a context of its own.
TEST(EmulatedStrict, DevicesOfOneOrdinalShareTheQueues) {
  EmulatedDevice rank0(settings(1), 103), rank1(settings(1), 103), elsewhere(settings(1), 104);
  EXPECT_EQ(rank0.context(), rank1.context());
  EXPECT_NE(rank0.context(), elsewhere.context());
  std::uint32_t* gate = flag_of(rank0);
  std::uint32_t* mark = flag_of(rank1);
  const Stream held = rank0.create_stream(), other = rank1.create_stream(), apart = elsewhere.create_stream();
  rank0.wait_value(gate, 1, held);
  rank1.write_value(mark, 1, other);
  elsewhere.write_value(mark, 2, apart);
  elsewhere.synchronize(apart, long_wait);
  EXPECT_EQ(Device::load_flag(mark), 2u);
  EXPECT_TRUE(contains(blocked(rank1, other), "stream 0")) << "rank 1's stream ran past rank 0's held wait";
  rank0.set_flag(gate, 1);
  rank1.synchronize(other, long_wait);
  EXPECT_EQ(Device::load_flag(mark), 1u);
  rank0.destroy_stream(held);
  rank1.destroy_stream(other);
  elsewhere.destroy_stream(apart);
}

// cudaHostUnregister, cudaFree (of IPC-shared memory) and cudaIpcCloseMemHandle wait for every
// stream of the context: behind a held stream (of another device of the context) the strict mode
// raises, naming the call; behind work that runs they wait for it and return.
TEST(EmulatedStrict, ImplicitWaitsNameTheCallThatWouldHang) {
  EmulatedDevice rank0(settings(8), 105), rank1(settings(8), 105);
  std::uint32_t* gate = flag_of(rank0);
  const Stream held = rank0.create_stream();
  tutti::device::IpcHandle handle;
  void* shared = rank1.allocate_shared(4096, handle);
  std::vector<std::uint8_t> host(4096, 7);
  rank1.register_pinned(host.data(), host.size());
  rank0.wait_value(gate, 1, held);
  std::string message;
  EXPECT_EQ(error_code_of([&] { rank1.unregister_pinned(host.data()); }, &message), ErrorCode::timeout);
  EXPECT_TRUE(contains(message, "unregister_pinned: cudaHostUnregister")) << message;
  EXPECT_TRUE(contains(message, "would hang")) << message;
  EXPECT_TRUE(contains(message, "stream 0 (hardware queue 0 of 8) has been held")) << message;
  EXPECT_EQ(error_code_of([&] { rank1.free(shared); }, &message), ErrorCode::timeout);
  EXPECT_TRUE(contains(message, "cudaFree")) << message;
  rank0.set_flag(gate, 1);
  rank0.synchronize(held, long_wait);
  // Work that runs (not held) is waited for.
  const Stream busy = rank1.create_stream();
  void* d = rank1.allocate(host.size());
  for (int i = 0; i < 8; ++i) rank1.copy(d, host.data(), host.size(), busy);
  rank1.unregister_pinned(host.data());
  rank1.free(shared);
  rank1.free(d);
  rank0.destroy_stream(held);
  rank1.destroy_stream(busy);
}

// The hold limit: a held stream released within it lets the call through, as on CUDA.
TEST(EmulatedStrict, AWaitReleasedWithinTheHoldLimitPasses) {
  EmulatedDevice device(settings(8, 10s), 106);
  std::uint32_t* gate = flag_of(device);
  const Stream held = device.create_stream();
  device.wait_value(gate, 1, held);
  std::thread releaser([&] {
    std::this_thread::sleep_for(50ms);
    device.set_flag(gate, 1);
  });
  device.unregister_pinned(gate);  // waits for the release
  releaser.join();
  EXPECT_EQ(Device::load_flag(gate), 1u);
  device.destroy_stream(held);
}

// Memory freed while a stream still uses it: the range is poisoned and quarantined, the stream's
// work that touches it faults, and the fault is sticky for every device of the context.
TEST(EmulatedStrict, UseAfterFreeFaultsAndTheFaultIsSticky) {
  EmulatedDevice device(settings(8), 107), other(settings(8), 107);
  std::uint32_t* gate = flag_of(device);
  const Stream s = device.create_stream();
  auto* buffer = static_cast<std::uint8_t*>(device.allocate(1024));
  std::vector<std::uint8_t> host(1024, 1);
  device.wait_value(gate, 1, s);
  device.copy(buffer, host.data(), host.size(), s);  // runs after the free below
  device.free(buffer);                               // the CUDA device's free does not wait
  EXPECT_EQ(buffer[0], 0xDB) << "freed memory is poisoned";
  device.set_flag(gate, 1);
  std::string message;
  EXPECT_EQ(error_code_of([&] { device.synchronize(s, long_wait); }, &message), ErrorCode::system);
  EXPECT_TRUE(contains(message, "touches memory freed by free")) << message;
  EXPECT_TRUE(contains(message, "sticky")) << message;
  std::string later;
  void* d = nullptr;
  EXPECT_EQ(error_code_of([&] { d = other.allocate(64); }, &later), ErrorCode::system);
  EXPECT_TRUE(contains(later, "touches memory freed by free")) << later;
  EXPECT_EQ(error_code_of([&] { other.create_stream(); }), ErrorCode::system);
  EXPECT_EQ(error_code_of([&] { device.write_value(gate, 2, s); }), ErrorCode::system);
  EXPECT_EQ(d, nullptr);
  device.destroy_stream(s);
}

// A reduction into freed pinned memory (free_pinned keeps no wait, as the CUDA device's cache).
TEST(EmulatedStrict, FreedPinnedMemoryIsQuarantined) {
  EmulatedDevice device(settings(8), 108);
  std::uint32_t* gate = flag_of(device);
  std::uint32_t* flag = flag_of(device);
  const Stream s = device.create_stream();
  device.wait_value(gate, 1, s);
  device.write_value(flag, 5, s);
  device.free_pinned(flag);
  device.set_flag(gate, 1);
  std::string message;
  EXPECT_EQ(error_code_of([&] { device.synchronize(s, long_wait); }, &message), ErrorCode::system);
  EXPECT_TRUE(contains(message, "write_value")) << message;
  EXPECT_TRUE(contains(message, "free_pinned")) << message;
  device.destroy_stream(s);
}

// Destroying a held stream keeps its work pending (the queue stays blocked behind it) and says
// so; writing the flag later lets it and the streams behind it through. Destroying the device
// with a held stream reports it too (the context's reports), and returns.
TEST(EmulatedStrict, DestroyingAHeldStreamKeepsItPendingAndSaysSo) {
  EmulatedDevice device(settings(1), 109), keeper(settings(1), 109);
  std::uint32_t* gate = flag_of(keeper);
  std::uint32_t* mark = flag_of(keeper);
  const Stream held = device.create_stream(), behind = keeper.create_stream();
  device.wait_value(gate, 1, held);
  device.write_value(mark, 1, held);
  keeper.write_value(mark + 0, 1, behind);
  std::string message;
  ASSERT_TRUE(tutti::testing::eventually([&] { return !blocked(keeper, behind).empty(); }, long_wait));
  EXPECT_EQ(error_code_of([&] { device.destroy_stream(held); }, &message), ErrorCode::invalid_argument);
  EXPECT_TRUE(contains(message, "destroyed with waits pending")) << message;
  EXPECT_EQ(error_code_of([&] { device.copy(mark, mark + 1, 0, held); }), ErrorCode::invalid_argument)
      << "a destroyed stream";
  EXPECT_FALSE(blocked(keeper, behind).empty()) << "destroying the stream released its wait";
  keeper.set_flag(gate, 1);
  keeper.synchronize(behind, long_wait);
  EXPECT_EQ(Device::load_flag(mark), 1u);

  std::uint32_t* never = flag_of(keeper);
  {
    EmulatedDevice doomed(settings(1), 109);
    doomed.wait_value(never, 1, doomed.create_stream());
  }
  const auto reports = keeper.context()->reports();
  bool named = false;
  for (const auto& r : reports) named = named || contains(r, "destroying the device");
  EXPECT_TRUE(named) << "destroying a device with a held stream was not reported";
  keeper.set_flag(never, 1);
  keeper.destroy_stream(behind);
}

// A copy from pageable host memory reads it at the call, as the CUDA device's pinned bounce
// blocks do; registered memory is read when the stream gets there. A copy to pageable memory is
// written by a host function once the stream gets there, chunk by chunk.
TEST(EmulatedStrict, PageableMemoryIsReadAtTheCallAndWrittenByAHostFunction) {
  EmulatedDevice device(settings(2), 111);
  std::uint32_t* gate = flag_of(device);
  const Stream s = device.create_stream();
  constexpr std::size_t bytes = (std::size_t{5} << 20) / 2;  // 2.5 chunks
  auto* d = static_cast<std::uint8_t*>(device.allocate(bytes));
  std::vector<std::uint8_t> pageable(bytes, 1), registered(bytes, 2), back(bytes, 0);
  device.register_pinned(registered.data(), registered.size());
  device.wait_value(gate, 1, s);
  device.copy(d, pageable.data(), bytes, s);
  std::fill(pageable.begin(), pageable.end(), 9);  // after the call: not seen
  device.copy(back.data(), d, bytes, s);
  EXPECT_FALSE(blocked(device, s).empty());
  EXPECT_EQ(back[0], 0) << "the copy to pageable memory ran past the held wait";
  device.set_flag(gate, 1);
  device.synchronize(s, long_wait);
  EXPECT_EQ(std::count(back.begin(), back.end(), 1), static_cast<std::ptrdiff_t>(bytes));

  device.wait_value(gate, 2, s);
  device.copy(d, registered.data(), bytes, s);
  std::fill(registered.begin(), registered.end(), 3);  // before the stream gets there: seen
  device.copy(back.data(), d, bytes, s);
  device.set_flag(gate, 2);
  device.synchronize(s, long_wait);
  EXPECT_EQ(std::count(back.begin(), back.end(), 3), static_cast<std::ptrdiff_t>(bytes));
  device.unregister_pinned(registered.data());
  device.free(d);
  device.destroy_stream(s);
}

// Host functions run on one thread of the context, one at a time: one that has not returned
// holds another stream's (on another queue), and its own queue while it runs.
TEST(EmulatedStrict, HostFunctionsRunOneAtATime) {
  EmulatedDevice device(settings(2), 112);
  const Stream s0 = device.create_stream(), s1 = device.create_stream(), s2 = device.create_stream();
  auto strict = [](Stream s) {
    return static_cast<tutti::device::detail::StrictStream*>(
        static_cast<tutti::device::detail::EmulatedStream*>(s.handle));
  };
  std::atomic<bool> release{false}, first_ran{false}, second_ran{false};
  std::uint32_t* mark = flag_of(device);
  strict(s0)->enqueue_host_function(
      [&] {
        first_ran = true;
        tutti::testing::eventually([&] { return release.load(); }, long_wait);
      },
      "the first host function");
  device.write_value(mark, 1, s2);  // queue 0, behind the first host function
  ASSERT_TRUE(tutti::testing::eventually([&] { return first_ran.load(); }, long_wait));
  strict(s1)->enqueue_host_function([&] { second_ran = true; }, "the second host function");
  const std::string message = blocked(device, s1);
  EXPECT_TRUE(contains(message, "the second host function")) << message;
  EXPECT_FALSE(second_ran) << "two host functions ran at once";
  EXPECT_TRUE(contains(blocked(device, s2), "the first host function")) << "a host function did not hold its queue";
  EXPECT_EQ(Device::load_flag(mark), 0u);
  release = true;
  for (Stream s : {s0, s1, s2}) device.synchronize(s, long_wait);
  EXPECT_TRUE(second_ran);
  EXPECT_EQ(Device::load_flag(mark), 1u);
  for (Stream s : {s0, s1, s2}) device.destroy_stream(s);
}

}  // namespace device_strict_test
