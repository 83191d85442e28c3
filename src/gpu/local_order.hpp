// Submission order among ranks that share hardware queues. Ranks that are threads of one process
// on one GPU share its context's queues (CUDA_DEVICE_MAX_CONNECTIONS of them, 8 by default, the
// process's streams assigned round-robin), and a stream held at a wait holds every stream's work
// submitted behind it in its queue. If rank A's stream waits for a signal of rank B's stream, and
// B submits that signal after A submitted the wait, into the same queue, neither ever runs: the
// H100 ran into exactly this with 8 ranks, or 4 ranks of two streams each (docs/gpu.md).
//
// A backend therefore marks points in its submission, at the same places on every rank: before a
// point it submits the signals that waits after the point (of any rank) are for. A rank passes its
// k-th point only once every rank sharing its queues has reached its own k-th point, so every
// signal is submitted ahead of every wait for it, in whichever queue, and a held wait only ever
// holds work that does not release it. Ranks in processes of their own (how real jobs run) share
// no queues with each other: for them there is no order and a call never waits.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <tuple>

#include "tutti/tutti.hpp"

namespace tutti::gpu::detail {

class LocalOrder {
 public:
  /// Collective over `host` (every rank calls it): the ranks of `host` in this process whose
  /// devices run on the queues `domain` names (device::Device::queue_domain; 0: queues of their
  /// own). nullptr where this rank shares them with no other rank.
  static std::shared_ptr<LocalOrder> join(tutti::Communicator& host, std::uintptr_t domain);

  /// Rank `rank` passes its next point: returns once every member reached that point, or left.
  /// After `limit` (a rank that is late by the operation's timeout, calls something else, or is
  /// blocked elsewhere) it returns Error(timeout) naming the ranks that did not get there, for the
  /// backend to record as the operation's failure; the operation is still submitted (its streams
  /// are then released), and the late ranks pass later without waiting.
  std::optional<Error> pass(int rank, std::chrono::milliseconds limit);
  /// `rank` passes no more points (its communicator is going): nobody waits for it.
  void leave(int rank);

  /// Point-to-point, which only two members call: `from` has submitted the signals of its next
  /// send to `to` with `tag` (its staged input; the wait for its completion comes after).
  void sent(int from, int to, int tag);
  /// Before a receive submits its wait: returns once `from` has submitted its `nth` send to `to`
  /// with `tag` (the one the receive matches), at once where `from` shares no queues with this
  /// rank or left. Error(timeout) after `limit`, as pass: the receive is still submitted.
  std::optional<Error> await_sent(int from, int to, int tag, std::uint64_t nth, std::chrono::milliseconds limit);

  LocalOrder() = default;
  LocalOrder(const LocalOrder&) = delete;
  LocalOrder& operator=(const LocalOrder&) = delete;

 private:
  std::mutex mutex_;
  std::condition_variable moved_;
  std::map<int, std::uint64_t> passed_;                      // per member: the points it reached (left: the maximum)
  std::map<std::tuple<int, int, int>, std::uint64_t> sent_;  // sends submitted, by from, to and tag
};

}  // namespace tutti::gpu::detail
