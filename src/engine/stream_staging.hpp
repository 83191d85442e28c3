// Device tensors on a stream (docs/training.md, "Device tensors on a stream"): the pinned staging
// that stands in for a device tensor's buffers in the engine, and the stream's half of the
// protocol. Tensor t, with ticket n (numbered from 1 in enqueue order, one counter per engine):
//   the stream (enqueued by the caller's call)      the engine thread
//   1. copy device send -> staging
//   2. write_value(ready, n)                    ->   a cycle that sees load_flag(ready) >= n
//                                                    announces t (never earlier: ranks agree a
//                                                    name is ready only once every rank's input
//                                                    is staged); a tensor not yet staged waits
//                                                    apart, and the others go on
//   3. wait_value(done, n)                           runs t's allreduce (fused with host tensors
//                                                    and other device tensors) on the staging
//   4. copy staging -> device recv              <-   set_flag(done, n): when t completes, with a
//   5. write_value(copied, n)                        result or with an error, always
// Handle::wait returns once copied >= n: the result is in recv. The three flags are in the header
// of the tensor's staging buffer (device/staging_pool.hpp; `copied` is the pool's `released`), so
// every tensor has its own (two streams may reach step 2 in either order). A staging buffer is
// reused once its copied flag reached its latest ticket: the stream is then past every step that
// touches it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>

#include "device/device.hpp"
#include "device/staging_pool.hpp"

namespace tutti::engine {

struct TensorState;

class StreamStaging {
 public:
  explicit StreamStaging(device::Device& device) : device_(device), pool_(device, 3) {}
  /// Frees the staging buffers the streams are done with. A buffer a stream has not yet copied
  /// back from (a stream held before its step 4) stays allocated: the device frees it when it
  /// goes. Every tensor's done flag must have been raised before (the engine completes them all).
  ~StreamStaging();
  StreamStaging(const StreamStaging&) = delete;
  StreamStaging& operator=(const StreamStaging&) = delete;

  device::Device& device() { return device_; }

  /// Enqueues steps 1 to 5 for `t` on `stream` (`bytes` from `send`, back to `recv`, both device
  /// memory) and points t's send, recv and stream flags at a staging buffer. Returns at once. If
  /// the device refuses the first step, the error is raised and nothing is enqueued; if it
  /// refuses a later one, t's done flag is raised (the stream moves on) and the error is raised.
  void enqueue(const std::shared_ptr<TensorState>& t, const void* send, void* recv, std::size_t bytes,
               device::Stream stream);
  /// Whether t's stream has staged its input (step 2).
  static bool staged(const TensorState& t);
  /// Raises t's done flag: its stream may copy back and go on. Idempotent.
  void release(const TensorState& t);

 private:
  using Buffer = device::StagingPool::Buffer;
  // Header lines: 0 copied (the pool's released), 1 ready, 2 done.
  static std::uint32_t* copied(const Buffer& b) { return b.line(0); }
  static std::uint32_t* ready(const Buffer& b) { return b.line(1); }
  static std::uint32_t* done(const Buffer& b) { return b.line(2); }

  device::Device& device_;
  std::mutex mutex_;  // enqueues may come from several threads
  std::uint32_t issued_ = 0;
  device::StagingPool pool_;
};

}  // namespace tutti::engine
