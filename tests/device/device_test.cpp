// The device interface (src/device/device.hpp), the same suite on every implementation: built as
// device_test over the emulated device (label emulated) and as device_gpu_test over CUDA (label
// gpu), where every case is skipped, visibly, without a CUDA device. Reductions are checked bit for
// bit against the host kernels (reduce::apply). No case asserts a time: a stream that must be held
// is held by a flag, and every wait on the host has a deadline, so no case can hang.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <ostream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "device/device.hpp"
#include "device/emulated.hpp"
#include "processes.hpp"
#include "reduce/reduce.hpp"
#include "test_waits.hpp"

#if !defined(TUTTI_TEST_DEVICE_CUDA)
#define TUTTI_TEST_DEVICE_CUDA 0
#endif

namespace tutti::device {
inline void PrintTo(Kind kind, std::ostream* os) { *os << to_string(kind); }
}  // namespace tutti::device

namespace {

using tutti::DataType;
using tutti::Error;
using tutti::ErrorCode;
using tutti::ReduceOp;
using tutti::device::Device;
using tutti::device::Event;
using tutti::device::Kind;
using tutti::device::Stream;
using tutti::testing::error_code_of;
using tutti::testing::eventually;
using namespace std::chrono_literals;

constexpr auto deadline = 20s;  // for work that should take microseconds; only a hang reaches it

constexpr DataType all_types[] = {DataType::i8,  DataType::u8,  DataType::i32,  DataType::u32, DataType::i64,
                                  DataType::u64, DataType::f16, DataType::bf16, DataType::f32, DataType::f64};
constexpr ReduceOp all_ops[] = {ReduceOp::sum, ReduceOp::prod, ReduceOp::min, ReduceOp::max, ReduceOp::avg};

class DeviceTest : public ::testing::TestWithParam<Kind> {
 protected:
  void SetUp() override {
    try {
      device_ = tutti::device::make_device(GetParam());
    } catch (const Error& e) {
      if (e.code() == ErrorCode::unsupported) GTEST_SKIP() << "no CUDA device: " << e.what();
      throw;
    }
  }
  void TearDown() override {
    for (const Stream s : streams_) {
      try {
        device_->synchronize(s, deadline);
      } catch (const Error& e) {
        ADD_FAILURE() << "stream not done at the end of the test: " << e.what();
      }
      device_->destroy_stream(s);
    }
    for (const Event e : events_) device_->destroy_event(e);
    for (void* p : device_memory_) device_->free(p);
    for (void* p : pinned_memory_) device_->free_pinned(p);
  }

  bool emulated() const { return GetParam() == Kind::emulated; }

  // Resources the fixture frees after the test.
  Stream stream() { return streams_.emplace_back(device_->create_stream()); }
  Event event() { return events_.emplace_back(device_->create_event()); }
  void* device_buffer(std::size_t bytes) { return device_memory_.emplace_back(device_->allocate(bytes)); }
  void* pinned(std::size_t bytes) { return pinned_memory_.emplace_back(device_->allocate_pinned(bytes)); }
  std::uint32_t* flag() { return static_cast<std::uint32_t*>(pinned(sizeof(std::uint32_t))); }

  void sync(Stream s) { device_->synchronize(s, deadline); }

  // A device buffer holding `bytes`.
  void* upload(const std::vector<std::uint8_t>& bytes, Stream s) {
    void* p = device_buffer(bytes.size());
    device_->copy(p, bytes.data(), bytes.size(), s);
    return p;
  }
  std::vector<std::uint8_t> download(const void* p, std::size_t bytes, Stream s) {
    std::vector<std::uint8_t> host(bytes, 0xee);
    device_->copy(host.data(), p, bytes, s);
    sync(s);
    return host;
  }

  std::unique_ptr<Device> device_;
  std::vector<Stream> streams_;
  std::vector<Event> events_;
  std::vector<void*> device_memory_, pinned_memory_;
};

// Runs `calls` on another thread and reports whether they returned within the deadline: the host
// calls that enqueue work on a held stream must return while it is held. A call that blocked would
// be released at the end of the test by `release`.
template <class Calls, class Release>
bool returns_while_held(Calls calls, Release release) {
  std::atomic<bool> returned{false};
  std::thread caller([&] {
    calls();
    returned.store(true);
  });
  const bool ok = eventually([&] { return returned.load(); }, deadline);
  if (!ok) release();
  caller.join();
  return ok;
}

std::vector<std::uint8_t> iota_bytes(std::size_t n, int start) {
  std::vector<std::uint8_t> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<std::uint8_t>(start + 7 * static_cast<int>(i));
  return v;
}

// ---- memory ----

TEST_P(DeviceTest, MemoryIsTaggedAsDevice) {
  auto* d = static_cast<char*>(device_buffer(1000));
  auto* p = static_cast<char*>(pinned(1000));
  int on_stack = 0;
  std::vector<int> on_heap(10);
  EXPECT_TRUE(device_->is_device_pointer(d));
  EXPECT_TRUE(device_->is_device_pointer(d + 999));
  EXPECT_FALSE(device_->is_device_pointer(p));
  EXPECT_FALSE(device_->is_device_pointer(&on_stack));
  EXPECT_FALSE(device_->is_device_pointer(on_heap.data()));
  EXPECT_FALSE(device_->is_device_pointer(nullptr));
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(d) % 256, 0u);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(p) % 256, 0u);
  for (int i = 0; i < 1000; ++i) ASSERT_EQ(p[i], 0) << "pinned memory is zeroed, byte " << i;
}

TEST_P(DeviceTest, MemoryErrors) {
  int on_stack = 0;
  EXPECT_EQ(error_code_of([&] { device_->allocate(0); }), ErrorCode::invalid_argument);
  EXPECT_EQ(error_code_of([&] { device_->allocate_pinned(0); }), ErrorCode::invalid_argument);
  EXPECT_EQ(error_code_of([&] { device_->free(&on_stack); }), ErrorCode::invalid_argument);
  EXPECT_EQ(error_code_of([&] { device_->free_pinned(&on_stack); }), ErrorCode::invalid_argument);
  EXPECT_EQ(error_code_of([&] { device_->free(pinned(64)); }), ErrorCode::invalid_argument);
  EXPECT_EQ(error_code_of([&] { device_->free_pinned(device_buffer(64)); }), ErrorCode::invalid_argument);
  auto* d = static_cast<char*>(device_buffer(64));
  EXPECT_EQ(error_code_of([&] { device_->free(d + 8); }), ErrorCode::invalid_argument);
  device_->free(nullptr);
  device_->free_pinned(nullptr);
  void* once = device_->allocate(64);
  device_->free(once);
  if (emulated()) {  // CUDA may hand the same address out again at once
    EXPECT_EQ(error_code_of([&] { device_->free(once); }), ErrorCode::invalid_argument);
  }
}

// ---- copies and ordering ----

TEST_P(DeviceTest, CopiesInEveryDirection) {
  const Stream s = stream();
  const std::size_t n = 4099;
  const auto source = iota_bytes(n, 3);
  void* d1 = device_buffer(n);
  void* d2 = device_buffer(n);
  auto* p = static_cast<std::uint8_t*>(pinned(n));
  std::vector<std::uint8_t> back(n, 0);
  device_->copy(d1, source.data(), n, s);  // host -> device
  device_->copy(d2, d1, n, s);             // device -> device
  device_->copy(p, d2, n, s);              // device -> pinned
  device_->copy(back.data(), p, n, s);     // pinned -> host
  device_->copy(back.data(), back.data(), 0, s);
  sync(s);
  EXPECT_EQ(back, source);
  EXPECT_EQ(std::memcmp(p, source.data(), n), 0);
}

TEST_P(DeviceTest, CopyErrors) {
  const Stream s = stream();
  auto* d = static_cast<char*>(device_buffer(256));
  EXPECT_EQ(error_code_of([&] { device_->copy(nullptr, d, 8, s); }), ErrorCode::invalid_argument);
  EXPECT_EQ(error_code_of([&] { device_->copy(d, nullptr, 8, s); }), ErrorCode::invalid_argument);
  EXPECT_EQ(error_code_of([&] { device_->copy(d + 4, d, 8, s); }), ErrorCode::invalid_argument);
  device_->copy(nullptr, nullptr, 0, s);  // nothing to copy: not an error
  device_->copy(d, d, 256, s);            // onto itself: a no-op
  if (emulated()) {                       // a CUDA stream is any cudaStream_t; the emulated device knows its own
    int not_a_stream = 0;
    EXPECT_EQ(error_code_of([&] { device_->copy(d, d + 128, 8, Stream{&not_a_stream}); }), ErrorCode::invalid_argument);
    EXPECT_EQ(error_code_of([&] { device_->destroy_stream(Stream{&not_a_stream}); }), ErrorCode::invalid_argument);
  }
}

TEST_P(DeviceTest, StreamRunsInOrder) {
  const Stream s = stream();
  const std::size_t n = 1000;
  std::vector<std::int32_t> a(n), b(n);
  for (std::size_t i = 0; i < n; ++i) a[i] = static_cast<std::int32_t>(i), b[i] = 1000 - static_cast<std::int32_t>(i);
  const std::size_t bytes = n * sizeof(std::int32_t);
  void* da = device_buffer(bytes);
  void* db = device_buffer(bytes);
  void* dc = device_buffer(bytes);
  std::vector<std::int32_t> first(n, -1), second(n, -1);
  device_->copy(da, a.data(), bytes, s);
  device_->copy(db, b.data(), bytes, s);
  device_->reduce(dc, da, db, n, DataType::i32, ReduceOp::sum, s);  // 1000 everywhere
  device_->copy(first.data(), dc, bytes, s);
  device_->reduce(dc, dc, da, n, DataType::i32, ReduceOp::sum, s);  // 1000 + i
  device_->copy(da, dc, bytes, s);                                  // a is overwritten after its use
  device_->reduce(dc, da, db, n, DataType::i32, ReduceOp::max, s);  // max(1000 + i, 1000 - i)
  device_->copy(second.data(), dc, bytes, s);
  sync(s);
  for (std::size_t i = 0; i < n; ++i) {
    ASSERT_EQ(first[i], 1000) << i;
    ASSERT_EQ(second[i], 1000 + static_cast<std::int32_t>(i)) << i;
  }
}

// ---- flags ----

TEST_P(DeviceTest, WaitValueHoldsTheStreamNotTheHost) {
  const Stream s = stream();
  std::uint32_t* gate = flag();
  std::uint32_t* done = flag();
  // Pinned host memory: on CUDA a copy from or to pageable memory may wait for the stream.
  const auto values = iota_bytes(512, 1);
  auto* source = static_cast<std::uint8_t*>(pinned(512));
  std::memcpy(source, values.data(), 512);
  void* d = device_buffer(512);
  auto* back = static_cast<std::uint8_t*>(pinned(512));
  const Event e = event();
  const bool returned = returns_while_held(
      [&] {
        device_->wait_value(gate, 1, s);
        device_->copy(d, source, 512, s);
        device_->reduce(d, d, d, 128, DataType::i32, ReduceOp::sum, s);
        device_->copy(back, d, 512, s);
        device_->record(e, s);
        device_->write_value(done, 7, s);
      },
      [&] { device_->set_flag(gate, 1); });
  EXPECT_TRUE(returned) << "a host call blocked on a held stream";
  EXPECT_EQ(Device::load_flag(done), 0u) << "work after wait_value ran before the flag was set";
  EXPECT_FALSE(device_->query(e));
  device_->set_flag(gate, 1);
  EXPECT_TRUE(eventually([&] { return Device::load_flag(done) == 7; }, deadline));
  EXPECT_TRUE(device_->query(e));
  auto expected = values;
  tutti::reduce::apply(ReduceOp::sum, DataType::i32, expected.data(), values.data(), values.data(), 128);
  EXPECT_EQ(std::vector<std::uint8_t>(back, back + 512),
            expected);  // a host that saw the flag sees the stream's earlier writes
}

TEST_P(DeviceTest, HostReleasesAWaitWithALargerValue) {
  const Stream s = stream();
  std::uint32_t* gate = flag();
  std::uint32_t* done = flag();
  device_->set_flag(gate, 3);
  device_->wait_value(gate, 5, s);
  device_->write_value(done, 1, s);
  device_->set_flag(gate, 4);  // not yet
  EXPECT_EQ(Device::load_flag(done), 0u);
  device_->set_flag(gate, 1000);  // a failure releases the stream by jumping past every value
  EXPECT_TRUE(eventually([&] { return Device::load_flag(done) == 1; }, deadline));
  // Comparisons wrap around as cuStreamWaitValue32's GEQ: 3 comes after 0xfffffff0.
  device_->set_flag(gate, 0xfffffff0u);
  device_->wait_value(gate, 0xfffffff5u, s);
  device_->write_value(done, 2, s);
  EXPECT_EQ(Device::load_flag(done), 1u);
  device_->set_flag(gate, 3);
  EXPECT_TRUE(eventually([&] { return Device::load_flag(done) == 2; }, deadline));
  // A value already reached does not hold the stream.
  device_->wait_value(gate, 2, s);
  device_->write_value(done, 3, s);
  sync(s);
  EXPECT_EQ(Device::load_flag(done), 3u);
}

TEST_P(DeviceTest, StreamsSignalEachOtherThroughFlags) {
  const Stream producer = stream(), consumer = stream();
  std::uint32_t* ready = flag();
  const std::size_t n = 256;
  std::vector<std::int64_t> values(n);
  for (std::size_t i = 0; i < n; ++i) values[i] = static_cast<std::int64_t>(i) * 3 - 100;
  void* x = device_buffer(n * 8);
  void* y = device_buffer(n * 8);
  auto* back = static_cast<std::int64_t*>(pinned(n * 8));  // pageable memory could block the host on CUDA
  device_->wait_value(ready, 1, consumer);
  device_->copy(y, x, n * 8, consumer);
  device_->copy(back, y, n * 8, consumer);
  device_->copy(x, values.data(), n * 8, producer);
  device_->write_value(ready, 1, producer);
  sync(producer);
  sync(consumer);
  EXPECT_EQ(std::vector<std::int64_t>(back, back + n), values);
}

TEST_P(DeviceTest, FlagErrors) {
  const Stream s = stream();
  auto* p = static_cast<char*>(pinned(64));
  auto* misaligned = reinterpret_cast<std::uint32_t*>(p + 2);
  EXPECT_EQ(error_code_of([&] { device_->wait_value(nullptr, 1, s); }), ErrorCode::invalid_argument);
  EXPECT_EQ(error_code_of([&] { device_->write_value(nullptr, 1, s); }), ErrorCode::invalid_argument);
  EXPECT_EQ(error_code_of([&] { device_->wait_value(misaligned, 1, s); }), ErrorCode::invalid_argument);
  EXPECT_EQ(error_code_of([&] { device_->write_value(misaligned, 1, s); }), ErrorCode::invalid_argument);
  EXPECT_EQ(error_code_of([&] { device_->set_flag(misaligned, 1); }), ErrorCode::invalid_argument);
  EXPECT_EQ(error_code_of([&] { device_->set_flag(nullptr, 1); }), ErrorCode::invalid_argument);
}

// ---- events ----

TEST_P(DeviceTest, EventsMarkWorkAndHoldOtherStreams) {
  const Stream a = stream(), b = stream();
  std::uint32_t* gate = flag();
  std::uint32_t* b_done = flag();
  const Event e = event();
  EXPECT_TRUE(device_->query(e)) << "an event never recorded is complete";
  device_->wait_value(gate, 1, a);
  device_->record(e, a);
  EXPECT_FALSE(device_->query(e));
  device_->wait_event(b, e);
  device_->write_value(b_done, 1, b);
  EXPECT_FALSE(device_->query(e));
  EXPECT_EQ(Device::load_flag(b_done), 0u) << "b passed an event that a has not reached";
  device_->set_flag(gate, 1);
  EXPECT_TRUE(eventually([&] { return Device::load_flag(b_done) == 1; }, deadline));
  EXPECT_TRUE(eventually([&] { return device_->query(e); }, deadline));
  // Recording again moves the mark; a wait enqueued before the new record does not see it.
  device_->wait_value(gate, 2, a);
  device_->record(e, a);
  EXPECT_FALSE(device_->query(e));
  device_->set_flag(gate, 2);
  EXPECT_TRUE(eventually([&] { return device_->query(e); }, deadline));
  sync(a);
  sync(b);
}

TEST_P(DeviceTest, SynchronizeHasADeadline) {
  const Stream s = stream();
  std::uint32_t* gate = flag();
  device_->wait_value(gate, 1, s);
  EXPECT_EQ(error_code_of([&] { device_->synchronize(s, 20ms); }), ErrorCode::timeout);
  device_->set_flag(gate, 1);
  sync(s);
}

// ---- reductions ----

// Values of every kind for `type`: integer-valued ones (exact sums), and random bit patterns with
// the special values (NaN with payloads, infinities, -0, subnormals) among them.
std::vector<std::uint8_t> data_for(DataType type, std::size_t count, bool integers, std::mt19937_64& rng) {
  const std::size_t size = tutti::size_of(type);
  std::vector<std::uint8_t> bytes(count * size);
  for (std::size_t i = 0; i < count; ++i) {
    std::uint64_t bits = rng();
    if (integers) {
      const int v = static_cast<int>(rng() % 19) - 9;  // -9..9
      switch (type) {
        case DataType::f16:
          bits = tutti::f16(static_cast<float>(v)).bits;
          break;
        case DataType::bf16:
          bits = tutti::bf16(static_cast<float>(v)).bits;
          break;
        case DataType::f32:
          bits = std::bit_cast<std::uint32_t>(static_cast<float>(v));
          break;
        case DataType::f64:
          bits = std::bit_cast<std::uint64_t>(static_cast<double>(v));
          break;
        case DataType::u8:
        case DataType::u32:
        case DataType::u64:
          bits = static_cast<std::uint64_t>(v + 9);
          break;
        default:
          bits = static_cast<std::uint64_t>(static_cast<std::int64_t>(v));
      }
    } else if (rng() % 4 == 0) {  // a special value's bits
      static constexpr std::uint16_t half_specials[] = {0x0000, 0x8000, 0x7c00, 0xfc00, 0x7e00, 0x7d23, 0xfd23,
                                                        0x0001, 0x03ff, 0x7f80, 0xff80, 0x7fc0, 0x7fa3, 0x007f};
      static constexpr std::uint32_t float_specials[] = {0x00000000, 0x80000000, 0x7f800000, 0xff800000, 0x7fc00000,
                                                         0x7f8002a5, 0xffc002a5, 0x00000001, 0x007fffff, 0x7f7fffff};
      static constexpr std::uint64_t double_specials[] = {
          0, 0x8000000000000000, 0x7ff0000000000000, 0xfff0000000000000, 0x7ff8000000000000, 0x7ff00000000002a5,
          1, 0x000fffffffffffff};
      if (size == 2) bits = half_specials[rng() % std::size(half_specials)];
      if (size == 4 && type == DataType::f32) bits = float_specials[rng() % std::size(float_specials)];
      if (size == 8 && type == DataType::f64) bits = double_specials[rng() % std::size(double_specials)];
    }
    std::memcpy(bytes.data() + i * size, &bits, size);  // the low bytes (little-endian)
  }
  return bytes;
}

// Every type x op on the device against reduce::apply (and reduce::divide for avg) on the host,
// bit for bit, at counts around the vector width and at an offset that breaks 16-byte alignment.
TEST_P(DeviceTest, ReduceMatchesTheHostKernelsBitForBit) {
  const Stream s = stream();
  std::mt19937_64 rng(13);
  constexpr int ranks = 3;  // the divisor of avg
  for (const DataType type : all_types) {
    const std::size_t size = tutti::size_of(type);
    for (const ReduceOp op : all_ops) {
      for (const std::size_t count : {std::size_t{1}, std::size_t{7}, std::size_t{64}, std::size_t{1031}}) {
        for (const bool integers : {true, false}) {
          for (const std::size_t offset : {std::size_t{0}, std::size_t{1}}) {
            SCOPED_TRACE(std::string(tutti::to_string(type)) + " " + std::string(tutti::to_string(op)) + " count " +
                         std::to_string(count) + (integers ? " integers" : " bits") + " offset " +
                         std::to_string(offset));
            const std::size_t bytes = count * size, skip = offset * size;
            auto a = data_for(type, count + offset, integers, rng);
            auto b = data_for(type, count + offset, integers, rng);
            auto* da = static_cast<std::uint8_t*>(upload(a, s));
            auto* db = static_cast<std::uint8_t*>(upload(b, s));
            auto* out = static_cast<std::uint8_t*>(device_buffer(bytes + skip));
            device_->reduce(out + skip, da + skip, db + skip, count, type, op, s);
            if (op == ReduceOp::avg) device_->divide(out + skip, count, type, ranks, s);
            device_->reduce(da + skip, da + skip, db + skip, count, type, op, s);  // in place, dst == a
            const auto got = download(out + skip, bytes, s);
            const auto got_in_place = download(da + skip, bytes, s);
            std::vector<std::uint8_t> expected(bytes);
            tutti::reduce::apply(op, type, expected.data(), a.data() + skip, b.data() + skip, count);
            const auto in_place = expected;
            if (op == ReduceOp::avg) tutti::reduce::divide(type, expected.data(), count, ranks);
            for (std::size_t i = 0; i < count; ++i) {
              ASSERT_EQ(std::memcmp(got.data() + i * size, expected.data() + i * size, size), 0) << "element " << i;
              ASSERT_EQ(std::memcmp(got_in_place.data() + i * size, in_place.data() + i * size, size), 0)
                  << "in place, element " << i;
            }
            device_->free(out);
            std::erase(device_memory_, static_cast<void*>(out));
          }
        }
      }
    }
  }
}

// The overlap benchmark's stand-in compute: `rounds` dependent fmaf(x, 0.5, 1) per element, bit for
// bit std::fma's on the host, from values of every sign and magnitude (and at an offset that
// breaks 16-byte alignment); then its refusals.
TEST_P(DeviceTest, ComputeMatchesStdFmaBitForBit) {
  const Stream s = stream();
  std::mt19937_64 rng(29);
  std::uniform_real_distribution<float> value(-1e6f, 1e6f);
  for (const int rounds : {1, 3, 200}) {
    for (const std::size_t count : {std::size_t{1}, std::size_t{1031}}) {
      SCOPED_TRACE("rounds " + std::to_string(rounds) + " count " + std::to_string(count));
      std::vector<float> input(count + 1);
      for (float& x : input) x = value(rng);
      std::vector<std::uint8_t> bytes(input.size() * sizeof(float));
      std::memcpy(bytes.data(), input.data(), bytes.size());
      auto* data = static_cast<float*>(upload(bytes, s)) + 1;
      device_->compute(data, count, rounds, s);
      const auto got = download(data, count * sizeof(float), s);
      for (std::size_t i = 0; i < count; ++i) {
        float x = input[i + 1];
        for (int r = 0; r < rounds; ++r) x = std::fma(x, 0.5f, 1.0f);
        ASSERT_EQ(std::memcmp(got.data() + i * sizeof(float), &x, sizeof(float)), 0) << "element " << i;
      }
    }
  }
  auto* d = static_cast<float*>(device_buffer(1024));
  std::vector<float> host(256);
  EXPECT_EQ(error_code_of([&] { device_->compute(d, 16, -1, s); }), ErrorCode::invalid_argument) << "rounds";
  EXPECT_EQ(error_code_of([&] { device_->compute(host.data(), 16, 1, s); }), ErrorCode::invalid_argument) << "host";
  EXPECT_EQ(
      error_code_of([&] { device_->compute(reinterpret_cast<float*>(reinterpret_cast<char*>(d) + 1), 16, 1, s); }),
      ErrorCode::invalid_argument)
      << "misaligned";
  device_->compute(nullptr, 0, 5, s);  // nothing to compute: not an error
  device_->compute(d, 16, 0, s);
  sync(s);
}

TEST_P(DeviceTest, ReduceErrors) {
  const Stream s = stream();
  auto* d = static_cast<char*>(device_buffer(1024));
  void* p = pinned(1024);
  std::vector<float> host(256);
  const auto reduce = [&](void* dst, const void* a, const void* b, std::size_t count, DataType type = DataType::f32,
                          ReduceOp op = ReduceOp::sum) { device_->reduce(dst, a, b, count, type, op, s); };
  EXPECT_EQ(error_code_of([&] { reduce(d, host.data(), d, 16); }), ErrorCode::invalid_argument) << "host input";
  EXPECT_EQ(error_code_of([&] { reduce(host.data(), d, d, 16); }), ErrorCode::invalid_argument) << "host output";
  EXPECT_EQ(error_code_of([&] { reduce(d, p, d, 16); }), ErrorCode::invalid_argument) << "pinned input";
  EXPECT_EQ(error_code_of([&] { reduce(nullptr, d, d, 16); }), ErrorCode::invalid_argument);
  EXPECT_EQ(error_code_of([&] { reduce(d + 1, d + 512, d + 512, 16); }), ErrorCode::invalid_argument) << "misaligned";
  EXPECT_EQ(error_code_of([&] { reduce(d + 4, d, d + 512, 16); }), ErrorCode::invalid_argument) << "partial overlap";
  EXPECT_EQ(error_code_of([&] { reduce(d, d, d, 16, static_cast<DataType>(42)); }), ErrorCode::invalid_argument);
  EXPECT_EQ(error_code_of([&] { reduce(d, d, d, 16, DataType::f32, static_cast<ReduceOp>(42)); }),
            ErrorCode::invalid_argument);
  EXPECT_EQ(error_code_of([&] { device_->divide(d, 16, DataType::f32, 0, s); }), ErrorCode::invalid_argument);
  EXPECT_EQ(error_code_of([&] { device_->divide(host.data(), 16, DataType::f32, 2, s); }), ErrorCode::invalid_argument);
  if (emulated()) {  // CUDA cannot tell where an allocation ends
    EXPECT_EQ(error_code_of([&] { reduce(d, d, d + 512, 256); }), ErrorCode::invalid_argument) << "past the end";
  }
  reduce(nullptr, nullptr, nullptr, 0);  // nothing to reduce: not an error
  reduce(d, d, d, 256);                  // dst == a == b
  sync(s);
}

// ---- streams: many, and destroyed while held ----

TEST_P(DeviceTest, ManyStreamsAtOnce) {
  constexpr int count = 32;
  constexpr std::size_t n = 4096;
  std::uint32_t* gate = flag();
  std::vector<Stream> streams;
  std::vector<std::uint32_t*> results;  // pinned: pageable memory could block the host on CUDA
  std::vector<std::uint32_t> ones(n, 1);
  void* d_ones = device_buffer(n * 4);
  const Stream setup = stream();
  device_->copy(d_ones, ones.data(), n * 4, setup);
  const Event uploaded = event();
  device_->record(uploaded, setup);
  for (int i = 0; i < count; ++i) {
    const Stream s = streams.emplace_back(stream());
    void* acc = device_buffer(n * 4);
    results.push_back(static_cast<std::uint32_t*>(pinned(n * 4)));
    device_->wait_event(s, uploaded);
    device_->wait_value(gate, 1, s);
    device_->copy(acc, d_ones, n * 4, s);
    for (int k = 0; k < i; ++k) device_->reduce(acc, acc, d_ones, n, DataType::u32, ReduceOp::sum, s);
    device_->copy(results[i], acc, n * 4, s);
  }
  device_->set_flag(gate, 1);
  for (int i = 0; i < count; ++i) {
    sync(streams[i]);
    ASSERT_EQ(std::vector<std::uint32_t>(results[i], results[i] + n),
              std::vector<std::uint32_t>(n, static_cast<std::uint32_t>(i + 1)))
        << "stream " << i;
  }
}

// Destroying a stream held on a flag nobody writes returns. The emulated device releases the wait
// and runs the rest; CUDA keeps the work pending until the flag is written (so the contract asks
// callers to release their flags first), which the CUDA device's run checks instead.
TEST_P(DeviceTest, DestroyingAHeldStreamDoesNotHang) {
  if (const auto* e = dynamic_cast<const tutti::device::EmulatedDevice*>(device_.get()); e != nullptr && e->strict())
    GTEST_SKIP() << "the strict emulated device keeps a destroyed stream's work pending, as CUDA "
                    "(device_strict_test.cpp checks it)";
  std::uint32_t* never = flag();
  std::uint32_t* ran = flag();
  const Stream held = device_->create_stream();
  const Stream on_event = device_->create_stream();
  const Event e = event();
  device_->wait_value(never, 1, held);
  device_->record(e, held);
  device_->wait_event(on_event, e);
  if (!emulated()) {
    std::uint32_t* ran_on_event = flag();
    device_->write_value(ran_on_event, 1, on_event);
    device_->write_value(ran, 2, held);
    const auto release = [&] { device_->set_flag(never, 1); };
    EXPECT_TRUE(returns_while_held([&] { device_->destroy_stream(on_event); }, release)) << "cudaStreamDestroy hung";
    EXPECT_TRUE(returns_while_held([&] { device_->destroy_stream(held); }, release)) << "cudaStreamDestroy hung";
    EXPECT_EQ(Device::load_flag(ran) + Device::load_flag(ran_on_event), 0u)
        << "the destroyed streams' work ran before the flag was written";
    release();
    EXPECT_TRUE(
        eventually([&] { return Device::load_flag(ran) == 2 && Device::load_flag(ran_on_event) == 1; }, deadline))
        << "the destroyed streams' work did not run once the flag was written";
    EXPECT_TRUE(device_->query(e));
    return;
  }
  device_->write_value(ran, 1, on_event);
  device_->write_value(ran, 2, held);
  EXPECT_TRUE(returns_while_held([&] { device_->destroy_stream(on_event); }, [&] { device_->set_flag(never, 1); }))
      << "destroying a stream waiting on an event hung";
  EXPECT_EQ(Device::load_flag(ran), 1u) << "the work after the released wait runs";
  EXPECT_TRUE(returns_while_held([&] { device_->destroy_stream(held); }, [&] { device_->set_flag(never, 1); }))
      << "destroying a stream waiting on a flag hung";
  EXPECT_EQ(Device::load_flag(ran), 2u);
  EXPECT_TRUE(device_->query(e));
  EXPECT_EQ(error_code_of([&] { device_->copy(ran, ran + 1, 4, held); }), ErrorCode::invalid_argument)
      << "a destroyed stream";
}

INSTANTIATE_TEST_SUITE_P(, DeviceTest, ::testing::Values(TUTTI_TEST_DEVICE_CUDA ? Kind::cuda : Kind::emulated),
                         [](const auto& info) { return std::string(tutti::device::to_string(info.param)); });

// ---- the emulated device only (not built into device_gpu_test) ----
#if !TUTTI_TEST_DEVICE_CUDA

TEST(EmulatedDevice, DestroyingTheDeviceReleasesItsStreams) {
  auto device = std::make_unique<tutti::device::EmulatedDevice>();
  auto* never = static_cast<std::uint32_t*>(device->allocate_pinned(4));
  for (int i = 0; i < 4; ++i) device->wait_value(never, 1, device->create_stream());
  device->allocate(100);  // freed with the device
  EXPECT_TRUE(returns_while_held([&] { device.reset(); }, [&] { tutti::device::detail::wake_flag(never); }));
}

TEST(EmulatedDevice, AdoptedMemoryCountsAsDevice) {
  tutti::device::EmulatedDevice device;
  std::vector<float> mapped(64, 2.0f);  // stands for a peer's buffer mapped from shared memory
  EXPECT_FALSE(device.is_device_pointer(mapped.data()));
  device.adopt(mapped.data(), mapped.size() * sizeof(float));
  EXPECT_TRUE(device.is_device_pointer(mapped.data() + 63));
  EXPECT_EQ(error_code_of([&] { device.adopt(mapped.data() + 8, 16); }), ErrorCode::invalid_argument);
  const Stream s = device.create_stream();
  device.reduce(mapped.data(), mapped.data(), mapped.data(), 64, DataType::f32, ReduceOp::sum, s);
  device.synchronize(s, deadline);
  EXPECT_EQ(mapped, std::vector<float>(64, 4.0f));
  device.forget(mapped.data());
  EXPECT_FALSE(device.is_device_pointer(mapped.data()));
  EXPECT_EQ(error_code_of([&] { device.forget(mapped.data()); }), ErrorCode::invalid_argument);
  device.destroy_stream(s);
}

// IPC memory between two processes: what one writes the other reads, through core's shared
// memory; a handle whose memory was freed (its descriptor since reused or closed) is refused.
TEST(EmulatedDevice, SharedMemoryBetweenProcesses) {
  using tutti::device::IpcHandle;
  constexpr std::size_t n = 5000;  // more than a page
  tutti::device::EmulatedDevice device;
  IpcHandle handle;
  auto* mine = static_cast<std::uint32_t*>(device.allocate_shared(n * sizeof(std::uint32_t), handle));
  EXPECT_TRUE(device.is_device_pointer(mine + n - 1));
  for (std::uint32_t i = 0; i < n; ++i) mine[i] = i;
  const auto opened = tutti::testing::on_processes(
      1,
      [&](int) {
        tutti::device::EmulatedDevice peer;
        EXPECT_EQ(error_code_of([&] { peer.open_shared(handle, (n + 1) * sizeof(std::uint32_t)); }),
                  ErrorCode::invalid_argument);
        auto* theirs = static_cast<std::uint32_t*>(peer.open_shared(handle, n * sizeof(std::uint32_t)));
        if (!peer.is_device_pointer(theirs + n - 1)) return 3;
        for (std::uint32_t i = 0; i < n; ++i)
          if (theirs[i] != i) return 4;
        for (std::uint32_t i = 0; i < n; ++i) theirs[i] = 3 * i + 1;
        peer.close_shared(theirs);
        if (peer.is_device_pointer(theirs)) return 5;
        EXPECT_EQ(error_code_of([&] { peer.close_shared(theirs); }), ErrorCode::invalid_argument);
        return ::testing::Test::HasFailure() ? 6 : 0;
      },
      std::chrono::seconds(60));
  EXPECT_EQ(opened, std::vector<int>{0});
  for (std::uint32_t i = 0; i < n; ++i) ASSERT_EQ(mine[i], 3 * i + 1) << i;
  device.free(mine);
  IpcHandle other;
  void* again = device.allocate_shared(n * sizeof(std::uint32_t), other);  // may take the old descriptor
  const auto stale = tutti::testing::on_processes(
      1,
      [&](int) {
        tutti::device::EmulatedDevice peer;
        return error_code_of([&] { peer.open_shared(handle, n * sizeof(std::uint32_t)); }) == ErrorCode::system ? 0 : 7;
      },
      std::chrono::seconds(60));
  EXPECT_EQ(stale, std::vector<int>{0});
  device.free(again);
}

TEST(DeviceChoice, FromTheEnvironment) {
  using tutti::device::kind_from_env;
  ::unsetenv("TUTTI_DEVICE");
  EXPECT_EQ(kind_from_env(Kind::cuda), Kind::cuda);
  ::setenv("TUTTI_DEVICE", "emulated", 1);
  EXPECT_EQ(kind_from_env(Kind::cuda), Kind::emulated);
  EXPECT_EQ(tutti::device::open_device(Kind::cuda)->kind(), Kind::emulated);
  ::setenv("TUTTI_DEVICE", "cuda", 1);
  EXPECT_EQ(kind_from_env(Kind::emulated), Kind::cuda);
  ::setenv("TUTTI_DEVICE", "gpu", 1);
  std::string message;
  EXPECT_EQ(error_code_of([&] { kind_from_env(Kind::emulated); }, &message), ErrorCode::invalid_argument);
  EXPECT_NE(message.find("TUTTI_DEVICE"), std::string::npos) << message;
  ::unsetenv("TUTTI_DEVICE");
  if (!tutti::device::built_with_cuda()) {
    EXPECT_EQ(error_code_of([&] { tutti::device::make_device(Kind::cuda); }), ErrorCode::unsupported);
  }
}
#endif

}  // namespace
