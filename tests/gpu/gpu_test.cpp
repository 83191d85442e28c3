// gpu::Communicator's host_transfer backend on the emulated device (label emulated): ranks are
// threads over the in-process transport, each with its own emulated device and streams. Results
// are checked exactly on every element of every rank; stream rules are checked with flags (a
// stream held by wait_value on a flag the test controls), never with a timing; every wait has a
// deadline, so no case can hang.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <future>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "device/device.hpp"
#include "gpu/access.hpp"
#include "gpu/gpu_impl.hpp"
#include "gpu_harness.hpp"
#include "harness.hpp"
#include "test_waits.hpp"
#include "tutti/gpu.hpp"

namespace {

using namespace tutti::testing::gpu;

void allreduce_case(tutti::gpu::Communicator& gpu, Stream stream, DataType type, ReduceOp op, std::size_t count,
                    bool in_place) {
  const int p = gpu.size(), r = gpu.rank();
  const Bytes input = values(type, count, [&](std::size_t i) { return input_value(type, op, r, i); });
  const Bytes expected = values(type, count, [&](std::size_t i) { return reference_reduction(type, op, p, i); });
  DeviceBuffer send(gpu, input.size()), recv(gpu, in_place ? 0 : input.size());
  void* out = in_place ? send.data : recv.data;
  const Bytes poison(input.size(), std::byte{tutti::testing::poison});
  Bytes result(input.size(), std::byte{0x5A});
  gpu.copy(send.data, input.data(), input.size(), stream);
  if (!in_place) gpu.copy(out, poison.data(), poison.size(), stream);
  gpu.allreduce(send.data, out, count, type, op, stream, options);
  gpu.copy(result.data(), out, result.size(), stream);
  synchronize_checked(gpu, stream);
  gpu.check();
  expect_equal(result, expected, type,
               "allreduce " + std::string(tutti::to_string(type)) + " " + std::string(tutti::to_string(op)) +
                   " count " + std::to_string(count));
}

TEST(GpuHostTransfer, AllreduceCountsAndSizes) {
  for (int p : {1, 2, 3, 4, 8}) {
    SCOPED_TRACE("p = " + std::to_string(p));
    run_gpu_ranks(p, [&](tutti::gpu::Communicator& gpu, int) {
      const Stream stream = gpu.create_stream();
      // 16384 and 16385 f32: ipc's one-shot limit (64 KiB) and one element past it.
      for (std::size_t count : {std::size_t{0}, std::size_t{1}, static_cast<std::size_t>(p + 1), std::size_t{16384},
                                std::size_t{16385}, std::size_t{1000003}})
        for (bool in_place : {false, true}) allreduce_case(gpu, stream, DataType::f32, ReduceOp::sum, count, in_place);
      gpu.destroy_stream(stream);
    });
  }
}

TEST(GpuHostTransfer, AllreduceEveryTypeAndOp) {
  for (int p : {1, 2, 3, 4}) {
    SCOPED_TRACE("p = " + std::to_string(p));
    run_gpu_ranks(p, [&](tutti::gpu::Communicator& gpu, int) {
      const Stream stream = gpu.create_stream();
      for (DataType type : all_types)
        for (ReduceOp op : all_ops) allreduce_case(gpu, stream, type, op, static_cast<std::size_t>(p + 2), false);
      gpu.destroy_stream(stream);
    });
  }
}

TEST(GpuHostTransfer, Broadcast) {
  for (int p : {1, 2, 3, 4}) {
    SCOPED_TRACE("p = " + std::to_string(p));
    run_gpu_ranks(p, [&](tutti::gpu::Communicator& gpu, int r) {
      const Stream stream = gpu.create_stream();
      const DataType type = DataType::i32;
      for (std::size_t count : {std::size_t{0}, std::size_t{1}, static_cast<std::size_t>(p + 1), std::size_t{100003}})
        for (int root = 0; root < p; ++root) {
          auto root_value = [&](std::size_t i) { return input_value(type, ReduceOp::sum, root, i); };
          const Bytes expected = values(type, count, root_value);
          const Bytes mine = r == root ? expected : Bytes(expected.size(), std::byte{tutti::testing::poison});
          DeviceBuffer buffer(gpu, expected.size());
          Bytes result(expected.size());
          gpu.copy(buffer.data, mine.data(), mine.size(), stream);
          gpu.broadcast(buffer.data, count, type, root, stream, options);
          gpu.copy(result.data(), buffer.data, result.size(), stream);
          synchronize_checked(gpu, stream);
          expect_equal(result, expected, type,
                       "broadcast root " + std::to_string(root) + " count " + std::to_string(count));
        }
      gpu.destroy_stream(stream);
    });
  }
}

TEST(GpuHostTransfer, Allgather) {
  for (int p : {1, 2, 3, 4}) {
    SCOPED_TRACE("p = " + std::to_string(p));
    run_gpu_ranks(p, [&](tutti::gpu::Communicator& gpu, int r) {
      const Stream stream = gpu.create_stream();
      const DataType type = DataType::f64;
      const std::size_t es = tutti::size_of(type);
      for (std::size_t count : {std::size_t{0}, std::size_t{1}, static_cast<std::size_t>(p + 1), std::size_t{100003}})
        for (bool in_place : {false, true}) {
          const auto total = count * static_cast<std::size_t>(p);
          const Bytes input =
              values(type, count, [&](std::size_t i) { return input_value(type, ReduceOp::sum, r, i); });
          const Bytes expected = values(type, total, [&](std::size_t i) {
            return input_value(type, ReduceOp::sum, static_cast<int>(i / count), i % count);
          });
          DeviceBuffer send(gpu, in_place ? 0 : input.size()), recv(gpu, expected.size());
          const Bytes poison(expected.size(), std::byte{tutti::testing::poison});
          std::byte* in = in_place ? recv.bytes() + static_cast<std::size_t>(r) * count * es : send.bytes();
          Bytes result(expected.size());
          gpu.copy(recv.data, poison.data(), poison.size(), stream);
          gpu.copy(in, input.data(), input.size(), stream);
          gpu.allgather(in, recv.data, count, type, stream, options);
          gpu.copy(result.data(), recv.data, result.size(), stream);
          synchronize_checked(gpu, stream);
          expect_equal(result, expected, type, "allgather count " + std::to_string(count));
        }
      gpu.destroy_stream(stream);
    });
  }
}

TEST(GpuHostTransfer, ReduceScatter) {
  for (int p : {1, 2, 3, 4}) {
    SCOPED_TRACE("p = " + std::to_string(p));
    run_gpu_ranks(p, [&](tutti::gpu::Communicator& gpu, int r) {
      const Stream stream = gpu.create_stream();
      const DataType type = DataType::i64;
      const std::size_t es = tutti::size_of(type);
      for (ReduceOp op : all_ops)
        for (std::size_t count :
             {std::size_t{0}, std::size_t{1}, static_cast<std::size_t>(p + 1), std::size_t{100003}}) {
          const auto total = count * static_cast<std::size_t>(p);
          const std::size_t first = static_cast<std::size_t>(r) * count;
          const Bytes input = values(type, total, [&](std::size_t i) { return input_value(type, op, r, i); });
          const Bytes expected =
              values(type, count, [&](std::size_t i) { return reference_reduction(type, op, p, first + i); });
          DeviceBuffer send(gpu, input.size()), recv(gpu, expected.size());
          const Bytes poison(expected.size(), std::byte{tutti::testing::poison});
          Bytes result(expected.size());
          gpu.copy(send.data, input.data(), input.size(), stream);
          gpu.copy(recv.data, poison.data(), poison.size(), stream);
          gpu.reduce_scatter(send.data, recv.data, count, type, op, stream, options);
          gpu.copy(result.data(), recv.data, result.size(), stream);
          // In place (NCCL's form): the result lands in this rank's block of send.
          Bytes in_place_result(expected.size());
          gpu.copy(send.data, input.data(), input.size(), stream);
          gpu.reduce_scatter(send.data, send.bytes() + first * es, count, type, op, stream, options);
          gpu.copy(in_place_result.data(), send.bytes() + first * es, in_place_result.size(), stream);
          gpu.synchronize(stream, deadline);
          const std::string what =
              "reduce_scatter " + std::string(tutti::to_string(op)) + " count " + std::to_string(count);
          expect_equal(result, expected, type, what);
          expect_equal(in_place_result, expected, type, what + " in place");
        }
      gpu.destroy_stream(stream);
    });
  }
}

// (a) The host never waits for the stream, and (b) the collective is ordered with the stream's
// other work: the stream is held (wait_value on a flag only the test raises) before the input is
// even copied in, the call returns while it is held, and a marker written after the collective
// is still unwritten; once released, the result is right and the marker written.
TEST(GpuHostTransfer, HostNeverWaitsForTheStream) {
  for (int p : {1, 2, 3}) {
    SCOPED_TRACE("p = " + std::to_string(p));
    run_gpu_ranks(p, [&](tutti::gpu::Communicator& gpu, int r) {
      auto& device = device_of(gpu);
      const Stream stream = gpu.create_stream();
      auto* flags = static_cast<std::uint32_t*>(device.allocate_pinned(2 * sizeof(std::uint32_t)));
      std::uint32_t* hold = flags;
      std::uint32_t* marker = flags + 1;
      const std::size_t count = 1000;
      const DataType type = DataType::i32;
      const Bytes input = values(type, count, [&](std::size_t i) { return input_value(type, ReduceOp::sum, r, i); });
      const Bytes expected =
          values(type, count, [&](std::size_t i) { return reference_reduction(type, ReduceOp::sum, p, i); });
      DeviceBuffer data(gpu, input.size());
      const Bytes poison(input.size(), std::byte{tutti::testing::poison});
      Bytes result(input.size());
      gpu.copy(data.data, poison.data(), poison.size(), stream);
      device.wait_value(hold, 1, {stream});
      gpu.copy(data.data, input.data(), input.size(), stream);
      gpu.allreduce(data.data, data.data, count, type, ReduceOp::sum, stream, options);
      device.write_value(marker, 1, {stream});
      gpu.copy(result.data(), data.data, result.size(), stream);
      // Returned while the stream is held: nothing after the hold has run.
      if (tutti::device::Device::load_flag(marker) != 0) throw std::runtime_error("the marker ran before the release");
      device.set_flag(hold, 1);
      synchronize_checked(gpu, stream);
      if (tutti::device::Device::load_flag(marker) != 1) throw std::runtime_error("the marker did not run");
      expect_equal(result, expected, type, "held allreduce");
      gpu.destroy_stream(stream);
      device.free_pinned(flags);
    });
  }
}

// (c) Collectives back to back on one stream (each one's output is the next one's input), and
// alternating between two streams of one communicator.
TEST(GpuHostTransfer, BackToBackOnOneAndTwoStreams) {
  for (int p : {1, 2, 4}) {
    SCOPED_TRACE("p = " + std::to_string(p));
    run_gpu_ranks(p, [&](tutti::gpu::Communicator& gpu, int) {
      const DataType type = DataType::i64;
      const std::size_t count = 4099;
      const Stream a = gpu.create_stream(), b = gpu.create_stream();
      const int rounds = 6;
      // One stream: x -> p x -> p^2 x ...
      DeviceBuffer x(gpu, count * 8);
      const Bytes ones = values(type, count, [](std::size_t i) { return static_cast<double>(i % 5 + 1); });
      gpu.copy(x.data, ones.data(), ones.size(), a);
      for (int k = 0; k < rounds; ++k) gpu.allreduce(x.data, x.data, count, type, ReduceOp::sum, a, options);
      Bytes got(ones.size());
      gpu.copy(got.data(), x.data, got.size(), a);
      // Two streams, alternating: each keeps its own chain; the numbering orders them.
      DeviceBuffer y(gpu, count * 8), z(gpu, count * 8);
      gpu.copy(y.data, ones.data(), ones.size(), a);
      gpu.copy(z.data, ones.data(), ones.size(), b);
      for (int k = 0; k < rounds; ++k) {
        gpu.allreduce(y.data, y.data, count, type, ReduceOp::sum, a, options);
        gpu.allreduce(z.data, z.data, count, type, ReduceOp::max, b, options);
      }
      Bytes got_y(ones.size()), got_z(ones.size());
      gpu.copy(got_y.data(), y.data, got_y.size(), a);
      gpu.copy(got_z.data(), z.data, got_z.size(), b);
      gpu.synchronize(a, deadline);
      gpu.synchronize(b, deadline);
      double factor = 1;
      for (int k = 0; k < rounds; ++k) factor *= p;
      const Bytes want = values(type, count, [&](std::size_t i) { return static_cast<double>(i % 5 + 1) * factor; });
      expect_equal(got, want, type, "one stream");
      expect_equal(got_y, want, type, "two streams (sum)");
      expect_equal(got_z, ones, type, "two streams (max)");
      gpu.destroy_stream(a);
      gpu.destroy_stream(b);
    });
  }
}

// (c) Order across streams: operation 1 waits behind a held stream A, operation 2 is on a free
// stream B. B reaches its collective first (and raises its own ready flag first), yet operation 2
// runs only after operation 1, and operation 1 runs on its real input, copied in after the hold.
TEST(GpuHostTransfer, LaterOperationOnAnotherStreamWaitsForTheEarlierOne) {
  for (int p : {1, 2, 3}) {
    SCOPED_TRACE("p = " + std::to_string(p));
    run_gpu_ranks(p, [&](tutti::gpu::Communicator& gpu, int r) {
      auto& device = device_of(gpu);
      const Stream a = gpu.create_stream(), b = gpu.create_stream();
      auto* hold = static_cast<std::uint32_t*>(device.allocate_pinned(sizeof(std::uint32_t)));
      const DataType type = DataType::i32;
      const std::size_t count = 777;
      const Bytes input = values(type, count, [&](std::size_t i) { return input_value(type, ReduceOp::sum, r, i); });
      const Bytes expected =
          values(type, count, [&](std::size_t i) { return reference_reduction(type, ReduceOp::sum, p, i); });
      DeviceBuffer x(gpu, input.size()), y(gpu, input.size());
      Bytes got_x(input.size()), got_y(input.size());
      device.wait_value(hold, 1, {a});
      gpu.copy(x.data, input.data(), input.size(), a);
      gpu.allreduce(x.data, x.data, count, type, ReduceOp::sum, a, options);
      gpu.copy(got_x.data(), x.data, got_x.size(), a);
      gpu.copy(y.data, input.data(), input.size(), b);
      gpu.allreduce(y.data, y.data, count, type, ReduceOp::sum, b, options);
      gpu.copy(got_y.data(), y.data, got_y.size(), b);
      // B cannot finish while A holds operation 1: this wait must run out.
      if (error_code_of([&] { gpu.synchronize(b, 100ms); }) != ErrorCode::timeout)
        throw std::runtime_error("operation 2 finished before operation 1");
      device.set_flag(hold, 1);
      synchronize_checked(gpu, a);
      synchronize_checked(gpu, b);
      expect_equal(got_x, expected, type, "operation 1 (stream a)");
      expect_equal(got_y, expected, type, "operation 2 (stream b)");
      gpu.destroy_stream(a);
      gpu.destroy_stream(b);
      device.free_pinned(hold);
    });
  }
}

// (d) A mismatch (different counts on two ranks) found after the calls returned: the streams are
// released, and check() and the next call raise `mismatch` on every rank.
TEST(GpuHostTransfer, MismatchReleasesTheStreamsAndIsRaisedLater) {
  run_gpu_ranks(2, [&](tutti::gpu::Communicator& gpu, int r) {
    const Stream stream = gpu.create_stream();
    DeviceBuffer data(gpu, 64 * 4);
    // The second queued behind the first. Either call may raise the mismatch itself, where the
    // verdict came first (ipc compares descriptors while the first call enqueues): a failure
    // known at a call is raised by it. Either way the stream must be released before `data`
    // goes away.
    const auto enqueue = [&](std::size_t count) {
      try {
        gpu.allreduce(data.data, data.data, count, DataType::f32, ReduceOp::sum, stream, options);
      } catch (const tutti::Error& e) {
        if (e.code() != ErrorCode::mismatch) throw;
      }
    };
    enqueue(r == 0 ? 10 : 11);
    enqueue(8);
    gpu.synchronize(stream, deadline);  // released: Error(timeout) here if not
    std::string message;
    if (error_code_of([&] { gpu.check(); }, &message) != ErrorCode::mismatch)
      throw std::runtime_error("check() raised " + message);
    if (error_code_of([&] { gpu.allreduce(data.data, data.data, 8, DataType::f32, ReduceOp::sum, stream); }) !=
        ErrorCode::mismatch)
      throw std::runtime_error("the next call did not raise mismatch");
    if (error_code_of([&] { gpu.check(); }) != ErrorCode::mismatch) throw std::runtime_error("not sticky");
    gpu.destroy_stream(stream);
  });
}

// (d) A peer that never calls: the operation times out on the host (its Options::timeout), the
// stream moves on, and check() raises `timeout` with the code preserved.
TEST(GpuHostTransfer, SilentPeerTimesOutAndReleasesTheStream) {
  std::atomic<bool> finished{false};
  run_gpu_ranks(2, [&](tutti::gpu::Communicator& gpu, int r) {
    if (r == 1) {  // stays silent until rank 0 is done
      if (!tutti::testing::eventually([&] { return finished.load(); }, deadline))
        throw std::runtime_error("rank 0 did not finish");
      return;
    }
    const Stream stream = gpu.create_stream();
    DeviceBuffer data(gpu, 64 * 4);
    const tutti::gpu::Options short_timeout{tutti::gpu::Backend::automatic, std::chrono::milliseconds(300)};
    gpu.allreduce(data.data, data.data, 64, DataType::f32, ReduceOp::sum, stream, short_timeout);
    gpu.synchronize(stream, deadline);  // released: Error(timeout) from synchronize itself if not
    const ErrorCode code = error_code_of([&] { gpu.check(); });
    finished = true;
    if (code != ErrorCode::timeout) throw std::runtime_error("check() raised " + std::string(tutti::to_string(code)));
    gpu.destroy_stream(stream);
  });
}

// (d) Invalid arguments raise invalid_argument from the call itself and enqueue nothing: the
// collective after them still matches on every rank and is right.
TEST(GpuHostTransfer, InvalidArgumentsEnqueueNothing) {
  run_gpu_ranks(3, [&](tutti::gpu::Communicator& gpu, int r) {
    auto& device = device_of(gpu);
    const Stream stream = gpu.create_stream();
    DeviceBuffer data(gpu, 64 * 4);
    std::vector<float> host(64);
    void* pinned = device.allocate_pinned(64 * 4);
    auto expect_invalid = [](const char* what, auto call) {
      if (error_code_of(call) != ErrorCode::invalid_argument) throw std::runtime_error(std::string(what) + " passed");
    };
    const auto f32 = DataType::f32;
    const auto sum = ReduceOp::sum;
    expect_invalid("host send", [&] { gpu.allreduce(host.data(), data.data, 64, f32, sum, stream); });
    expect_invalid("host recv", [&] { gpu.allreduce(data.data, host.data(), 64, f32, sum, stream); });
    expect_invalid("pinned send", [&] { gpu.allreduce(pinned, data.data, 64, f32, sum, stream); });
    expect_invalid("past the end", [&] { gpu.allreduce(data.data, data.data, 65, f32, sum, stream); });
    expect_invalid("null send", [&] { gpu.allreduce(nullptr, data.data, 1, f32, sum, stream); });
    expect_invalid("null buffer", [&] { gpu.broadcast(nullptr, 1, f32, 0, stream); });
    expect_invalid("root 3", [&] { gpu.broadcast(data.data, 1, f32, 3, stream); });
    expect_invalid("root -1", [&] { gpu.broadcast(data.data, 1, f32, -1, stream); });
    expect_invalid("type", [&] { gpu.allreduce(data.data, data.data, 1, static_cast<DataType>(99), sum, stream); });
    expect_invalid("op", [&] { gpu.allreduce(data.data, data.data, 1, f32, static_cast<ReduceOp>(99), stream); });
    expect_invalid("overflow", [&] { gpu.allreduce(data.data, data.data, SIZE_MAX / 2, f32, sum, stream); });
    expect_invalid("allgather recv", [&] { gpu.allgather(data.data, host.data(), 4, f32, stream); });
    expect_invalid("reduce_scatter send too short",
                   [&] { gpu.reduce_scatter(data.data, data.data, 32, f32, sum, stream); });
    if (test_device_kind() == DeviceKind::emulated)  // CUDA cannot check a cudaStream_t (see the device's tests)
      expect_invalid("unknown stream", [&] {
        gpu.allreduce(data.data, data.data, 1, f32, sum, reinterpret_cast<Stream>(std::uintptr_t{0x1234}));
      });
    gpu.check();  // argument errors are not the communicator's failures
    allreduce_case(gpu, stream, f32, sum, 64, true);
    (void)r;
    device.free_pinned(pinned);
    gpu.destroy_stream(stream);
  });
}

// Runs fn on a thread of its own and fails the test if it has not returned within `limit` (a
// hang would otherwise hold the whole suite; the process is stopped then).
void bounded(const std::function<void()>& fn, std::chrono::seconds limit, const char* what) {
  auto done = std::make_shared<std::promise<void>>();
  auto future = done->get_future();
  std::thread([fn, done] {
    try {
      fn();
      done->set_value();
    } catch (...) {
      done->set_exception(std::current_exception());
    }
  }).detach();
  if (future.wait_for(limit) != std::future_status::ready) {
    std::fprintf(stderr, "%s did not return within %lld s\n", what, static_cast<long long>(limit.count()));
    std::abort();
  }
  future.get();
}

// (e) Destroying a communicator whose operation waits behind a held stream does not hang: the
// streams are released (the emulated device then runs their queued work) and the thread stops.
TEST(GpuHostTransfer, DestroyWithAHeldStreamDoesNotHang) {
  auto hosts = tutti::local_group(2);
  const std::string failures = tutti::testing::on_threads(2, [&](int r) {
    std::optional<tutti::gpu::Communicator> gpu;
    gpu.emplace(hosts[static_cast<std::size_t>(r)], DeviceKind::emulated);
    auto& device = device_of(*gpu);
    const Stream stream = gpu->create_stream();
    auto* hold = static_cast<std::uint32_t*>(device.allocate_pinned(sizeof(std::uint32_t)));
    void* data = gpu->allocate(1024);
    device.wait_value(hold, 1, {stream});
    gpu->allreduce(data, data, 256, DataType::f32, ReduceOp::sum, stream, options);
    gpu->allreduce(data, data, 256, DataType::f32, ReduceOp::sum, stream, options);
    bounded([&] { gpu.reset(); }, 30s, "~gpu::Communicator");
  });
  EXPECT_EQ(failures, "");
}

// (f) Destroying a communicator while an operation is in flight (its peer never joins) releases
// the stream within the operation's timeout and records ErrorCode::aborted, naming the destroyed
// communicator, in the failures that outlive it: the released stream copies back no result, so
// the output (poisoned beforehand) is read as failed, never as a result. A communicator destroyed
// with nothing in flight records nothing.
// On the strict device (the ranks' streams share one context's hardware queues) ranks submit in
// order (gpu/local_order.hpp): the call itself waits for rank 1 to issue the operation, so it never
// gets in flight; after the operation's 2 s the record says ErrorCode::timeout naming rank 1, and
// the output is read as failed all the same.
TEST(GpuHostTransfer, DestroyWithAnOperationInFlightRecordsAborted) {
  auto hosts = tutti::local_group(2);
  std::atomic<bool> rank0_done{false};
  const bool ordered = tutti::gpu::device_name(DeviceKind::emulated).find("strict") != std::string::npos;
  const std::string failures = tutti::testing::on_threads(2, [&](int r) {
    std::optional<tutti::gpu::Communicator> gpu;
    gpu.emplace(hosts[static_cast<std::size_t>(r)], DeviceKind::emulated);
    const auto record = tutti::gpu::detail::Access::impl(*gpu)->host_transfer_failures();
    if (r == 1) {  // never joins: waits (bounded) until rank 0 has destroyed its communicator
      const auto until = std::chrono::steady_clock::now() + deadline;
      while (!rank0_done.load() && std::chrono::steady_clock::now() < until) std::this_thread::sleep_for(1ms);
      ASSERT_TRUE(rank0_done.load());
      gpu.reset();
      EXPECT_FALSE(record->failed());  // nothing was in flight
      return;
    }
    const auto device = tutti::gpu::detail::Access::impl(*gpu)->shared_device();  // outlives the communicator
    const Stream stream = gpu->create_stream();
    constexpr std::size_t count = 1000;
    std::vector<float> input(count), poison(count), out(count);
    for (std::size_t i = 0; i < count; ++i) input[i] = static_cast<float>(i + 1);
    std::memset(poison.data(), 0xA5, count * sizeof(float));
    void* send = gpu->allocate(count * sizeof(float));
    void* recv = gpu->allocate(count * sizeof(float));
    gpu->copy(send, input.data(), count * sizeof(float), stream);
    gpu->copy(recv, poison.data(), count * sizeof(float), stream);
    gpu->synchronize(stream, deadline);
    const tutti::gpu::Options short_timeout{tutti::gpu::Backend::host_transfer, std::chrono::milliseconds(2000)};
    gpu->allreduce(send, recv, count, DataType::f32, ReduceOp::sum, stream, short_timeout);
    EXPECT_EQ(record->failed(), ordered);
    const auto start = std::chrono::steady_clock::now();
    bounded([&] { gpu.reset(); }, 30s, "~gpu::Communicator");
    rank0_done.store(true);
    EXPECT_LT(std::chrono::steady_clock::now() - start, 10s);  // the operation's timeout, and slack
    // The stream was released: it completes, and then reads as failed, not as a result.
    device->synchronize({stream}, deadline);
    device->copy(out.data(), recv, count * sizeof(float), {stream});
    device->synchronize({stream}, deadline);
    ASSERT_TRUE(record->failed());
    const auto error = record->failure();
    ASSERT_TRUE(error.has_value());
    const ErrorCode expected = ordered ? ErrorCode::timeout : ErrorCode::aborted;
    EXPECT_EQ(error->code(), expected) << error->what();
    EXPECT_NE(
        std::string(error->what())
            .find(ordered ? "rank(s) 1 (threads of this process on the same device) did not issue it within 2000 ms"
                          : "destroyed with operations 1 to 1 in flight"),
        std::string::npos)
        << error->what();
    EXPECT_EQ(error_code_of([&] { record->check(); }), expected);
    // No sum of two ranks' inputs can be in the output: rank 1 never sent any.
    for (std::size_t i = 0; i < count; ++i) ASSERT_NE(out[i], 2.0f * input[i]) << i;
    device->destroy_stream({stream});
  });
  EXPECT_EQ(failures, "");
}

TEST(GpuHostTransfer, DeviceKindFromTheEnvironment) {
  auto hosts = tutti::local_group(1);
  ::setenv("TUTTI_DEVICE", "emulated", 1);
  tutti::gpu::Communicator gpu(hosts[0]);
  EXPECT_EQ(gpu.rank(), 0);
  EXPECT_EQ(gpu.size(), 1);
  ::setenv("TUTTI_DEVICE", "tpu", 1);
  EXPECT_EQ(error_code_of([&] { tutti::gpu::Communicator other(hosts[0]); }), ErrorCode::invalid_argument);
  ::unsetenv("TUTTI_DEVICE");
}

// gpu::Communicator::reduce_local: the device's kernel, dst = a op b on the stream, exactly the two
// ranks' reduction for every type and element-wise op, and bit for bit the host's reduce_local;
// avg and a host buffer are refused with nothing enqueued. gpu::device_name opens a device alone.
TEST(GpuDevice, ReduceLocalIsTheHostKernelOnTheStream) {
  run_gpu_ranks(1, [](tutti::gpu::Communicator& gpu, int) {
    const Stream stream = gpu.create_stream();
    constexpr std::size_t count = 777;
    for (DataType type : all_types) {
      for (ReduceOp op : {ReduceOp::sum, ReduceOp::prod, ReduceOp::min, ReduceOp::max}) {
        const Bytes a = values(type, count, [&](std::size_t i) { return input_value(type, op, 0, i); });
        const Bytes b = values(type, count, [&](std::size_t i) { return input_value(type, op, 1, i); });
        const Bytes expected = values(type, count, [&](std::size_t i) { return reference_reduction(type, op, 2, i); });
        Bytes host(a.size()), result(a.size(), std::byte{0x5A});
        tutti::reduce_local(host.data(), a.data(), b.data(), count, type, op);
        DeviceBuffer da(gpu, a.size()), db(gpu, b.size()), dst(gpu, a.size());
        gpu.copy(da.data, a.data(), a.size(), stream);
        gpu.copy(db.data, b.data(), b.size(), stream);
        gpu.reduce_local(dst.data, da.data, db.data, count, type, op, stream);
        gpu.copy(result.data(), dst.data, result.size(), stream);
        synchronize_checked(gpu, stream);
        const std::string what =
            "reduce_local " + std::string(tutti::to_string(type)) + " " + std::string(tutti::to_string(op));
        expect_equal(result, expected, type, what);
        EXPECT_EQ(result, host) << what;
      }
    }
    DeviceBuffer d(gpu, 64);
    std::vector<float> host(16, 1.0f);
    EXPECT_THROW(gpu.reduce_local(d.data, d.data, d.data, 16, DataType::f32, ReduceOp::avg, stream), tutti::Error);
    try {
      gpu.reduce_local(d.data, host.data(), d.data, 16, DataType::f32, ReduceOp::sum, stream);
      ADD_FAILURE() << "reduced a host buffer on the device";
    } catch (const tutti::Error& e) {
      EXPECT_EQ(e.code(), tutti::ErrorCode::invalid_argument) << e.what();
    }
    synchronize_checked(gpu, stream);
    gpu.destroy_stream(stream);
  });
  EXPECT_TRUE(tutti::gpu::device_name(tutti::gpu::DeviceKind::emulated).starts_with("emulated"))  // "(strict)"
      << tutti::gpu::device_name(tutti::gpu::DeviceKind::emulated);
}

}  // namespace
