// The operations of one rank on one communicator, in issue order. Collectives complete in
// issue order (a wait on a later one progresses and waits for the earlier ones); point-to-point
// operations complete on their own. Errors: a failed operation aborts the communicator for every
// rank (through the transport); later calls raise Error(aborted).
#pragma once

#include <atomic>
#include <chrono>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "exec/operation.hpp"
#include "exec/recv_matcher.hpp"
#include "transport/transport.hpp"

namespace tutti::exec {

class OperationQueue : public std::enable_shared_from_this<OperationQueue> {
 public:
  explicit OperationQueue(std::unique_ptr<transport::Transport> transport);
  ~OperationQueue();

  transport::Transport& transport() { return *transport_; }
  int rank() const { return transport_->rank(); }
  int size() const { return transport_->size(); }

  /// Throws if the communicator was aborted: the original error when the user has not seen it yet
  /// (this rank was between calls or arrived late to the failed one), else Error(aborted).
  void check_usable(bool collective);
  /// The next collective sequence number (same on every rank when calls are issued in the same order).
  std::uint64_t next_seq() { return next_seq_++; }
  /// The key of the next point-to-point message to `peer` with `tag`.
  transport::MessageKey next_send_key(int peer, int tag);
  /// The key of the next message from `peer` with `tag`, taken, when a receive may post it at
  /// once; nullopt when it must go through the matcher (make_matched_recv): a receive from any
  /// source of that tag is unresolved, or a message from `peer` was kept by one.
  std::optional<transport::MessageKey> take_direct_recv_key(int peer, int tag);
  /// A receive through the matcher: from `peer`, or from any source (peer = MatchedRecv::any_peer).
  std::shared_ptr<Operation> make_matched_recv(const PointToPoint& message);

  /// A blocking send, receive or both (sendrecv) that the caller runs itself, without an
  /// operation object: posts them (each receive from a named peer that no receive from any source
  /// could take), then progresses the queue, and with it every operation in flight, until both
  /// are done. Errors as a waited operation's: a failed message aborts the communicator. false:
  /// declined (a receive must go through the matcher), nothing posted.
  bool run_messages(std::span<const PointToPoint> messages, std::chrono::milliseconds timeout);

  /// Announces (collectives) and starts `op`; returns the shared handle. Unless `blocking` (the
  /// caller waits at once), the progress engine takes over what remains.
  std::shared_ptr<Operation> submit(std::shared_ptr<Operation> op, bool blocking);

  /// Progresses everything; true when `op` (and, for collectives, every earlier one) completed.
  /// Throws the operation's error.
  bool test(const Operation& op);
  /// Blocks until test(op) or `limit`; on reaching op's own timeout, raises Error(timeout)
  /// naming the ranks it still waits for. Returns false only when `limit` came first. The timeout
  /// counts from `since` when given, else from this call.
  bool wait(const Operation& op, std::optional<std::chrono::milliseconds> limit,
            std::optional<std::chrono::steady_clock::time_point> since = std::nullopt);

  /// For a collective the caller runs itself (a blocking direct collective): announces it and
  /// returns true when no other collective is in flight; returns false, announcing nothing,
  /// otherwise. Throws the communicator's failure if the announcement reveals one (a mismatch).
  bool announce_when_idle(const transport::Signature& signature);

  /// A blocking collective the transport can run at once (Transport::run_now) when nothing is
  /// outstanding on this communicator: `signature` gets the next seq, which is used once the
  /// transport takes the call (it ran, or threw its error, the failure then counting as reported).
  /// false: declined, nothing happened.
  bool run_now(Algorithm algorithm, const transport::NativeCall& call, transport::Signature& signature,
               std::chrono::milliseconds timeout);

  /// Records that the user was given the communicator's failure (later calls raise `aborted`).
  void mark_reported() {
    std::lock_guard lock(mutex_);
    reported_ = true;
  }

  /// Blocks until every collective issued so far completed (throws the first error).
  void wait_all();

  /// For the progress engine: progresses everything; true while operations remain outstanding.
  bool progress_in_background();
  bool has_work() const { return outstanding_.load(std::memory_order_acquire) > 0; }
  /// How often the engine must progress this queue when nothing wakes its transport (a composite
  /// collective in front); nullopt: the transport's wake-ups suffice.
  std::optional<std::chrono::microseconds> poll_period();

 private:
  void progress_locked();
  bool complete_locked(const Operation& op);
  void fail_all_locked(const transport::Failure& failure);
  void abort_locked(const Error& error, std::uint64_t seq);
  [[noreturn]] void raise_timeout_locked(const Operation& op);
  /// Error(timeout) for `what`, waited on for `timeout`, naming `peers`; aborts the communicator.
  [[noreturn]] void raise_timeout_locked(const std::string& what, const std::vector<int>& peers,
                                         std::chrono::milliseconds timeout, std::uint64_t seq);

  std::unique_ptr<transport::Transport> transport_;
  std::mutex mutex_;
  std::deque<std::shared_ptr<Operation>> active_;  // ordered, unfinished (front) first
  std::vector<std::shared_ptr<Operation>> unordered_;
  std::uint64_t next_seq_ = 0;
  std::uint64_t next_ordinal_ = 1;
  std::map<std::pair<int, int>, std::uint32_t> send_counters_;  // (peer, tag)
  RecvMatcher matcher_;
  std::optional<transport::Failure> aborted_;
  std::atomic<bool> failed_{false};  // aborted_ is set (read without the lock)
  bool reported_ = false;            // the failure reached the user (through a call or a wait)
  std::atomic<std::size_t> outstanding_{0};
};

}  // namespace tutti::exec
