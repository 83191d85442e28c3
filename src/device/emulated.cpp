#include "device/emulated.hpp"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "device/checks.hpp"
#include "device/emulated_errors.hpp"
#include "reduce/reduce.hpp"

namespace tutti::device {

using detail::address;
using detail::invalid;

EmulatedDevice::EmulatedDevice(bool strict, int ordinal) {
  if (strict) context_ = detail::EmulatedContext::acquire(ordinal);
}

EmulatedDevice::EmulatedDevice(const detail::StrictSettings& settings, int ordinal)
    : context_(detail::EmulatedContext::acquire(ordinal, settings)) {}

EmulatedDevice::~EmulatedDevice() {
  std::map<void*, std::shared_ptr<detail::EmulatedStream>> streams;
  {
    std::lock_guard lock(mutex_);
    streams.swap(streams_);
  }
  if (!context_) {
    for (auto& [handle, worker] : streams) worker->close();
    for (auto& [first, allocation] : allocations_) release(first, allocation);
    return;
  }
  // As ~CudaDevice: cudaStreamDestroy returns at once (the work stays queued), the pinned blocks
  // go with cudaFreeHost, which waits for every stream of the context; unless a stream of this
  // device is held, when the memory stays allocated (and live: that stream may still use it)
  // until the context ends, rather than be freed behind it.
  bool held = false;
  for (auto& [handle, worker] : streams)
    if (const std::string pending = static_cast<detail::StrictStream&>(*worker).detach(); !pending.empty()) {
      context_->report("destroying the device: " + pending);
      held = true;
    }
  if (pool_stream_) pool_stream_->detach();
  if (held) {
    context_->report("destroying the device: its memory is left allocated, not freed behind its held stream(s)");
    for (const auto& [first, allocation] : allocations_)
      context_->keep([first = first, allocation = allocation] { release(first, allocation); });
    return;
  }
  try {
    context_->wait_for_device("~EmulatedDevice: cudaFreeHost (the device's pinned blocks)");
  } catch (const Error& e) {
    context_->report(e.what());
  }
  for (auto& [first, allocation] : allocations_) quarantine(first, allocation, "the device's destruction");
}

std::string EmulatedDevice::held_streams_now() const {
  if (!context_) return "";
  std::string held;
  std::lock_guard lock(mutex_);
  for (const auto& [handle, worker] : streams_) {
    const auto& stream = static_cast<const detail::StrictStream&>(*worker);
    if (std::string waits = stream.pending(); !waits.empty())
      held += (held.empty() ? "" : "; ") + stream.describe() + ": " + waits;
  }
  return held;
}

void EmulatedDevice::release(std::uintptr_t first, const Allocation& allocation) {
  if (allocation.memory == Memory::adopted || allocation.mapping != nullptr) return;  // a mapping unmaps itself
  std::free(reinterpret_cast<void*>(first));
}

// ---- the strict mode ----

void EmulatedDevice::raise_if_faulted(const char* function) const {
  if (context_) context_->raise_if_faulted(function);
}

std::function<void()> EmulatedDevice::checked_task(const char* function, std::vector<Range> ranges,
                                                   std::function<void()> task) const {
  if (!context_) return task;
  return [context = context_.get(), function, ranges = std::move(ranges), task = std::move(task)] {
    for (const Range& r : ranges) context->check_live(r.p, r.bytes, function, r.what);
    task();
  };
}

void EmulatedDevice::make_pool_stream() {
  std::lock_guard lock(mutex_);
  if (!pool_stream_) pool_stream_ = context_->create_stream();
}

void EmulatedDevice::quarantine(std::uintptr_t first, Allocation allocation, const char* function) {
  if (allocation.memory == Memory::adopted) return;  // not this device's
  // Mapped memory is someone else's too (the owner's, peers'): kept mapped, never poisoned.
  const bool poison = allocation.mapping == nullptr;
  context_->quarantine(reinterpret_cast<void*>(first), allocation.bytes, function, poison,
                       [first, allocation] { release(first, allocation); });
}

// ---- streams ----

std::shared_ptr<detail::EmulatedStream> EmulatedDevice::worker(Stream stream, const char* function) const {
  raise_if_faulted(function);
  std::lock_guard lock(mutex_);
  const auto it = streams_.find(stream.handle);
  if (it == streams_.end()) invalid(function, "not a stream of this device");
  return it->second;
}

Stream EmulatedDevice::create_stream() {
  raise_if_faulted("create_stream");
  std::shared_ptr<detail::EmulatedStream> worker;
  if (context_)
    worker = context_->create_stream();
  else
    worker = std::make_shared<detail::StreamWorker>();
  Stream stream{worker.get()};
  std::lock_guard lock(mutex_);
  streams_.emplace(stream.handle, std::move(worker));
  return stream;
}

void EmulatedDevice::destroy_stream(Stream stream) {
  std::shared_ptr<detail::EmulatedStream> worker;
  {
    std::lock_guard lock(mutex_);
    const auto it = streams_.find(stream.handle);
    if (it == streams_.end()) invalid("destroy_stream", "not a stream of this device");
    worker = std::move(it->second);
    streams_.erase(it);
  }
  if (!context_) return worker->close();
  const std::string pending = static_cast<detail::StrictStream&>(*worker).detach();
  if (pending.empty()) return;
  context_->report("destroy_stream: " + pending);
  invalid("destroy_stream", "(strict) " + pending);
}

void EmulatedDevice::synchronize(Stream stream, std::chrono::milliseconds timeout) {
  auto w = worker(stream, "synchronize");
  if (w->synchronize(timeout)) return;
  std::string why;
  if (context_) why = static_cast<detail::StrictStream&>(*w).blocked_by();
  throw Error(ErrorCode::timeout, "tutti::device::synchronize (emulated" + std::string(context_ ? ", strict" : "") +
                                      "): the stream's work was not done after " + std::to_string(timeout.count()) +
                                      " ms" + (why.empty() ? "" : " (" + why + ")"));
}

// ---- work on a stream ----

void EmulatedDevice::copy(void* dst, const void* src, std::size_t bytes, Stream stream) {
  detail::check_copy(dst, src, bytes);
  auto w = worker(stream, "copy");
  if (bytes == 0 || dst == src) return;
  if (context_) {
    const bool from_pageable = pageable(src), to_pageable = pageable(dst);
    if (from_pageable || to_pageable)
      return copy_pageable(dst, src, bytes, static_cast<detail::StrictStream&>(*w), from_pageable, to_pageable);
  }
  w->enqueue(checked_task("copy", {{dst, bytes, "dst"}, {src, bytes, "src"}},
                          [dst, src, bytes] { std::memcpy(dst, src, bytes); }));
}

// As the CUDA device (cuda_device.cpp, copy): per chunk, a block read from pageable memory at
// the call, or filled by the stream; then the stream copies it on, or a host function copies it
// to pageable memory. The stream still checks that neither range is freed memory.
void EmulatedDevice::copy_pageable(void* dst, const void* src, std::size_t bytes, detail::StrictStream& stream,
                                   bool from_pageable, bool to_pageable) {
  for (std::size_t offset = 0; offset < bytes; offset += detail::pageable_chunk_bytes) {
    const std::size_t n = std::min(detail::pageable_chunk_bytes, bytes - offset);
    auto* out = static_cast<std::byte*>(dst) + offset;
    const auto* in = static_cast<const std::byte*>(src) + offset;
    std::shared_ptr<std::byte[]> block(new std::byte[n]);
    if (from_pageable) std::memcpy(block.get(), in, n);
    stream.enqueue(checked_task("copy", {{out, n, "dst"}, {in, n, "src"}}, [=] {
      if (!from_pageable) std::memcpy(block.get(), in, n);
      if (!to_pageable) std::memcpy(out, block.get(), n);
    }));
    if (to_pageable)
      stream.enqueue_host_function([=] { std::memcpy(out, block.get(), n); },
                                   "a host function (the copy of " + std::to_string(n) + " bytes to pageable memory)");
  }
}

void EmulatedDevice::reduce(void* dst, const void* a, const void* b, std::size_t count, DataType type, ReduceOp op,
                            Stream stream) {
  const std::size_t bytes = detail::checked_bytes(type, &op, count, "reduce");
  auto w = worker(stream, "reduce");
  if (count == 0) return;
  const std::pair<const void*, const char*> buffers[] = {{dst, "dst"}, {a, "a"}, {b, "b"}};
  for (const auto& [p, what] : buffers) {
    detail::check_element_pointer(p, type, what, "reduce");
    check_device_range(p, bytes, what, "reduce");
  }
  detail::check_overlap(dst, a, bytes, "a", "reduce");
  detail::check_overlap(dst, b, bytes, "b", "reduce");
  w->enqueue(checked_task("reduce", {{dst, bytes, "dst"}, {a, bytes, "a"}, {b, bytes, "b"}},
                          [=] { reduce::apply(op, type, dst, a, b, count); }));
}

void EmulatedDevice::divide(void* data, std::size_t count, DataType type, int divisor, Stream stream) {
  const std::size_t bytes = detail::checked_bytes(type, nullptr, count, "divide");
  if (divisor < 1) invalid("divide", "divisor must be at least 1, got " + std::to_string(divisor));
  auto w = worker(stream, "divide");
  if (count == 0) return;
  detail::check_element_pointer(data, type, "data", "divide");
  check_device_range(data, bytes, "data", "divide");
  w->enqueue(checked_task("divide", {{data, bytes, "data"}}, [=] { reduce::divide(type, data, count, divisor); }));
}

void EmulatedDevice::compute(float* data, std::size_t count, int rounds, Stream stream) {
  if (rounds < 0) invalid("compute", "rounds must not be negative, got " + std::to_string(rounds));
  const std::size_t bytes = detail::checked_bytes(DataType::f32, nullptr, count, "compute");
  auto w = worker(stream, "compute");
  if (count == 0 || rounds == 0) return;
  detail::check_element_pointer(data, DataType::f32, "data", "compute");
  check_device_range(data, bytes, "data", "compute");
  w->enqueue(checked_task("compute", {{data, bytes, "data"}}, [=] {
    for (std::size_t i = 0; i < count; ++i) {
      float x = data[i];
      for (int r = 0; r < rounds; ++r) x = std::fma(x, 0.5f, 1.0f);
      data[i] = x;
    }
  }));
}

void EmulatedDevice::write_value(std::uint32_t* flag, std::uint32_t value, Stream stream) {
  detail::check_flag(flag, "write_value");
  worker(stream, "write_value")
      ->enqueue(checked_task("write_value", {{flag, sizeof(*flag), "the flag"}}, [flag, value] {
        std::atomic_ref<std::uint32_t>(*flag).store(value, std::memory_order_release);
        detail::wake_flag(flag);
      }));
}

void EmulatedDevice::wait_value(const std::uint32_t* flag, std::uint32_t value, Stream stream) {
  detail::check_flag(flag, "wait_value");
  worker(stream, "wait_value")->enqueue_wait_flag(flag, value);
}

void EmulatedDevice::set_flag(std::uint32_t* flag, std::uint32_t value) {
  detail::check_flag(flag, "set_flag");
  std::atomic_ref<std::uint32_t>(*flag).store(value, std::memory_order_release);
  detail::wake_flag(flag);
}

// ---- events ----

std::shared_ptr<detail::EventState> EmulatedDevice::event_state(Event event, const char* function) const {
  std::lock_guard lock(mutex_);
  const auto it = events_.find(event.handle);
  if (it == events_.end()) invalid(function, "not an event of this device");
  return it->second;
}

Event EmulatedDevice::create_event() {
  auto state = std::make_shared<detail::EventState>();
  Event event{state.get()};
  std::lock_guard lock(mutex_);
  events_.emplace(event.handle, std::move(state));
  return event;
}

void EmulatedDevice::destroy_event(Event event) {
  std::lock_guard lock(mutex_);
  if (events_.erase(event.handle) == 0) invalid("destroy_event", "not an event of this device");
}

void EmulatedDevice::record(Event event, Stream stream) {
  auto state = event_state(event, "record");
  auto w = worker(stream, "record");
  std::uint64_t number = 0;
  {
    std::lock_guard lock(state->mutex);
    number = ++state->recorded;
  }
  w->enqueue([state, number] {
    {
      std::lock_guard lock(state->mutex);
      state->completed = std::max(state->completed, number);
    }
    state->changed.notify_all();
  });
}

bool EmulatedDevice::query(Event event) {
  auto state = event_state(event, "query");
  std::lock_guard lock(state->mutex);
  return state->completed >= state->recorded;
}

void EmulatedDevice::wait_event(Stream stream, Event event) {
  auto state = event_state(event, "wait_event");
  auto w = worker(stream, "wait_event");
  std::uint64_t target = 0;
  {
    std::lock_guard lock(state->mutex);
    if (state->completed >= state->recorded) return;
    target = state->recorded;
  }
  w->enqueue_wait_event(std::move(state), target);
}

}  // namespace tutti::device
