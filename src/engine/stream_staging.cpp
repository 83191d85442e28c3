// The pinned staging of device tensors and the stream's half of their protocol
// (stream_staging.hpp).
#include "engine/stream_staging.hpp"

#include <algorithm>

#include "engine/engine_core.hpp"

namespace tutti::engine_detail {

namespace {

enum Flag { ready_flag = 0, done_flag = 1, copied_flag = 2 };

}  // namespace

StreamStaging::~StreamStaging() {
  for (auto& b : buffers_) {
    if (b->last) device_.set_flag(b->flag(done_flag), *b->last);  // already raised; never leave one down
    if (b->retired || !is_free(*b)) continue;                     // a stream may still use it
    forget_user(*b);
    device_.free_pinned(b->memory);
  }
}

bool StreamStaging::is_free(const Buffer& b) const {
  return !b.retired && (!b.last || device::Device::reached(device::Device::load_flag(b.flag(copied_flag)), *b.last));
}

void StreamStaging::forget_user(Buffer& b) {
  if (auto user = b.user.lock()) {
    std::lock_guard lock(user->mutex);
    user->copied_flag = nullptr;
  }
  b.user.reset();
}

StreamStaging::Buffer& StreamStaging::take(std::size_t bytes) {
  // The smallest free buffer that fits; else replace a free one that is too small; else grow.
  Buffer* best = nullptr;
  Buffer* small = nullptr;
  for (auto& b : buffers_) {
    if (!is_free(*b)) continue;
    if (b->capacity >= bytes && (best == nullptr || b->capacity < best->capacity)) best = b.get();
    if (b->capacity < bytes) small = b.get();
  }
  if (best != nullptr) {
    forget_user(*best);
    return *best;
  }
  const std::size_t capacity = std::max<std::size_t>(bytes, 4096);
  auto* memory = static_cast<std::byte*>(device_.allocate_pinned(header_bytes + capacity));
  if (small != nullptr) {
    forget_user(*small);
    device_.free_pinned(small->memory);
  } else {
    buffers_.push_back(std::make_unique<Buffer>());
    small = buffers_.back().get();
  }
  *small = Buffer{memory, capacity, std::nullopt, {}, false};
  return *small;
}

void StreamStaging::enqueue(const std::shared_ptr<TensorState>& t, const void* send, void* recv, std::size_t bytes,
                            device::Stream stream) {
  std::lock_guard lock(mutex_);
  Buffer& b = take(bytes);
  const std::uint32_t n = issued_ + 1;
  // Below n even after the counter wraps, whatever an earlier use left there.
  for (Flag f : {ready_flag, done_flag, copied_flag}) device_.set_flag(b.flag(f), n - 1);
  // The first call checks the stream (also for 0 bytes): if it throws, nothing was enqueued.
  device_.copy(b.data(), send, bytes, stream);
  issued_ = n;
  b.last = n;
  b.user = t;
  t->send = b.data();
  t->recv = b.data();
  t->on_stream = true;
  t->ticket = n;
  t->ready_flag = b.flag(ready_flag);
  t->done_flag = b.flag(done_flag);
  {
    std::lock_guard state(t->mutex);
    t->copied_flag = b.flag(copied_flag);
  }
  try {
    device_.write_value(b.flag(ready_flag), n, stream);
    device_.wait_value(b.flag(done_flag), n, stream);
    device_.copy(recv, b.data(), bytes, stream);
    device_.write_value(b.flag(copied_flag), n, stream);
  } catch (...) {
    // Half enqueued: the stream may wait for `done`, so raise it now; nothing may write `copied`
    // any more, so the buffer is never reused and the handle does not wait for a copy back.
    device_.set_flag(b.flag(done_flag), n);
    b.retired = true;
    forget_user(b);
    throw;
  }
}

bool StreamStaging::staged(const TensorState& t) {
  return !t.on_stream || device::Device::reached(device::Device::load_flag(t.ready_flag), t.ticket);
}

void StreamStaging::release(const TensorState& t) {
  if (t.on_stream) device_.set_flag(t.done_flag, t.ticket);
}

}  // namespace tutti::engine_detail
