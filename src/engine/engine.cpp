// The public face of the engine: options, handles, and Engine's calls onto EngineCore.
#include "tutti/engine.hpp"

#include <algorithm>
#include <cmath>
#include <optional>
#include <thread>

#include "core/env.hpp"
#include "engine/engine_core.hpp"
#include "gpu/access.hpp"
#include "gpu/gpu_impl.hpp"

namespace tutti {

using engine::Descriptor;

namespace {

double parse_seconds(const std::string& text, const char* what) {
  std::size_t used = 0;
  double value = -1;
  try {
    value = std::stod(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  // The bound keeps value × 1000 (or × 10^6) inside the 64-bit durations it becomes: beyond it,
  // llround's result is unspecified (a negative cycle or stall time).
  constexpr double max_value = 1e9;
  if (used != text.size() || !std::isfinite(value) || value < 0 || value > max_value)
    throw Error(ErrorCode::invalid_argument,
                std::string(what) + ": expected a non-negative number up to 1e9, got '" + text + "'");
  return value;
}

}  // namespace

EngineOptions EngineOptions::from_environment() {
  EngineOptions o;
  using std::chrono::duration;
  if (auto v = core::env("TUTTI_CYCLE_TIME_MS")) {
    const double ms = parse_seconds(*v, "TUTTI_CYCLE_TIME_MS");
    o.cycle_time = std::chrono::microseconds(static_cast<long long>(std::llround(ms * 1000.0)));
  }
  if (auto v = core::env("TUTTI_FUSION_THRESHOLD"))
    o.fusion_threshold = static_cast<std::size_t>(core::parse_count(*v, "TUTTI_FUSION_THRESHOLD"));
  if (auto v = core::env("TUTTI_FIRST_BUCKET_BYTES"))
    o.first_bucket_bytes = static_cast<std::size_t>(core::parse_count(*v, "TUTTI_FIRST_BUCKET_BYTES"));
  if (auto v = core::env("TUTTI_STALL_WARNING_S"))
    o.stall_warning = std::chrono::milliseconds(std::llround(parse_seconds(*v, "TUTTI_STALL_WARNING_S") * 1000.0));
  if (auto v = core::env("TUTTI_STALL_SHUTDOWN_S"))
    o.stall_error = std::chrono::milliseconds(std::llround(parse_seconds(*v, "TUTTI_STALL_SHUTDOWN_S") * 1000.0));
  if (auto v = core::env("TUTTI_TIMELINE")) o.timeline_path = *v;
  return o;
}

// ---- Handle ----

namespace {

using engine::TensorState;

// Waits until the tensor completed and its result is in place (a device tensor: its stream
// copied it back); false if `deadline` passed first. Throws the tensor's error.
bool wait_until(TensorState& s, std::optional<engine::Clock::time_point> deadline) {
  std::unique_lock lock(s.mutex);
  if (!s.done) {
    lock.unlock();
    auto bell = s.doorbell.lock();
    if (bell) {
      ++bell->waiters;
      bell->ring();  // negotiate now rather than at the next cycle
    }
    lock.lock();
    bool done = true;
    if (deadline)
      done = s.cv.wait_until(lock, *deadline, [&] { return s.done; });
    else
      s.cv.wait(lock, [&] { return s.done; });
    if (bell) --bell->waiters;
    if (!done) return false;
  }
  if (s.error) std::rethrow_exception(s.error);
  // A device tensor: its stream copies the result back once released, unless the stream is still
  // busy with earlier work. Naps that grow to 200 µs: a busy stream costs the host almost nothing.
  std::chrono::microseconds nap{1};
  while (!s.copied_back()) {
    if (deadline && engine::Clock::now() >= *deadline) return false;
    lock.unlock();
    std::this_thread::sleep_for(nap);
    nap = std::min(nap * 2, std::chrono::microseconds{200});
    lock.lock();
  }
  return true;
}

}  // namespace

void Handle::wait() {
  if (state_) wait_until(*state_, std::nullopt);
}

bool Handle::test() {
  if (!state_) return true;
  std::lock_guard lock(state_->mutex);
  if (state_->done && state_->error) std::rethrow_exception(state_->error);
  return state_->done && state_->copied_back();
}

bool Handle::wait_for(std::chrono::milliseconds duration) {
  if (!state_) return true;
  return wait_until(*state_, engine::Clock::now() + duration);
}

// ---- Engine ----

Engine::Engine(Communicator& comm, EngineOptions options)
    : core_(std::make_unique<engine::EngineCore>(comm, std::move(options))) {}

namespace {

device::Device& device_of(gpu::Communicator& gpu) {
  if (gpu::detail::Access::impl(gpu) == nullptr)
    throw Error(ErrorCode::invalid_argument, "engine: the gpu::Communicator was moved from");
  return gpu::detail::Access::impl(gpu)->device();
}

}  // namespace

Engine::Engine(Communicator& comm, gpu::Communicator& gpu, EngineOptions options)
    : core_(std::make_unique<engine::EngineCore>(comm, std::move(options), &device_of(gpu))) {}

Engine::~Engine() = default;

int Engine::rank() const { return core_->rank(); }
int Engine::size() const { return core_->size(); }
const EngineOptions& Engine::options() const { return core_->options(); }

Handle Engine::enqueue_allreduce(std::string_view name, const void* send, void* recv, std::size_t count, DataType type,
                                 ReduceOp op) {
  return core_->enqueue(Descriptor{std::string(name), Collective::allreduce, type, op, 0, count}, send, recv);
}

Handle Engine::enqueue_allreduce(std::string_view name, const void* send, void* recv,
                                 std::span<const std::int64_t> dims, DataType type, ReduceOp op) {
  if (dims.size() > engine::kMaxDims)
    throw Error(ErrorCode::invalid_argument, "engine: enqueue_allreduce '" + std::string(name) +
                                                 "': " + std::to_string(dims.size()) + " dimensions (at most " +
                                                 std::to_string(engine::kMaxDims) + ")");
  std::uint64_t count = 1;
  for (auto n : dims) {
    if (n < 0)
      throw Error(ErrorCode::invalid_argument,
                  "engine: enqueue_allreduce '" + std::string(name) + "': a negative dimension");
    count *= static_cast<std::uint64_t>(n);
  }
  Descriptor d{std::string(name), Collective::allreduce, type, op, 0, count};
  d.dims.assign(dims.begin(), dims.end());
  return core_->enqueue(std::move(d), send, recv);
}

Handle Engine::enqueue_allreduce(std::string_view name, const void* send, void* recv, std::size_t count, DataType type,
                                 ReduceOp op, gpu::Stream stream) {
  return core_->enqueue_on_stream(Descriptor{std::string(name), Collective::allreduce, type, op, 0, count}, send, recv,
                                  device::Stream{stream});
}

void Engine::check() { core_->check(); }

Handle Engine::join() { return core_->join(); }

int Engine::last_joined() const { return core_->last_joined(); }

Handle Engine::enqueue_allgather(std::string_view name, const void* send, void* recv, std::size_t count,
                                 DataType type) {
  return core_->enqueue(Descriptor{std::string(name), Collective::allgather, type, ReduceOp::sum, 0, count}, send,
                        recv);
}

Handle Engine::enqueue_broadcast(std::string_view name, void* buffer, std::size_t count, DataType type, int root) {
  return core_->enqueue(Descriptor{std::string(name), Collective::broadcast, type, ReduceOp::sum, root, count}, buffer,
                        buffer);
}

void Engine::flush() { core_->flush(); }

void Engine::record_phase(std::string_view name, std::chrono::steady_clock::time_point start,
                          std::chrono::steady_clock::time_point end) {
  core_->record_phase(name, start, end);
}

void Engine::start_timeline(const std::string& path, bool mark_cycles) { core_->start_timeline(path, mark_cycles); }
void Engine::stop_timeline() { core_->stop_timeline(); }

EngineStats Engine::stats() const { return core_->stats(); }
std::vector<CollectiveRecord> Engine::take_allreduce_records() { return core_->take_allreduce_records(); }

}  // namespace tutti
