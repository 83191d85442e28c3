// The host_transfer backend (Aluminum's HostTransfer): a stream-aware collective over any host
// transport. The protocol is written down here once, because the stream and the progress thread
// each do half of it and neither half makes sense alone.
//
// Operation n (numbered from 1 in host-call order) on stream S:
//   S (enqueued by `enqueue`, which returns at once)   progress thread (in order of n)
//   1. copy device input -> pinned staging              watches (short naps, never spinning hot)
//   2. write_value(staging.ready[i], n)               ->   until load_flag(ready[i]) >= n, then
//   3. wait_value(done, n)                                starts the host collective (nonblocking)
//                                                         on the staging, with the private host
//                                                         communicator; once it completed:
//   4. copy staging -> device output                  <-   set_flag(done, n)
//   5. write_value(staging.released, n)  (the staging is reused once the stream got there)
// A large allreduce, reduce or broadcast is pipelined: it is cut into chunks, each its own
// operation number with its own ready word, and the stream enqueues every chunk's steps 1-2 before
// the first chunk's steps 3-4, so that copies in, host collectives and copies back overlap.
// The thread starts every operation whose input is staged (in order) while earlier ones are still
// in flight. An operation that takes no input on this rank (a receive, a broadcast's non-root)
// does not wait for its ready word: its host side only fills the staging, which the stream copies
// out after `done`, so starting it early is invisible, and a send followed by a receive on one
// stream does not wait for the peer's send to complete first (which would deadlock a ring).
// A barrier has no input but waits: it is what orders the streams.
// Ranks that share hardware queues (threads of one process on one GPU) pass a point of their
// LocalOrder between steps 2 and 3 of a collective, so that no rank's step 3 is submitted ahead of
// another's step 2 in a queue they share. Point-to-point operations pass none (the other ranks do
// not call them).
// The ready words live in the staging header (two streams may reach step 2 out of order); `done`
// is one word per communicator, raised in order of n.
// Failures: the first host collective that throws is recorded; `done` is still raised, and every
// later queued operation is completed at once (done raised, no host collective), so no stream is
// ever left waiting. The destructor raises `done` to the last number issued before it stops the
// thread (which waits for host collectives in flight at most until their own timeouts); if an
// operation had not completed, it first records `aborted` naming the destroyed communicator, so
// that its released streams' outputs (undefined) are never taken for results.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <utility>
#include <vector>

#include "comm/comm_impl.hpp"
#include "device/device.hpp"
#include "device/staging_pool.hpp"
#include "gpu/backend.hpp"
#include "gpu/local_order.hpp"
#include "tutti/tutti.hpp"

namespace tutti::gpu::detail {

/// What the stream copies in and out of the staging for one operation, and what is pipelined.
struct Layout {
  std::size_t staged = 0;    // staging data bytes
  const void* in = nullptr;  // copied to data + in_offset (nullptr: nothing copied in)
  std::size_t in_offset = 0;
  std::size_t in_bytes = 0;
  void* out = nullptr;  // receives data + out_offset (nullptr: nothing copied out)
  std::size_t out_offset = 0;
  std::size_t out_bytes = 0;
  bool elementwise = false;  // element i of the result depends only on element i: may be chunked
};

/// The layout of `call` on rank `rank` of `size`.
Layout layout_of(const DeviceCall& call, int rank, int size);

/// How many chunks an operation of `bytes` is cut into (1: not pipelined); `chunk_bytes` gets the
/// size of every chunk but the last, a multiple of `element`.
std::size_t chunks_of(std::size_t bytes, std::size_t element, std::size_t& chunk_bytes);

class HostTransfer final : public DeviceBackend {
 public:
  /// `host` is the private duplicate only the progress thread calls. `order`: the ranks this
  /// one shares hardware queues with (local_order.hpp), nullptr for none.
  HostTransfer(std::shared_ptr<device::Device> device, tutti::Communicator host,
               std::shared_ptr<LocalOrder> order = nullptr);
  /// Releases every stream waiting on an operation of this communicator, then stops the thread.
  /// An operation issued and not completed is failed first (ErrorCode::aborted, in failures()):
  /// its stream completes without a result.
  ~HostTransfer();
  HostTransfer(const HostTransfer&) = delete;
  HostTransfer& operator=(const HostTransfer&) = delete;

  /// Raises the recorded failure, if any.
  void check() override { failures_->check(); }
  Backend id() const override { return Backend::host_transfer; }
  /// Every collective and point-to-point operation.
  bool serves(const DeviceCall&, std::string*) const override { return true; }
  /// This backend's failures; it outlives the backend (see the destructor).
  std::shared_ptr<const FailureRecord> failures() const { return failures_; }
  /// Enqueues `call` on `stream` (the protocol above); returns at once.
  void enqueue(const DeviceCall& call, device::Stream stream) override;

  /// At most this many chunks per operation (one ready word each in the staging header).
  static constexpr std::size_t max_chunks = 64;

 private:
  // A staging buffer (device/staging_pool.hpp): its header holds the pool's `released` line,
  // then the ready words of the chunks, one after the other from line 1.
  using Staging = device::StagingPool::Buffer;
  static std::uint32_t* ready(const Staging& staging, std::size_t chunk) { return staging.line(1) + chunk; }
  static constexpr std::size_t staging_lines = 1 + max_chunks * sizeof(std::uint32_t) / 64;
  /// What the progress thread runs for operation n: the host side of one chunk on the staging.
  struct Operation {
    std::uint32_t n = 0;
    DeviceCall call;         // count and offset are the chunk's
    std::size_t offset = 0;  // of the chunk, in bytes, within the staged data
    bool waits = true;       // for its ready word (false: nothing to stage on this rank)
    const std::uint32_t* ready = nullptr;
    std::byte* data = nullptr;
  };
  /// An operation whose host collective is in flight (or that completes without one).
  struct InFlight {
    Operation op;
    tutti::Request request;
    std::chrono::steady_clock::time_point started;
  };

  /// The pool makes at most this many staging buffers before an operation's stream waits for the
  /// least recently used one that fits (StagingPool::take): the host never waits, and a burst of
  /// calls does not allocate without bound. An operation whose host side starts before its stream
  /// gets there (no input on this rank) may not chain: the pool grows instead.
  static constexpr std::size_t max_staging = 8;
  void run();
  /// Starts operation `op`'s host side; an empty request when it has none.
  tutti::Request start_host(const Operation& op);
  /// Waits for the host collectives still in flight, each at most until its own timeout.
  void drain(std::deque<InFlight>& flight);
  void record(const Error& error, const Operation& op);

  std::shared_ptr<device::Device> device_;
  tutti::Communicator host_;
  std::shared_ptr<LocalOrder> order_;
  std::uint32_t* done_ = nullptr;                          // pinned: the flag streams wait on
  std::uint32_t issued_ = 0;                               // the last operation number (host thread)
  std::map<std::pair<int, int>, std::uint64_t> received_;  // receives issued, by peer and tag (order_)
  std::unique_ptr<device::StagingPool> staging_;           // host thread only

  mutable std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<Operation> queue_;
  bool stopping_ = false;
  std::atomic<bool> stop_{false};
  std::atomic<std::uint32_t> completed_{0};  // the last operation whose `done` the thread raised
  std::shared_ptr<FailureRecord> failures_ = std::make_shared<FailureRecord>();
  std::thread thread_;
};

}  // namespace tutti::gpu::detail
