// The MPI transport: Tutti's schedules over MPI point-to-point (MPI_Isend / MPI_Irecv), on
// duplicates of the user's communicator, one for collectives, one for point to point and one for
// control messages (mpi_control.hpp), so that none can match another's messages (nor the user's).
//
// Message keys live in the MPI tag. Collectives: tag = (seq mod 2^s) << i | (index mod 2^i),
// with i = 16 and s = 15 when MPI_TAG_UB is 2^31 - 1 (fewer bits on MPIs with a smaller tag
// space; fewer than 20 bits is refused). Keys that collide modulo these widths would need 2^s
// collectives outstanding at once (or 2^i messages to one peer in one collective); MPI's
// non-overtaking order keeps even those apart in practice. Point to point: tag = the user's tag,
// and the index (k-th message with that tag) is MPI's non-overtaking order itself.
//
// Deadlines: nothing here blocks in MPI without one. Set-up duplicates with MPI_Comm_idup and
// shares the id with MPI_Ibcast, polled against the transport's timeout; split first waits, polled,
// for every member to arrive and then to confirm (two barriers of point-to-point messages on the
// control communicator), so that MPI_Comm_create_group, which has no nonblocking form, is called by
// every member or by none.
// Algorithm::mpi's collectives are nonblocking (post_collective) and progressed with the rest.
//
// Aborts reach every rank: `abort` sends the first error to every other rank on the control
// communicator, and every rank polls for one with each progress, wait and aborted().
//
// Limitations, by design of MPI rather than of this file:
// - `announce` keeps no record: the executor's ring of signatures catches disagreements.
// - A size disagreement fails the receiver ("message size mismatch"); the sender's MPI_Isend
//   completes normally (the receiver's abort then reaches it).
// - A send MPI cannot cancel (OpenMPI ignores MPI_Cancel on sends) is detached after a short
//   grace period when its operation fails: MPI may still read its buffer until a peer receives it.
// - MPI cannot cancel a collective: one given up on (timeout, abort) stays with MPI, and with it
//   the memory it reads and writes (see post_collective).
#pragma once

#include <mpi.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "transport/mpi/mpi_control.hpp"
#include "transport/mpi/mpi_support.hpp"
#include "transport/transport.hpp"

namespace tutti::transport::mpi {

class MpiTransport final : public Transport {
 public:
  /// This rank's transport over `comm` (which MpiTransport duplicates, and which need not outlive
  /// it). Collective over `comm`, within `timeout` (TUTTI_TIMEOUT_MS's default without one), which
  /// also bounds split. Throws Error(invalid_argument) for MPI_COMM_NULL or MPI not initialized,
  /// Error(unsupported) below MPI_THREAD_SERIALIZED or with too small an MPI_TAG_UB,
  /// Error(timeout) when some rank of `comm` did not join within `timeout` (MPI keeps the
  /// abandoned duplicate request; a rank that comes later fails by its own timeout), Error(system)
  /// when MPI fails.
  explicit MpiTransport(MPI_Comm comm);
  MpiTransport(MPI_Comm comm, std::chrono::milliseconds timeout);
  /// Frees the duplicates. Must run before MPI_Finalize (afterwards it frees nothing).
  ~MpiTransport() override;
  MpiTransport(const MpiTransport&) = delete;
  MpiTransport& operator=(const MpiTransport&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::uint64_t id() const override { return id_; }
  std::string_view name() const override { return "mpi"; }
  Kind kind() const override { return Kind::mpi; }
  /// Throws the communicator's first error when it was aborted, Error(timeout) (after aborting
  /// this communicator) when a member has not arrived within the timeout, Error(system) when MPI fails.
  std::unique_ptr<Transport> split(std::uint64_t id, const std::vector<int>& ranks, int new_rank) override;
  void announce(const Signature&) override {}
  void post_send(int peer, const MessageKey& key, const void* data, std::size_t bytes, Completion* done) override;
  void post_recv(int peer, const MessageKey& key, void* data, std::size_t bytes, Completion* done) override;
  bool post_recv_reduce(int, const MessageKey&, void*, const void*, std::size_t, DataType, ReduceOp,
                        Completion*) override {
    return false;  // the executor receives into staging memory and reduces
  }
  void cancel(Completion* done) override;
  bool withdraw_recv(Completion* done) override;
  std::uint64_t generation() const override { return generation_.load(std::memory_order_acquire); }
  void wait(std::uint64_t seen, std::chrono::steady_clock::time_point deadline) override;
  void wake() override { generation_.fetch_add(1, std::memory_order_acq_rel); }
  void progress() override;
  std::optional<Failure> aborted() const override;
  void abort(const Error& error, std::uint64_t seq) override;
  /// Algorithm::mpi: MPI's own nonblocking collectives (mpi_collective.cpp).
  bool serves_natively(Algorithm algorithm, Collective) const override { return algorithm == Algorithm::mpi; }
  /// Below MPI_THREAD_SERIALIZED only the caller's thread may call MPI.
  bool progressed_by_caller_only() const override { return caller_threads_only(); }
  std::unique_ptr<NativeCollective> start_native(Algorithm algorithm, const NativeCall& call,
                                                 std::chrono::milliseconds timeout) override;

  /// The duplicate on which collectives run: Tutti's schedules, and MPI's own collectives
  /// (mpi_collective). Valid as long as the transport.
  MPI_Comm collective_comm() const { return collective_; }
  /// The deadline of set-up and split, and of mpi_collective called without a queue.
  std::chrono::milliseconds timeout() const { return timeout_; }

  /// Starts a nonblocking MPI collective on collective_comm(): `start` makes the call (e.g.
  /// MPI_Iallreduce(..., comm, request)) and returns MPI's code. The transport tests the request
  /// with every progress() and wait() and sets `done` (failed with `what` and MPI's message).
  /// MPI cannot cancel a collective: an operation that gives up on one (timeout, abort) leaves it
  /// here, and `keep` (what MPI reads and writes besides the caller's buffers, `done` included) is
  /// kept alive until MPI completes it, or for the life of the process once the transport is gone.
  void post_collective(const std::function<int(MPI_Comm, MPI_Request*)>& start, const char* what, Completion* done,
                       std::shared_ptr<void> keep);

 private:
  // split: the id is given, the set-up bounded by the split's deadline
  MpiTransport(MPI_Comm comm, std::uint64_t id, std::chrono::milliseconds timeout,
               std::chrono::steady_clock::time_point deadline);
  void set_up(MPI_Comm comm, std::chrono::steady_clock::time_point deadline, const char* who);
  void arrive(const std::vector<int>& ranks, int index, int phase, std::chrono::steady_clock::time_point deadline);
  struct Pending {
    Completion* done = nullptr;
    MPI_Datatype type = MPI_BYTE;  // MPI_BYTE, or a derived type for messages over INT_MAX bytes
    std::size_t bytes = 0;
    int peer = 0;
    const char* collective = nullptr;  // post_collective: the MPI function's name
    std::shared_ptr<void> keep;        // post_collective: what MPI uses until it completes
  };
  void post(bool is_send, int peer, const MessageKey& key, void* data, std::size_t bytes, Completion* done);
  int tag_of(const MessageKey& key, std::string& error) const;
  void fail(Completion* done, const std::string& error);
  void test_locked();
  void finish_locked(const Pending& pending, MPI_Status& status, int error);
  void release_locked(Pending& pending);
  /// Removes the pending operation at `it` (and its MPI request) from the lists; mutex_ held.
  std::pair<MPI_Request, Pending> take_locked(std::vector<Pending>::iterator it);
  void poll_control_locked() const;

  MPI_Comm collective_ = MPI_COMM_NULL;
  MPI_Comm point_to_point_ = MPI_COMM_NULL;
  std::chrono::milliseconds timeout_;
  int rank_ = 0;
  int size_ = 0;
  std::uint64_t id_ = 0;
  int tag_ub_ = 0;
  int index_bits_ = 16;
  int seq_bits_ = 15;

  // Guards what follows: progress() runs under the queue's lock, but wait() and cancel() may run
  // on another thread at the same time.
  mutable std::mutex mutex_;
  std::vector<MPI_Request> requests_;  // parallel to pending_, for MPI_Testsome
  std::vector<Pending> pending_;
  std::vector<MPI_Request> detached_;  // cancelled sends MPI has not let go of yet
  std::vector<int> indices_;
  std::vector<MPI_Status> statuses_;
  // aborted() polls for a peer's abort, hence mutable.
  mutable ControlChannel control_;
  mutable std::optional<Failure> failure_;
  mutable std::atomic<bool> has_failure_{false};
  mutable std::atomic<std::uint64_t> generation_{0};
};

}  // namespace tutti::transport::mpi
