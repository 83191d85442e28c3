// The public face of the engine: options, handles, and Engine's calls onto EngineCore.
#include "tutti/engine.hpp"

#include <cmath>

#include "core/env.hpp"
#include "engine/engine_core.hpp"

namespace tutti {

using engine_detail::Descriptor;

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

void Handle::wait() {
  if (!state_) return;
  {
    std::unique_lock lock(state_->mutex);
    if (!state_->done) {
      lock.unlock();
      auto bell = state_->doorbell.lock();
      if (bell) {
        ++bell->waiters;
        bell->ring();  // negotiate now rather than at the next cycle
      }
      lock.lock();
      state_->cv.wait(lock, [&] { return state_->done; });
      if (bell) --bell->waiters;
    }
  }
  if (state_->error) std::rethrow_exception(state_->error);
}

bool Handle::test() {
  if (!state_) return true;
  std::lock_guard lock(state_->mutex);
  if (state_->done && state_->error) std::rethrow_exception(state_->error);
  return state_->done;
}

bool Handle::wait_for(std::chrono::milliseconds duration) {
  if (!state_) return true;
  auto bell = state_->doorbell.lock();
  if (bell) {
    ++bell->waiters;
    bell->ring();
  }
  std::unique_lock lock(state_->mutex);
  const bool done = state_->cv.wait_for(lock, duration, [&] { return state_->done; });
  if (bell) --bell->waiters;
  if (!done) return false;
  if (state_->error) std::rethrow_exception(state_->error);
  return true;
}

// ---- Engine ----

Engine::Engine(Communicator& comm, EngineOptions options)
    : core_(std::make_unique<engine_detail::EngineCore>(comm, std::move(options))) {}

Engine::~Engine() = default;

int Engine::rank() const { return core_->rank(); }
int Engine::size() const { return core_->size(); }
const EngineOptions& Engine::options() const { return core_->options(); }

Handle Engine::enqueue_allreduce(std::string_view name, const void* send, void* recv, std::size_t count, DataType type,
                                 ReduceOp op) {
  return core_->enqueue(Descriptor{std::string(name), Collective::allreduce, type, op, 0, count}, send, recv);
}

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

EngineStats Engine::stats() const { return core_->stats(); }
std::vector<CollectiveRecord> Engine::take_allreduce_records() { return core_->take_allreduce_records(); }

}  // namespace tutti
