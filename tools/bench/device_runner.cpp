#include "bench/device_runner.hpp"

#include <algorithm>
#include <cstring>
#include <exception>
#include <vector>

#include "bench/runner.hpp"
#include "gpu/access.hpp"

namespace tutti::bench {

namespace {

using clock = std::chrono::steady_clock;

double seconds_since(clock::time_point start) { return std::chrono::duration<double>(clock::now() - start).count(); }

double min_over_ranks(Communicator& world, double value) { return -max_over_ranks(world, -value); }

// The device address of host address `at`, which lies in `host` (a Buffers storage) mirrored at `device`.
template <class T>
T* mirror(T* at, std::span<std::byte> host, void* device) {
  const auto offset = static_cast<std::size_t>(reinterpret_cast<const std::byte*>(at) - host.data());
  return reinterpret_cast<T*>(static_cast<std::byte*>(device) + offset);
}

}  // namespace

DeviceMemory::DeviceMemory(gpu::Communicator& gpu, std::size_t bytes)
    : gpu_(gpu), pointer_(gpu.allocate(std::max<std::size_t>(1, bytes))), exceptions_(std::uncaught_exceptions()) {}

DeviceMemory::~DeviceMemory() {
  if (std::uncaught_exceptions() == exceptions_) gpu_.free(pointer_);
}

DeviceBuffers::DeviceBuffers(gpu::Communicator& gpu, Buffers& host, const Case& c)
    : gpu_(gpu),
      host_(host),
      in_place_(c.in_place),
      send_storage_(gpu, host.send_storage().size()),
      recv_storage_(gpu, host.recv_storage().size()) {
  send_ = in_place_ ? mirror(host_.send(), host_.recv_storage(), recv_storage_.get())
                    : mirror(host_.send(), host_.send_storage(), send_storage_.get());
  recv_ = mirror(host_.recv(), host_.recv_storage(), recv_storage_.get());
}

void DeviceBuffers::upload(gpu::Stream stream) {
  if (!in_place_) gpu_.copy(send_storage_.get(), host_.send_storage().data(), host_.send_storage().size(), stream);
  gpu_.copy(recv_storage_.get(), host_.recv_storage().data(), host_.recv_storage().size(), stream);
}

void DeviceBuffers::download(gpu::Stream stream) {
  gpu_.copy(host_.recv_storage().data(), recv_storage_.get(), host_.recv_storage().size(), stream);
}

Measure time_stream(DeviceContext& context, const std::function<void()>& op, int warmup, int iterations) {
  for (int i = 0; i < warmup; ++i) op();
  context.synchronize();
  context.world.barrier();
  double enqueue = 0, enqueue_max = 0;
  const auto start = clock::now();
  for (int i = 0; i < iterations; ++i) {
    const auto call = clock::now();
    op();
    const double took = seconds_since(call);
    enqueue += took;
    enqueue_max = std::max(enqueue_max, took);
  }
  context.synchronize();
  const double total = seconds_since(start);
  context.gpu.check();
  Measure m;
  m.time = max_over_ranks(context.world, total / iterations);
  m.enqueue = max_over_ranks(context.world, enqueue / iterations);
  m.enqueue_max = max_over_ranks(context.world, enqueue_max);
  // Free: outside the calls, until the synchronize returned (it only waits for the stream).
  m.idle = min_over_ranks(context.world, total > 0 ? std::max(0.0, 1 - enqueue / total) : 0);
  return m;
}

int choose_stream_iterations(DeviceContext& context, const std::function<void()>& op) {
  return choose_iterations(
      context.world,
      [&] {
        op();
        context.synchronize();
      },
      context.options.iterations);
}

std::size_t check_device(DeviceContext& context, Buffers& host, DeviceBuffers& device, const std::function<void()>& op,
                         bool corrupt) {
  host.prepare();
  device.upload(context.stream);
  context.synchronize();
  context.world.barrier();
  op();
  context.synchronize();
  context.gpu.check();
  // Whatever the host holds now (the sync peer's own result, say) must not pass for the device's.
  std::memset(host.recv_storage().data(), 0x5a, host.recv_storage().size());
  device.download(context.stream);
  context.synchronize();
  if (corrupt && context.world.rank() == 0) host.corrupt();
  auto wrong = static_cast<std::uint64_t>(host.count_wrong());
  context.world.allreduce(std::span<std::uint64_t>(&wrong, 1), ReduceOp::sum);
  return static_cast<std::size_t>(wrong);
}

void run_sync(DeviceContext& context, const Case& c, Buffers& host, DeviceBuffers& device) {
  const int rank = context.world.rank();
  // What an MPI + CUDA program copies: the input where this rank has one, the output where it gets one.
  const bool has_input = !(c.kind == Collective::broadcast && rank != c.root);
  const bool has_output = !(c.kind == Collective::reduce && rank != c.root);
  const std::span<std::byte> input = c.in_place ? host.recv_storage() : host.send_storage();
  context.synchronize();
  if (has_input) {
    context.gpu.copy(input.data(), device.input_storage(), input.size(), context.stream);
    context.synchronize();
  }
  run_tutti(context.world, c, host, Algorithm::automatic);
  if (has_output) {
    context.gpu.copy(device.output_storage(), host.recv_storage().data(), host.recv_storage().size(), context.stream);
    context.synchronize();
  }
}

double time_copy(DeviceContext& context, std::size_t bytes) {
  const DeviceMemory from(context.gpu, bytes), to(context.gpu, bytes);
  const auto copy = [&] { context.gpu.copy(to.get(), from.get(), bytes, context.stream); };
  return time_stream(context, copy, context.options.warmup, choose_stream_iterations(context, copy)).time;
}

Overlap time_overlap(DeviceContext& context, const std::function<void()>& op, double alone) {
  device::Device& device = gpu::detail::Access::impl(context.gpu)->device();
  const gpu::Stream second = context.gpu.create_stream();
  // Up to 1 Mi f32 elements (enough threads to fill a GPU); the rounds set the time, and where one
  // round of them all takes longer than `alone` (the emulated device), fewer elements do.
  constexpr std::size_t most = std::size_t{1} << 20;
  std::size_t count = most;
  DeviceMemory memory(context.gpu, most * sizeof(float));
  auto* data = static_cast<float*>(memory.get());
  const std::vector<float> ones(most, 1.0f);
  context.gpu.copy(data, ones.data(), most * sizeof(float), second);
  const auto wait_second = [&] { context.gpu.synchronize(second, stream_deadline); };
  wait_second();  // `ones` is read by then
  // Seconds per call of `calls` back to back (and a synchronize of both streams), max over ranks.
  const auto timed = [&](int rounds, int calls, bool with_op) {
    wait_second();
    context.synchronize();
    context.world.barrier();
    const auto start = clock::now();
    for (int i = 0; i < calls; ++i) {
      device.compute(data, count, rounds, device::Stream{second});
      if (with_op) op();
    }
    wait_second();
    context.synchronize();
    const double each = seconds_since(start) / calls;
    context.gpu.check();
    return max_over_ranks(context.world, each);
  };
  // Calibration: double the rounds until four computes take a tenth of `alone` each or more, then
  // scale the work (elements x rounds) to `alone`; the same on every rank (max_over_ranks).
  int rounds = 16;
  double took = timed(rounds, 4, false);
  while (took < alone / 10 && rounds < (1 << 24)) took = timed(rounds *= 2, 4, false);
  const double work = static_cast<double>(count) * rounds * alone / std::max(took, 1e-9);
  if (work >= static_cast<double>(count)) {
    rounds = static_cast<int>(std::min(work / static_cast<double>(count), double{1 << 30}));
  } else {
    rounds = 1;
    count = std::max<std::size_t>(256, static_cast<std::size_t>(work));
  }
  const int calls = std::clamp(static_cast<int>(0.05 / std::max(alone, 1e-9)), 3, 200);
  Overlap result;
  timed(rounds, 1, true);  // warm-up of the pair
  result.compute = timed(rounds, calls, false);
  result.both = timed(rounds, calls, true);
  context.gpu.destroy_stream(second);
  return result;
}

}  // namespace tutti::bench
