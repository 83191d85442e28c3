// The ipc backend: collectives among processes of one host that run entirely on the streams. Each
// rank owns a staging buffer in device memory that every peer maps (allocate_shared/open_shared:
// CUDA IPC, or a memfd on the emulated device), and the ranks' streams signal each other through
// flags in one host shared-memory segment that every device registers as pinned memory. No host
// thread moves data: the host call enqueues the whole protocol and returns.
//
// Step s (numbered from 1 on every rank alike; a large elementwise operation takes several steps
// of at most `capacity` bytes) of an allreduce on rank r's stream:
//   1. wait until consumed[j] >= s - 1 for every rank j  (nobody still reads staging from step s-1)
//   2. copy input -> staging[r];  write ready[r] = s
//   3. wait ready[j] >= s for every peer; reduce slice r of every staging[j] into staging[r]
//   4. write reduced[r] = s; wait reduced[j] >= s, copy slice j of staging[j] -> output, for all j
//   5. write consumed[r] = s
// An allreduce step of at most one_shot_bytes skips step 4: in step 3 each rank reduces all of it,
// staging[0] op staging[1] op ... in rank order (the same bits on every rank), into its output.
// reduce is the same with only the root gathering; broadcast copies the root's staging; allgather
// copies every staging[j] to block j; reduce_scatter reduces block r of every staging[j]. Any
// collective larger than the staging takes several steps: an allgather one piece of its block
// per step, a reduce_scatter one piece of each of its p blocks (side by side in the staging). reached[r]
// is written first, so that a watchdog knows when the stream got to the step. Ranks that share
// hardware queues (threads of one process on one GPU) pass three points of their LocalOrder in
// every step, on every rank alike: before step 1, after step 2 and after step 4's write, so that
// each flag's write is submitted ahead of every wait for it in any queue they share.
//
// The watchdog (watchdog.hpp, shared with nccl) checks, for each operation in order, that every
// rank called the same one, as soon as it is issued; each operation's stream waits for that
// verdict (the `validated` flag) before it completes, so check() after a synchronize knows of a
// mismatch, and then for the operation before it to be done (operations on different streams
// raise `done` in issue order, so that it never goes back). Then the watchdog follows this rank's
// stream (pinned flags of this rank alone: `reached`, `done`): a peer process that died, a step
// that does not complete within the timeout after this rank's stream reached it, or a failure
// another rank published ends the operation. Failing means writing the failure word and raising
// every flag of every rank far ahead, so that no stream of any rank waits for ever; the error is
// raised by the next call and by check() on every rank.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "device/device.hpp"
#include "gpu/local_order.hpp"
#include "gpu/watchdog.hpp"

namespace tutti::gpu::detail {

class Ipc final : public DeviceBackend, private Watchdog::Watched {
 public:
  /// Collective over `host` (a private duplicate that only this backend calls). Error(unsupported)
  /// on every rank alike when the ranks are not all on one host or the memory cannot be shared.
  /// `order`: the ranks this one shares hardware queues with (local_order.hpp), nullptr for none.
  Ipc(std::shared_ptr<device::Device> device, tutti::Communicator host, std::size_t capacity,
      std::shared_ptr<LocalOrder> order = nullptr);
  /// Fails (and so releases) the operations still in flight, else waits (bounded) for the peers
  /// to finish reading this rank's staging; never waits for a held stream.
  ~Ipc();
  Ipc(const Ipc&) = delete;
  Ipc& operator=(const Ipc&) = delete;

  /// Whether this backend runs `call`; else `why` says why not.
  bool serves(const DeviceCall& call, std::string* why) const override;
  Backend id() const override { return Backend::ipc; }
  /// Raises this rank's failure, or one another rank published (which it then records).
  void check() override;
  void enqueue(const DeviceCall& call, device::Stream stream) override;

  /// TUTTI_GPU_IPC_BYTES, else 32 MiB: the staging each rank shares.
  static std::size_t default_capacity();
  /// An allreduce step of at most this many bytes runs in one shot: each rank reduces all of it
  /// from every rank's staging, in rank order, instead of its slice (then waiting for the others').
  static constexpr std::size_t one_shot_bytes = 64 * 1024;

 private:
  using Operation = Watchdog::Operation;  // first and last: its steps
  enum Flag { reached, ready, reduced, consumed, flags };

  std::uint32_t* flag(int rank, Flag f) const;
  void wait_all(Flag f, std::uint32_t value, device::Stream stream, bool including_self);
  void enqueue_step(const DeviceCall& call, std::uint32_t s, std::size_t offset, std::size_t count,
                    device::Stream stream);
  // What the watchdog asks (watchdog.hpp).
  std::string describe(const Operation& op) const override;
  bool stream_reached(const Operation& op) const override;
  bool stream_done(const Operation& op) const override;
  /// A failure another rank published, if any.
  std::optional<Error> noticed(const Operation*) override;
  /// Raises the validated flag to op.n, or far ahead once failed (the streams are released).
  void compared(const Operation& op, bool failed) override;
  /// The ranks whose streams had not reached the step this rank's stream is at.
  std::string late(const Operation& op) const override;
  /// Publishes the failure (the first one of any rank wins) and raises every flag of every rank.
  void release(const Error& error) override;
  /// Yes: a peer's stream may write a flag back after a release, so release until this rank's
  /// stream is through.
  bool follow_after_failure() const override { return true; }

  /// Records `error` (first wins), publishes it and releases every stream of every rank.
  void fail(const Error& error) { watchdog_->fail(error); }
  /// Whether this backend failed, taking up a failure another rank published first.
  bool failed_here() { return watchdog_->failed(); }
  void release_all();

  /// Passes the next point of order_ (if any): the signals this rank submitted so far come before
  /// the waits any rank submits after the point.
  void pass(const DeviceCall& call);

  std::shared_ptr<device::Device> device_;
  tutti::Communicator host_;
  std::shared_ptr<LocalOrder> order_;
  int rank_ = 0, size_ = 1;
  std::size_t capacity_ = 0;
  std::vector<std::int64_t> pids_;
  std::byte* control_ = nullptr;  // the shared flag segment (mapped)
  std::size_t control_bytes_ = 0;
  void* mine_ = nullptr;                // this rank's staging (allocate_shared)
  std::vector<std::byte*> staging_;     // every rank's staging, as mapped here
  std::uint32_t* done_ = nullptr;       // pinned, this rank's only: the last operation its stream finished
  std::uint32_t* validated_ = nullptr;  // pinned: the last operation whose descriptors were exchanged
  std::uint32_t step_ = 0;              // the last step issued (host thread)
  std::atomic<std::uint32_t> last_issued_{0};
  std::uint32_t issued_ = 0;            // operations
  std::unique_ptr<Watchdog> watchdog_;  // last: its thread calls the above
};

}  // namespace tutti::gpu::detail
