// The engine's calls for device tensors enqueued on a stream (stream_staging.hpp has the protocol):
// the checks, and the hand-over of a tensor whose buffers are its pinned staging.
#include <string>

#include "comm/comm_impl.hpp"
#include "engine/engine_core.hpp"

namespace tutti::engine {

Handle EngineCore::enqueue_on_stream(Descriptor d, const void* send, void* recv, device::Stream stream) {
  const std::string what = "engine: enqueue_allreduce '" + d.name + "' on a stream";
  if (!staging_)
    throw Error(ErrorCode::invalid_argument,
                what + ": this engine has no device (construct it as Engine(comm, gpu) to enqueue device buffers)");
  check_arguments(d, send, recv);
  std::size_t bytes = 0;
  try {
    // The host API's checks: enums, null buffers, count overflow, partial overlap.
    tutti::comm::validate(
        tutti::comm::make_call(Collective::allreduce, send, recv, d.count, d.type, d.op, -1, Options{}), rank_, size_);
    bytes = tutti::comm::checked_bytes("allreduce", d.count, d.type);
  } catch (const Error& e) {
    throw Error(e.code(), what + ": " + e.what());
  }
  const device::Device& device = staging_->device();
  const std::pair<const void*, const char*> buffers[] = {{send, "send"}, {recv, "recv"}};
  for (const auto& [p, name] : buffers) {
    const auto* first = static_cast<const std::byte*>(p);
    if (bytes > 0 && (!device.is_device_pointer(first) || !device.is_device_pointer(first + bytes - 1)))
      throw Error(ErrorCode::invalid_argument, what + ": " + name + " is not memory of the engine's device (" +
                                                   std::to_string(bytes) + " bytes from " +
                                                   std::to_string(reinterpret_cast<std::uintptr_t>(p)) + ")");
  }
  auto t = std::make_shared<TensorState>();
  t->enqueued = Clock::now();
  t->doorbell = doorbell_;
  t->descriptor = d;
  // The name is taken before anything is enqueued: a refused call leaves the stream untouched.
  {
    std::lock_guard lock(mutex_);
    if (failure_) std::rethrow_exception(failure_);
    if (stream_failure_) std::rethrow_exception(stream_failure_);
    if (shutting_down_) throw Error(ErrorCode::aborted, what + ": the engine is shutting down");
    if (!names_.insert(d.name).second)
      throw Error(ErrorCode::invalid_argument, "engine: tensor '" + d.name + "' is already enqueued on rank " +
                                                   std::to_string(rank_) + " and has not completed");
  }
  try {
    staging_->enqueue(t, send, recv, bytes, stream);
  } catch (...) {
    {
      std::lock_guard lock(mutex_);
      names_.erase(d.name);
    }
    try {
      throw;
    } catch (const Error& e) {
      throw Error(e.code(), what + ": " + e.what());
    }
  }
  // The stream now waits for this tensor: from here on it must be completed, whatever happens.
  std::exception_ptr refused;
  bool ring = false;
  {
    std::lock_guard lock(mutex_);
    if (failure_) {
      refused = failure_;
    } else if (shutting_down_) {
      refused = std::make_exception_ptr(Error(ErrorCode::aborted, what + ": the engine is shutting down"));
    } else {
      inbox_.push_back(t);
      ring = idle_;
      idle_ = false;
    }
  }
  if (refused) {
    complete(t, refused);  // releases the stream
    std::rethrow_exception(refused);
  }
  if (ring || peer_waiting_.load(std::memory_order_relaxed)) doorbell_->ring();
  return Handle(t);
}

void EngineCore::check() {
  std::lock_guard lock(mutex_);
  if (failure_) std::rethrow_exception(failure_);
  if (stream_failure_) std::rethrow_exception(stream_failure_);
}

}  // namespace tutti::engine
