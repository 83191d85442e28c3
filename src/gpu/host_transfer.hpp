// The host_transfer backend (Aluminum's HostTransfer): a stream-aware collective over any host
// transport. The protocol is written down here once, because the stream and the progress thread
// each do half of it and neither half makes sense alone.
//
// Operation n (numbered from 1 in host-call order) on stream S:
//   S (enqueued by `enqueue`, which returns at once)   progress thread (in order of n)
//   1. copy device input -> pinned staging              waits (short naps, never spinning hot)
//   2. write_value(staging.ready, n)                  ->   until load_flag(staging.ready) >= n
//   3. wait_value(done, n)                                runs the host collective in place on the
//                                                         staging, with the private host communicator
//   4. copy staging -> device output                  <-   set_flag(done, n)
//   5. record(staging.event)  (the staging is reused once this event completed)
// The ready flag lives in the staging buffer (each operation has its own: two streams may reach
// step 2 out of order); `done` is one word per communicator, raised in order of n.
// Failures: the first host collective that throws is recorded; `done` is still raised, and every
// later queued operation is completed at once (done raised, no host collective), so no stream is
// ever left waiting. The destructor raises `done` to the last number issued before it stops the
// thread (which takes at most as long as a host collective in flight takes to end or time out).
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "comm/comm_impl.hpp"
#include "device/device.hpp"
#include "tutti/tutti.hpp"

namespace tutti::gpu::detail {

/// One collective as the host call describes it (validated before it is enqueued).
using DeviceCall = tutti::detail::Call;

class HostTransfer {
 public:
  /// `host` is the private duplicate only the progress thread calls.
  HostTransfer(std::shared_ptr<device::Device> device, tutti::Communicator host);
  /// Releases every stream waiting on an operation of this communicator, then stops the thread.
  ~HostTransfer();
  HostTransfer(const HostTransfer&) = delete;
  HostTransfer& operator=(const HostTransfer&) = delete;

  /// Raises the recorded failure, if any.
  void check() const;
  /// Enqueues `call` on `stream` (the protocol above); returns at once.
  void enqueue(const DeviceCall& call, device::Stream stream);

 private:
  struct Staging {
    std::byte* memory = nullptr;  // header (the ready flag) then data
    std::size_t capacity = 0;     // data bytes
    device::Event event;          // recorded after the copy back: complete = free to reuse
    std::uint32_t* ready() const { return reinterpret_cast<std::uint32_t*>(memory); }
    std::byte* data() const { return memory + header_bytes; }
  };
  /// What the progress thread runs for operation n: the host collective on the staging.
  struct Operation {
    std::uint32_t n = 0;
    DeviceCall call;
    const std::uint32_t* ready = nullptr;
    std::byte* data = nullptr;
  };
  static constexpr std::size_t header_bytes = 256;  // keeps the data 256-byte aligned

  Staging& take_staging(std::size_t bytes);
  void run();
  /// Waits until the operation's input is staged; false if stopped first.
  bool wait_ready(const Operation& op) const;
  /// Runs the host collective to its end (done, failed or timed out).
  void run_host(const Operation& op);
  void record(const Error& error, const Operation& op);

  std::shared_ptr<device::Device> device_;
  tutti::Communicator host_;
  std::uint32_t* done_ = nullptr;                  // pinned: the flag streams wait on
  std::uint32_t issued_ = 0;                       // the last operation number (host thread)
  std::vector<std::unique_ptr<Staging>> staging_;  // the pool; host thread only

  mutable std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<Operation> queue_;
  bool stopping_ = false;
  std::atomic<bool> stop_{false};
  std::atomic<bool> failed_{false};
  std::optional<Error> failure_;  // under mutex_
  std::thread thread_;
};

}  // namespace tutti::gpu::detail
