// The pinned staging of device tensors and the stream's half of their protocol
// (stream_staging.hpp).
#include "engine/stream_staging.hpp"

#include "engine/engine_core.hpp"

namespace tutti::engine {

StreamStaging::~StreamStaging() {
  // Every done flag up (already raised: never leave one down); the pool then frees what the
  // streams are through with.
  for (const auto& b : pool_.buffers())
    if (b->last) device_.set_flag(done(*b), *b->last);
}

void StreamStaging::enqueue(const std::shared_ptr<TensorState>& t, const void* send, void* recv, std::size_t bytes,
                            device::Stream stream) {
  std::lock_guard lock(mutex_);
  const std::uint32_t n = issued_ + 1;
  const device::StagingPool::Taken taken = pool_.take(bytes, n, stream);
  Buffer& b = *taken.buffer;
  // Below n even after the counter wraps, whatever an earlier use left there (copied: the pool).
  device_.set_flag(ready(b), n - 1);
  device_.set_flag(done(b), n - 1);
  // The first call checks the stream (also for 0 bytes): if it throws, nothing was enqueued.
  try {
    device_.copy(b.data(), send, bytes, stream);
  } catch (...) {
    pool_.cancel(taken);
    throw;
  }
  issued_ = n;
  t->send = b.data();
  t->recv = b.data();
  t->on_stream = true;
  t->ticket = n;
  t->ready_flag = ready(b);
  t->done_flag = done(b);
  {
    std::lock_guard state(t->mutex);
    t->copied_flag = copied(b);
  }
  // The tensor's handle stops reading the buffer's flags once the pool reuses or frees it.
  b.on_drop = [user = std::weak_ptr<TensorState>(t)] {
    if (auto state = user.lock()) {
      std::lock_guard lock(state->mutex);
      state->copied_flag = nullptr;
    }
  };
  try {
    device_.write_value(ready(b), n, stream);
    device_.wait_value(done(b), n, stream);
    device_.copy(recv, b.data(), bytes, stream);
    pool_.release(b, stream);
  } catch (...) {
    // Half enqueued: the stream may wait for `done`, so raise it now; nothing may write `copied`
    // any more, so the buffer is never reused and the handle does not wait for a copy back.
    device_.set_flag(done(b), n);
    device::StagingPool::retire(b);
    throw;
  }
}

bool StreamStaging::staged(const TensorState& t) {
  return !t.on_stream || device::Device::reached(device::Device::load_flag(t.ready_flag), t.ticket);
}

void StreamStaging::release(const TensorState& t) {
  if (t.on_stream) device_.set_flag(t.done_flag, t.ticket);
}

}  // namespace tutti::engine
