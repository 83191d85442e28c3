// The training engine with device tensors enqueued on a stream, on the emulated device (labels
// emulated and unit): ranks are threads over the in-process transport, each with its own emulated
// gpu::Communicator (the engine's device) and its own streams. Results are checked exactly on
// every element of every rank; the stream rules are checked with flags (a stream held by
// wait_value on a flag the test controls), never with a timing; every wait has a deadline.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <numeric>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "device/device.hpp"
#include "gpu/gpu_impl.hpp"
#include "gpu_harness.hpp"
#include "harness.hpp"
#include "test_waits.hpp"
#include "tutti/engine.hpp"
#include "tutti/gpu.hpp"

namespace {

using tutti::DataType;
using tutti::Engine;
using tutti::EngineOptions;
using tutti::ErrorCode;
using tutti::Handle;
using tutti::ReduceOp;
using tutti::gpu::DeviceKind;
using tutti::gpu::Stream;
using tutti::testing::error_code_of;
using tutti::testing::input_value;
using tutti::testing::reference_reduction;
using namespace std::chrono_literals;

using tutti::testing::gpu::Bytes;
using tutti::testing::gpu::deadline;
using tutti::testing::gpu::device_of;
using tutti::testing::gpu::values;

EngineOptions quiet(std::chrono::microseconds cycle = 1000us) {
  EngineOptions o;
  o.cycle_time = cycle;
  return o;
}

// Runs fn(host, gpu, rank) on p threads, one per rank, each with a gpu::Communicator on the test
// device (emulated, or CUDA device 0 with TUTTI_TEST_GPU_DEVICE=cuda, as scripts/gpu_check.sh's
// engine stage runs it). The engine is made by fn (after gpu, so that it goes before gpu does).
void run_gpu_ranks(int p, const std::function<void(tutti::Communicator&, tutti::gpu::Communicator&, int)>& fn) {
  auto hosts = tutti::local_group(p);
  const std::string failures = tutti::testing::on_threads(p, [&](int r) {
    tutti::gpu::Communicator gpu(hosts[static_cast<std::size_t>(r)], tutti::testing::gpu::test_device_kind());
    fn(hosts[static_cast<std::size_t>(r)], gpu, r);
  });
  EXPECT_EQ(failures, "");
}

// A device buffer of `bytes` bytes (at least 1, so that count 0 still has an address).
struct DeviceBuffer {
  tutti::gpu::Communicator& gpu;
  void* data;
  DeviceBuffer(tutti::gpu::Communicator& g, std::size_t bytes)
      : gpu(g), data(g.allocate(std::max<std::size_t>(bytes, 1))) {}
  ~DeviceBuffer() { gpu.free(data); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
};

// A pinned word the test controls: a stream held by wait_value(hold, 1) waits until release().
struct Hold {
  tutti::device::Device& device;
  std::uint32_t* flags;
  explicit Hold(tutti::device::Device& d) : device(d), flags(static_cast<std::uint32_t*>(d.allocate_pinned(64))) {}
  ~Hold() {
    release();
    device.free_pinned(flags);
  }
  Hold(const Hold&) = delete;
  Hold& operator=(const Hold&) = delete;
  std::uint32_t* hold() const { return flags; }
  std::uint32_t* marker() const { return flags + 8; }
  void release() { device.set_flag(flags, 1); }
};

// Throws (through the harness, naming the rank) at the first element that differs.
void expect_equal(const Bytes& got, const Bytes& want, DataType type, const std::string& what) {
  const std::size_t es = tutti::size_of(type);
  if (got.size() != want.size()) throw std::runtime_error(what + ": wrong size");
  for (std::size_t i = 0; i < want.size(); i += es)
    if (std::memcmp(got.data() + i, want.data() + i, es) != 0)
      throw std::runtime_error(what + ": element " + std::to_string(i / es) + " is " +
                               std::to_string(tutti::testing::load(type, got.data() + i)) + ", expected " +
                               std::to_string(tutti::testing::load(type, want.data() + i)));
}

// One device tensor of a test: its input, its device buffers, and where the stream copies the
// result to.
struct Tensor {
  std::string name;
  DataType type;
  ReduceOp op;
  std::size_t count;
  bool in_place;
  Bytes input, expected, result;
  std::unique_ptr<DeviceBuffer> send, recv;
  Handle handle;
};

Tensor make_tensor(tutti::gpu::Communicator& gpu, int k, int p, int r) {
  constexpr DataType types[] = {DataType::f32, DataType::i32, DataType::f64, DataType::i64, DataType::bf16};
  constexpr ReduceOp ops[] = {ReduceOp::sum, ReduceOp::max, ReduceOp::avg, ReduceOp::min, ReduceOp::prod};
  constexpr std::size_t counts[] = {1, 4099, 0, 17, 100003, 3, 1000};
  Tensor t;
  t.name = "grad." + std::to_string(k);
  t.type = types[k % 5];
  t.op = ops[(k / 2) % 5];
  t.count = k == 5 ? static_cast<std::size_t>(p + 1) : counts[k % 7];
  t.in_place = k % 3 != 1;
  t.input = values(t.type, t.count, [&](std::size_t i) { return input_value(t.type, t.op, r, i + k); });
  t.expected = values(t.type, t.count, [&](std::size_t i) { return reference_reduction(t.type, t.op, p, i + k); });
  t.result.assign(t.input.size(), std::byte{0x5A});
  t.send = std::make_unique<DeviceBuffer>(gpu, t.input.size());
  if (!t.in_place) t.recv = std::make_unique<DeviceBuffer>(gpu, t.input.size());
  return t;
}

void* output_of(Tensor& t) { return t.in_place ? t.send->data : t.recv->data; }

// On `stream`: the input in (and poison in an out-of-place output), the allreduce, the result out.
void enqueue_tensor(Engine& engine, tutti::gpu::Communicator& gpu, Tensor& t, Stream stream) {
  static const Bytes poison(1 << 20, std::byte{tutti::testing::poison});
  gpu.copy(t.send->data, t.input.data(), t.input.size(), stream);
  if (!t.in_place) gpu.copy(t.recv->data, poison.data(), std::min(poison.size(), t.input.size()), stream);
  t.handle = engine.enqueue_allreduce(t.name, t.send->data, output_of(t), t.count, t.type, t.op, stream);
  gpu.copy(t.result.data(), output_of(t), t.result.size(), stream);
}

// (a) Several device tensors (types, ops, counts 0 to 100003, in and out of place) and host
// tensors, enqueued in a different order on every rank, on one stream and on two: every element
// of every rank is right, read back after the streams alone (no handle waited on) and after
// Handle::wait. The tensors of one stream come in the same order on every rank (each waits on
// the stream for the one before it: the stream rule), but the calls interleave differently across
// the streams and the host tensors on every rank, which the negotiation sorts out.
TEST(EngineGpu, DeviceTensorsInDifferentOrdersOnOneAndTwoStreams) {
  constexpr int tensors = 12, host_tensors = 4;
  for (int p : {1, 2, 3, 4}) {
    for (int streams : {1, 2}) {
      SCOPED_TRACE("p = " + std::to_string(p) + ", streams = " + std::to_string(streams));
      run_gpu_ranks(p, [&](tutti::Communicator& host, tutti::gpu::Communicator& gpu, int r) {
        Engine engine(host, gpu, quiet());
        const Stream s[2] = {gpu.create_stream(), gpu.create_stream()};
        std::vector<Tensor> ts;
        for (int k = 0; k < tensors; ++k) ts.push_back(make_tensor(gpu, k, p, r));
        std::vector<std::vector<std::int64_t>> hs(host_tensors);
        for (int step = 0; step < 2; ++step) {  // the second step finds the names in the response cache
          // Which queue each call takes from: a stream (its next tensor) or a host tensor.
          std::vector<int> choices;
          for (int k = 0; k < tensors; ++k) choices.push_back(k % streams);
          for (int h = 0; h < host_tensors; ++h) choices.push_back(-1 - h);
          std::shuffle(choices.begin(), choices.end(), std::mt19937(static_cast<unsigned>(r * 10 + step)));
          int next[2] = {0, 1};
          std::vector<Handle> host_handles;
          for (int c : choices) {
            if (c < 0) {
              const int h = -1 - c;
              auto& x = hs[static_cast<std::size_t>(h)];
              x.assign(100 + static_cast<std::size_t>(h), r + h + step);
              host_handles.push_back(engine.enqueue_allreduce("host." + std::to_string(h), x.data(), x.size(),
                                                              DataType::i64, ReduceOp::sum));
              continue;
            }
            auto& t = ts[static_cast<std::size_t>(next[c])];
            next[c] += streams;
            std::fill(t.result.begin(), t.result.end(), std::byte{0x5A});
            enqueue_tensor(engine, gpu, t, s[c]);
          }
          for (auto& h : host_handles)
            if (!h.wait_for(deadline)) throw std::runtime_error("a host tensor did not complete");
          for (int h = 0; h < host_tensors; ++h)
            if (hs[static_cast<std::size_t>(h)] !=
                std::vector<std::int64_t>(100 + static_cast<std::size_t>(h), p * (p - 1) / 2 + p * (h + step)))
              throw std::runtime_error("host." + std::to_string(h) + " is wrong");
          if (step == 1) {
            for (auto& t : ts)
              if (!t.handle.wait_for(deadline)) throw std::runtime_error(t.name + ": the handle did not complete");
            // The handle's wait covers the copy back: a copy enqueued now on another stream sees it.
            const Stream fresh = gpu.create_stream();
            std::vector<Bytes> readback;
            for (auto& t : ts) {
              readback.emplace_back(t.result.size());
              gpu.copy(readback.back().data(), output_of(t), t.result.size(), fresh);
            }
            gpu.synchronize(fresh, deadline);
            gpu.destroy_stream(fresh);
            for (std::size_t k = 0; k < ts.size(); ++k)
              expect_equal(readback[k], ts[k].expected, ts[k].type, "after Handle::wait " + ts[k].name);
          }
          for (const Stream stream : s) gpu.synchronize(stream, deadline);
          engine.check();
          for (auto& t : ts) expect_equal(t.result, t.expected, t.type, "step " + std::to_string(step) + " " + t.name);
        }
        for (const Stream stream : s) gpu.destroy_stream(stream);
      });
    }
  }
}

// (b) A stream held (wait_value on a flag the test controls) before the input is copied in, on
// rank 0 only: the enqueue returns, the tensor does not complete on any rank, a marker written
// after it on the stream stays unwritten, and a host tensor goes through meanwhile (the engine
// thread never waits for one tensor). Once released, the result is right on every rank.
TEST(EngineGpu, HeldStreamHoldsOnlyItsTensor) {
  for (int p : {2, 3}) {
    SCOPED_TRACE("p = " + std::to_string(p));
    std::atomic<int> checked{0};
    run_gpu_ranks(p, [&](tutti::Communicator& host, tutti::gpu::Communicator& gpu, int r) {
      Engine engine(host, gpu, quiet());
      auto& device = device_of(gpu);
      Hold hold(device);
      const Stream stream = gpu.create_stream();
      Tensor t = make_tensor(gpu, 1, p, r);
      if (r == 0) device.wait_value(hold.hold(), 1, {stream});
      enqueue_tensor(engine, gpu, t, stream);
      device.write_value(hold.marker(), 1, {stream});
      // A host tensor completes while rank 0's device tensor waits for its stream.
      std::vector<std::int32_t> x(5, r + 1);
      if (!engine.enqueue_allreduce("host", x.data(), x.size(), DataType::i32, ReduceOp::sum).wait_for(deadline))
        throw std::runtime_error("the host tensor did not complete while a stream was held");
      if (x != std::vector<std::int32_t>(5, p * (p + 1) / 2)) throw std::runtime_error("host tensor wrong");
      if (t.handle.test()) throw std::runtime_error("the device tensor completed while rank 0's stream was held");
      if (r == 0 && tutti::device::Device::load_flag(hold.marker()) != 0)
        throw std::runtime_error("the marker ran before the release");
      ++checked;
      if (r == 0) {
        if (!tutti::testing::eventually([&] { return checked.load() == p; }, deadline))
          throw std::runtime_error("the other ranks did not check");
        hold.release();
      }
      gpu.synchronize(stream, deadline);
      if (tutti::device::Device::load_flag(hold.marker()) != 1) throw std::runtime_error("the marker did not run");
      t.handle.wait();
      expect_equal(t.result, t.expected, t.type, "held tensor");
      gpu.destroy_stream(stream);
    });
  }
}

// (c) Host and device tensors of one type and op in one step are fused into one allreduce. Each
// device tensor has a stream of its own (on one stream, each would wait for the one before it),
// and nothing waits until the engine's first cycle, so every rank has enqueued and staged all of
// them by then.
TEST(EngineGpu, HostAndDeviceTensorsFuseInOneStep) {
  constexpr int each = 6;
  run_gpu_ranks(3, [&](tutti::Communicator& host, tutti::gpu::Communicator& gpu, int r) {
    Engine engine(host, gpu, quiet(500'000us));
    std::vector<Stream> streams;
    std::vector<Tensor> ts;
    std::vector<std::vector<float>> hs(each);
    std::vector<Handle> handles;
    for (int k = 0; k < each; ++k) {
      Tensor t;
      t.name = "dev." + std::to_string(k);
      t.type = DataType::f32;
      t.op = ReduceOp::sum;
      t.count = 100 + static_cast<std::size_t>(k);
      t.in_place = true;
      t.input = values(t.type, t.count, [&](std::size_t i) { return input_value(t.type, t.op, r, i + k); });
      t.expected = values(t.type, t.count, [&](std::size_t i) { return reference_reduction(t.type, t.op, 3, i + k); });
      t.result.assign(t.input.size(), std::byte{0});
      t.send = std::make_unique<DeviceBuffer>(gpu, t.input.size());
      ts.push_back(std::move(t));
      streams.push_back(gpu.create_stream());
    }
    // Interleaved, in another order on every rank.
    std::vector<int> order(2 * each);
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), std::mt19937(static_cast<unsigned>(r)));
    for (int k : order) {
      if (k < each) {
        enqueue_tensor(engine, gpu, ts[static_cast<std::size_t>(k)], streams[static_cast<std::size_t>(k)]);
      } else {
        auto& h = hs[static_cast<std::size_t>(k - each)];
        h.assign(50, static_cast<float>(r + k));
        handles.push_back(engine.enqueue_allreduce("host." + std::to_string(k - each), h.data(), h.size(),
                                                   DataType::f32, ReduceOp::sum));
      }
    }
    // Waiting on the streams does not make the engine negotiate early (a Handle::wait would).
    for (const Stream stream : streams) gpu.synchronize(stream, deadline);
    for (auto& h : handles)
      if (!h.wait_for(deadline)) throw std::runtime_error("a host tensor did not complete");
    engine.check();
    for (auto& t : ts) expect_equal(t.result, t.expected, t.type, t.name);
    for (int k = 0; k < each; ++k)
      if (hs[static_cast<std::size_t>(k)] != std::vector<float>(50, static_cast<float>(3 * (k + each) + 3)))
        throw std::runtime_error("host." + std::to_string(k) + " is wrong");
    const auto stats = engine.stats();
    EXPECT_EQ(stats.tensors, 2u * each);
    EXPECT_EQ(stats.collectives, 1u) << "host and device tensors were not fused into one allreduce";
    for (const Stream stream : streams) gpu.destroy_stream(stream);
  });
}

// (d) Argument errors raise invalid_argument from the call and enqueue nothing: an engine without
// a device, host memory, a buffer past its allocation, a stream of no device, a name already
// pending, a null buffer. The engine goes on: the next tensor is right.
TEST(EngineGpu, BadCallsAreRefusedAndEnqueueNothing) {
  run_gpu_ranks(2, [&](tutti::Communicator& host, tutti::gpu::Communicator& gpu, int r) {
    const Stream stream = gpu.create_stream();
    DeviceBuffer data(gpu, 64 * 4);
    {
      Engine plain(host, quiet());
      std::string message;
      EXPECT_EQ(
          error_code_of([&] { plain.enqueue_allreduce("x", data.data, 64, DataType::f32, ReduceOp::sum, stream); },
                        &message),
          ErrorCode::invalid_argument);
      EXPECT_NE(message.find("no device"), std::string::npos) << message;
    }
    Engine engine(host, gpu, quiet());
    std::vector<float> on_host(64);
    auto refused = [&](const std::function<void()>& call, const char* what) {
      if (error_code_of(call) != ErrorCode::invalid_argument) throw std::runtime_error(std::string(what) + " passed");
    };
    refused([&] { engine.enqueue_allreduce("a", on_host.data(), 64, DataType::f32, ReduceOp::sum, stream); }, "host");
    refused([&] { engine.enqueue_allreduce("a", data.data, 65, DataType::f32, ReduceOp::sum, stream); }, "too long");
    refused([&] { engine.enqueue_allreduce("a", nullptr, 4, DataType::f32, ReduceOp::sum, stream); }, "null");
    refused([&] { engine.enqueue_allreduce("", data.data, 4, DataType::f32, ReduceOp::sum, stream); }, "no name");
    // The emulated device knows its streams; a CUDA stream is any cudaStream_t, which CUDA cannot
    // check (a pointer that is no stream crashes inside the driver, as it would in CUDA itself).
    if (tutti::testing::gpu::test_device_kind() == DeviceKind::emulated) {
      int not_a_stream = 0;
      refused([&] { engine.enqueue_allreduce("a", data.data, 4, DataType::f32, ReduceOp::sum, &not_a_stream); },
              "a stream of no device");
    }
    // The name of a refused call is free again, and a pending name is refused.
    Hold hold(device_of(gpu));
    device_of(gpu).wait_value(hold.hold(), 1, {stream});
    const Bytes input = values(DataType::f32, 64, [&](std::size_t i) { return static_cast<double>(i + r); });
    gpu.copy(data.data, input.data(), input.size(), stream);
    Handle h = engine.enqueue_allreduce("a", data.data, 64, DataType::f32, ReduceOp::sum, stream);
    refused([&] { engine.enqueue_allreduce("a", data.data, 64, DataType::f32, ReduceOp::sum, stream); }, "pending");
    Bytes result(input.size());
    gpu.copy(result.data(), data.data, result.size(), stream);
    hold.release();
    if (!h.wait_for(deadline)) throw std::runtime_error("did not complete");
    gpu.synchronize(stream, deadline);
    expect_equal(result, values(DataType::f32, 64, [&](std::size_t i) { return static_cast<double>(2 * i + 1); }),
                 DataType::f32, "after the refused calls");
    engine.check();
    gpu.destroy_stream(stream);
  });
}

// (e) Failures after the call returned release the stream, and are raised by the handle, by
// check() and by the next call with a stream (which enqueues nothing): a peer that never enqueues
// the name (the stall limit), and a count mismatch. Host tensors go on.
TEST(EngineGpu, FailuresReleaseTheStreamAndAreRaisedLater) {
  struct Case {
    const char* what;
    ErrorCode code;
  };
  for (const Case c : {Case{"stall", ErrorCode::timeout}, Case{"mismatch", ErrorCode::mismatch}}) {
    SCOPED_TRACE(c.what);
    run_gpu_ranks(2, [&](tutti::Communicator& host, tutti::gpu::Communicator& gpu, int r) {
      EngineOptions o = quiet();
      o.stall_warning = 0ms;
      o.stall_error = 200ms;
      Engine engine(host, gpu, o);
      const Stream stream = gpu.create_stream();
      DeviceBuffer data(gpu, 64 * 4);
      Hold hold(device_of(gpu));
      const bool mismatch = c.code == ErrorCode::mismatch;
      if (mismatch || r == 1) {
        const std::size_t count = mismatch ? static_cast<std::size_t>(10 + r) : 64;
        Handle h = engine.enqueue_allreduce("bad", data.data, count, DataType::f32, ReduceOp::sum, stream);
        device_of(gpu).write_value(hold.marker(), 1, {stream});
        gpu.synchronize(stream, deadline);  // released: Error(timeout) from synchronize itself if not
        if (tutti::device::Device::load_flag(hold.marker()) != 1) throw std::runtime_error("the stream was held");
        std::string message;
        if (error_code_of([&] { h.wait(); }, &message) != c.code) throw std::runtime_error("handle: " + message);
        if (error_code_of([&] { engine.check(); }, &message) != c.code) throw std::runtime_error("check: " + message);
        if (error_code_of([&] {
              engine.enqueue_allreduce("next", data.data, 4, DataType::f32, ReduceOp::sum, stream);
            }) != c.code)
          throw std::runtime_error("the next call did not raise it");
        // Nothing was enqueued by the refused call: the stream is free at once.
        gpu.synchronize(stream, deadline);
      }
      host.barrier();
      std::vector<float> x(3, 1.f);
      if (!engine.enqueue_allreduce("after", x.data(), 3, DataType::f32, ReduceOp::sum).wait_for(deadline))
        throw std::runtime_error("the host tensor after the failure did not complete");
      if (x != std::vector<float>(3, 2.f)) throw std::runtime_error("the host tensor after the failure is wrong");
      gpu.destroy_stream(stream);
    });
  }
}

// (e) Opposite orders on one stream (rank 0: a then b; rank 1: b then a) cannot complete: each
// stream waits for a tensor whose peer has not staged it yet. The stall limit fails the first
// tensor on each rank and releases the streams. Once a rank's first tensor failed, its stream
// stages the second, which may then meet the other rank's first one and complete (then exact):
// so each handle either raises timeout or holds the exact sum, and every rank has a timeout.
TEST(EngineGpu, OppositeOrdersOnOneStreamFailAtTheStallLimit) {
  run_gpu_ranks(2, [&](tutti::Communicator& host, tutti::gpu::Communicator& gpu, int r) {
    EngineOptions o = quiet();
    o.stall_warning = 0ms;
    o.stall_error = 200ms;
    Engine engine(host, gpu, o);
    const Stream stream = gpu.create_stream();
    DeviceBuffer a(gpu, 8 * 4), b(gpu, 8 * 4);
    const std::vector<float> ones(8, 1.f), twos(8, 2.f);
    gpu.copy(a.data, ones.data(), 8 * 4, stream);
    gpu.copy(b.data, twos.data(), 8 * 4, stream);
    Handle first =
        engine.enqueue_allreduce(r == 0 ? "a" : "b", r == 0 ? a.data : b.data, 8, DataType::f32, ReduceOp::sum, stream);
    Handle second =
        engine.enqueue_allreduce(r == 0 ? "b" : "a", r == 0 ? b.data : a.data, 8, DataType::f32, ReduceOp::sum, stream);
    std::vector<float> got_a(8), got_b(8);
    gpu.copy(got_a.data(), a.data, 8 * 4, stream);
    gpu.copy(got_b.data(), b.data, 8 * 4, stream);
    gpu.synchronize(stream, deadline);  // released: Error(timeout) from synchronize itself if not
    int timeouts = 0;
    const auto outcome = [&](Handle& h, bool is_a) {
      try {
        h.wait();
      } catch (const tutti::Error& error) {
        if (error.code() != ErrorCode::timeout) throw std::runtime_error(std::string("not a timeout: ") + error.what());
        ++timeouts;
        return;
      }
      if ((is_a ? got_a : got_b) != std::vector<float>(8, is_a ? 2.f : 4.f))
        throw std::runtime_error(std::string("tensor ") + (is_a ? "a" : "b") + " completed with a wrong sum");
    };
    outcome(first, r == 0);
    outcome(second, r != 0);
    if (timeouts == 0) throw std::runtime_error("no tensor failed at the stall limit");
    gpu.destroy_stream(stream);
  });
}

// (f) Engines destroyed while a device tensor waits: rank 0's stream is still held before its
// input, so the tensor never ran. The destructors return (they never wait for a stream), the
// handle raises aborted, and rank 0's stream, once its hold is lifted, runs to its end.
TEST(EngineGpu, DestroyingTheEngineReleasesItsStreams) {
  run_gpu_ranks(2, [&](tutti::Communicator& host, tutti::gpu::Communicator& gpu, int r) {
    const Stream stream = gpu.create_stream();
    Hold hold(device_of(gpu));
    DeviceBuffer data(gpu, 16 * 4);
    Handle h;
    {
      Engine engine(host, gpu, quiet());
      if (r == 0) device_of(gpu).wait_value(hold.hold(), 1, {stream});
      h = engine.enqueue_allreduce("orphan", data.data, 16, DataType::f32, ReduceOp::sum, stream);
      device_of(gpu).write_value(hold.marker(), 1, {stream});
    }
    if (error_code_of([&] { h.wait(); }) != ErrorCode::aborted) throw std::runtime_error("not aborted");
    hold.release();
    gpu.synchronize(stream, deadline);
    if (tutti::device::Device::load_flag(hold.marker()) != 1) throw std::runtime_error("the marker did not run");
    gpu.destroy_stream(stream);
  });
}

// (f) A rank whose engine is destroyed by an exception stops every rank's engine: a device tensor
// that the other rank had enqueued fails with aborted and its stream is released.
TEST(EngineGpu, AnEngineStoppedByAPeerReleasesTheStream) {
  run_gpu_ranks(2, [&](tutti::Communicator& host, tutti::gpu::Communicator& gpu, int r) {
    if (r == 1) {
      try {
        Engine engine(host, gpu, quiet());
        throw std::runtime_error("the model diverged");
      } catch (const std::runtime_error&) {
      }
      return;
    }
    Engine engine(host, gpu, quiet());
    const Stream stream = gpu.create_stream();
    DeviceBuffer data(gpu, 16 * 4);
    // The call itself raises aborted if the engine has already stopped (then it enqueued nothing).
    const ErrorCode code = error_code_of([&] {
      Handle h = engine.enqueue_allreduce("x", data.data, 16, DataType::f32, ReduceOp::sum, stream);
      gpu.synchronize(stream, deadline);
      h.wait();
    });
    if (code != ErrorCode::aborted) throw std::runtime_error("not aborted");
    gpu.synchronize(stream, deadline);
    if (error_code_of([&] { engine.check(); }) != ErrorCode::aborted) throw std::runtime_error("check passed");
    gpu.destroy_stream(stream);
  });
}

}  // namespace
