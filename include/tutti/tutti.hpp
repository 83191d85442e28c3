// Tutti: collective communication for distributed deep-learning training.
//
// The one header a user includes. The shape follows NCCL: counts are in elements,
// `send == recv` means in place, `reduce_scatter` takes the per-rank receive count and
// `allgather` the per-rank send count. Every call checks its arguments before anything is
// sent and raises `tutti::Error` (see <tutti/types.hpp>) on failure.
#pragma once

#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "tutti/types.hpp"
#include "tutti/version.hpp"

namespace tutti {

// The implementations behind Request, Communicator and SharedBuffer, in their layers' namespaces.
namespace exec {
class RequestState;
}  // namespace exec
namespace comm {
class CommImpl;
struct Access;  // the layers' and tests' view of the implementation (src/comm/access.hpp)
}  // namespace comm
namespace core {
class SharedRegion;
}  // namespace core

/// Memory from Tutti (Communicator::allocate) that the other processes on this host can map:
/// a `direct` allreduce, reduce_scatter, allgather or broadcast whose buffers lie in such memory
/// on every rank of a shared-memory communicator reads its peers' buffers where they are, without
/// copying them through the segment (zero copy; docs/algorithms.md). Zero-filled, page-aligned,
/// at least `size()` bytes. Copies share the same memory, which is freed with the last copy; use
/// it like any other memory.
class SharedBuffer {
 public:
  SharedBuffer() = default;  // no memory: data() == nullptr, size() == 0
  std::byte* data() const noexcept { return data_; }
  std::size_t size() const noexcept { return size_; }
  /// The buffer as `size() / sizeof(T)` elements of T.
  template <class T>
  std::span<T> as() const noexcept {
    return {reinterpret_cast<T*>(data_), size_ / sizeof(T)};
  }
  explicit operator bool() const noexcept { return data_ != nullptr; }

  explicit SharedBuffer(std::shared_ptr<core::SharedRegion> region);

 private:
  std::shared_ptr<core::SharedRegion> region_;
  std::byte* data_ = nullptr;
  std::size_t size_ = 0;
};

/// The `peer` of a receive that takes the first message from any rank (Communicator::recv).
inline constexpr int any_source = -1;

/// The handle of a nonblocking operation. Copies share the same operation.
/// The buffers passed to the operation must stay valid until it completes.
class Request {
 public:
  Request() = default;  // an empty request: already complete
  /// Blocks until the operation completes; throws the operation's `Error` (e.g. `timeout` after
  /// the deadline). Collectives complete in issue order (so a collective's wait also waits for
  /// every collective issued before it on the same communicator); isend and irecv complete on
  /// their own, whatever else is outstanding.
  void wait();
  /// Makes progress; true when complete. Throws the operation's `Error`.
  bool test();
  /// Like `wait`, but gives up after `duration` and returns false (the operation goes on).
  bool wait_for(std::chrono::milliseconds duration);
  /// Like `wait_for`, but the operation's timeout counts from `since` (say, when it was issued)
  /// rather than from this call, so that polling in short slices still reaches the deadline.
  bool wait_for(std::chrono::milliseconds duration, std::chrono::steady_clock::time_point since);
  /// For a receive that completed: the rank whose message it took (the sender, for a receive
  /// from `any_source`). -1 before it completed, and for every other operation.
  int source() const;

  explicit Request(std::shared_ptr<exec::RequestState> op) : op_(std::move(op)) {}

 private:
  std::shared_ptr<exec::RequestState> op_;
};

/// A group of ranks that run collectives together. Copies are handles to the same
/// communicator. Calls on one communicator must be issued in the same order on every rank;
/// operations complete in issue order. One thread at a time per rank should issue calls.
class Communicator {
 public:
  Communicator() = default;  // the empty communicator: size() == 0

  int rank() const;  ///< this rank, 0 ≤ rank < size(); -1 for an empty communicator
  int size() const;  ///< number of ranks; 0 for an empty communicator

  // ---- blocking collectives (counts in elements) ----

  /// recv[i] = op over ranks of send[i], on every rank. In place: send == recv.
  void allreduce(const void* send, void* recv, std::size_t count, DataType type, ReduceOp op,
                 const Options& options = {});
  /// Like allreduce, but only `root` receives the result (recv is ignored elsewhere and may be null).
  void reduce(const void* send, void* recv, std::size_t count, DataType type, ReduceOp op, int root,
              const Options& options = {});
  /// send holds size()*recv_count elements; rank r receives block r of the reduction.
  /// In place: recv == send + rank*recv_count (as NCCL), or send == recv (result at the start, as MPI).
  void reduce_scatter(const void* send, void* recv, std::size_t recv_count, DataType type, ReduceOp op,
                      const Options& options = {});
  /// recv (size()*send_count elements) gets every rank's block in rank order.
  /// In place: send == recv + rank*send_count (as NCCL) or send == recv (as MPI_IN_PLACE).
  void allgather(const void* send, void* recv, std::size_t send_count, DataType type, const Options& options = {});
  /// Like allgather with per-rank counts (recv_counts has size() entries, the same on every rank;
  /// blocks are packed in rank order). In place: send == recv + displacement(rank) or send == recv.
  void allgatherv(const void* send, std::size_t send_count, void* recv, std::span<const std::size_t> recv_counts,
                  DataType type, const Options& options = {});
  /// Copies root's buffer to every rank's buffer.
  void broadcast(void* buffer, std::size_t count, DataType type, int root, const Options& options = {});
  /// Block j of send (count_per_rank elements) goes to rank j, which stores it as its block `rank`.
  /// In place: send == recv.
  void alltoall(const void* send, void* recv, std::size_t count_per_rank, DataType type, const Options& options = {});
  /// Like alltoall with per-peer counts; blocks are packed in rank order (no displacements).
  /// send_counts[j] on rank i must equal recv_counts[i] on rank j. In place: send == recv.
  void alltoallv(const void* send, std::span<const std::size_t> send_counts, void* recv,
                 std::span<const std::size_t> recv_counts, DataType type, const Options& options = {});
  /// root's recv (size()*send_count elements) gets every rank's block in rank order.
  /// In place on root: send == recv + root*send_count.
  void gather(const void* send, void* recv, std::size_t send_count, DataType type, int root,
              const Options& options = {});
  /// Block r of root's send (size()*recv_count elements) goes to rank r.
  /// In place on root: recv == send + root*recv_count.
  void scatter(const void* send, void* recv, std::size_t recv_count, DataType type, int root,
               const Options& options = {});
  /// Returns on any rank only after every rank has entered it.
  void barrier(const Options& options = {});
  /// Point to point; messages between two ranks with the same tag arrive in order (a receive
  /// takes the earliest message not yet taken). A receive's count must equal the send's
  /// (otherwise Error(mismatch) on both sides: the receive raises it and aborts the communicator;
  /// a send that returned before, being eager, leaves it to the sender's next call). `peer` of a
  /// receive may be `any_source`: it takes the first message with `tag` to arrive from any rank
  /// (this one included), as MPI_ANY_SOURCE;
  /// the others stay, in order, for later receives. Receives of one tag match in the order
  /// issued, so a named receive issued after an unfinished any_source receive of its tag waits
  /// for it. An any_source receive holds size() staging buffers of the message's size while it
  /// waits. Returns the sender's rank. Errors: timeout, peer_failure, mismatch, as collectives.
  /// A send may return only once its receive was posted (as MPI_Ssend; over TCP it does, and over
  /// shared memory from 4 KiB): ranks that send to each other at once use sendrecv. Over shared
  /// memory a send of up to 4 KiB is eager (as MPI's standard send): it returns once its bytes are
  /// in the pair's ring, before the receive is posted.
  void send(const void* data, std::size_t count, DataType type, int peer, int tag = 0);
  int recv(void* data, std::size_t count, DataType type, int peer, int tag = 0);
  /// Sends `send` to `dest` and receives into `recv` from `source` at once, as MPI_Sendrecv: the
  /// exchange of a ring's or a pipeline's neighbours, where each rank's send first would wait for
  /// the other's. The messages match the peers' send and recv calls as the two calls would; the
  /// buffers must not overlap. `source` may be `any_source`. Returns the sender's rank.
  int sendrecv(const void* send, std::size_t send_count, int dest, void* recv, std::size_t recv_count, int source,
               DataType type, int send_tag = 0, int recv_tag = 0);

  // ---- nonblocking twins: same arguments, return at once ----

  Request iallreduce(const void* send, void* recv, std::size_t count, DataType type, ReduceOp op,
                     const Options& options = {});
  Request ireduce(const void* send, void* recv, std::size_t count, DataType type, ReduceOp op, int root,
                  const Options& options = {});
  Request ireduce_scatter(const void* send, void* recv, std::size_t recv_count, DataType type, ReduceOp op,
                          const Options& options = {});
  Request iallgather(const void* send, void* recv, std::size_t send_count, DataType type, const Options& options = {});
  Request iallgatherv(const void* send, std::size_t send_count, void* recv, std::span<const std::size_t> recv_counts,
                      DataType type, const Options& options = {});
  Request ibroadcast(void* buffer, std::size_t count, DataType type, int root, const Options& options = {});
  Request ialltoall(const void* send, void* recv, std::size_t count_per_rank, DataType type,
                    const Options& options = {});
  Request ialltoallv(const void* send, std::span<const std::size_t> send_counts, void* recv,
                     std::span<const std::size_t> recv_counts, DataType type, const Options& options = {});
  Request igather(const void* send, void* recv, std::size_t send_count, DataType type, int root,
                  const Options& options = {});
  Request iscatter(const void* send, void* recv, std::size_t recv_count, DataType type, int root,
                   const Options& options = {});
  Request ibarrier(const Options& options = {});
  Request isend(const void* data, std::size_t count, DataType type, int peer, int tag = 0);
  /// As recv; Request::source() gives the sender once it completed.
  Request irecv(void* data, std::size_t count, DataType type, int peer, int tag = 0);

  // ---- typed conveniences ----

  /// In place.
  template <class T>
  void allreduce(std::span<T> data, ReduceOp op, const Options& options = {}) {
    allreduce(data.data(), data.data(), data.size(), data_type_of<T>(), op, options);
  }
  /// Out of place; recv.size() must equal send.size().
  template <class T>
  void allreduce(std::span<const T> send, std::span<T> recv, ReduceOp op, const Options& options = {}) {
    check_span_sizes(send.size(), recv.size(), 1, "allreduce: recv.size() must equal send.size()");
    allreduce(send.data(), recv.data(), send.size(), data_type_of<T>(), op, options);
  }
  template <class T>
  void broadcast(std::span<T> data, int root, const Options& options = {}) {
    broadcast(data.data(), data.size(), data_type_of<T>(), root, options);
  }
  /// recv.size() must be size() * send.size().
  template <class T>
  void allgather(std::span<const T> send, std::span<T> recv, const Options& options = {}) {
    check_span_sizes(recv.size(), send.size(), size(), "allgather: recv.size() must be size() * send.size()");
    allgather(send.data(), recv.data(), send.size(), data_type_of<T>(), options);
  }
  /// send.size() must be size() * recv.size().
  template <class T>
  void reduce_scatter(std::span<const T> send, std::span<T> recv, ReduceOp op, const Options& options = {}) {
    check_span_sizes(send.size(), recv.size(), size(), "reduce_scatter: send.size() must be size() * recv.size()");
    reduce_scatter(send.data(), recv.data(), recv.size(), data_type_of<T>(), op, options);
  }

  /// `bytes` of memory that this rank's peers on the host can read in place (see SharedBuffer):
  /// a collective whose buffers lie in such memory on every rank skips the copies through the
  /// shared-memory segment. Local (no communication); the buffer may be used with any
  /// communicator, and outlive this one. Error(invalid_argument) for 0 bytes, Error(system) if
  /// the memory cannot be had.
  SharedBuffer allocate(std::size_t bytes) const;

  /// MPI_Comm_split: ranks with the same color form a communicator, ordered by (key, old rank).
  /// Collective over this communicator. A negative color gives an empty communicator.
  Communicator split(int color, int key) const;

  // ---- what this communicator runs over (local: no communication) ----

  /// The transport's name, as logs and tuning tables name it: "inproc", "shm", "tcp", "mpi", or
  /// a combination such as "shm+tcp". Error(invalid_argument) for an empty communicator.
  std::string_view transport_name() const;
  /// The algorithm that a call of `collective` moving `bytes` (the total over ranks for
  /// allgather, reduce_scatter and alltoall) runs when it asks for `requested`: automatic as the
  /// cost model and the tuning table resolve it, exactly as the call resolves it.
  Algorithm chosen_algorithm(Collective collective, std::size_t bytes,
                             Algorithm requested = Algorithm::automatic) const;
  /// Whether Algorithm::direct (every rank on one host's shared memory) serves `collective` here.
  bool serves_direct(Collective collective) const;
  /// Every algorithm a call of `collective` may ask for here, automatic first: the schedules that
  /// serve it, then direct where serves_direct, then mpi on an MPI communicator, then for
  /// allreduce hierarchical where init() learned that the ranks span hosts with several on one.
  std::vector<Algorithm> algorithms(Collective collective) const;

  /// Whether two handles are copies of one communicator (empty communicators are all equal).
  friend bool operator==(const Communicator& a, const Communicator& b) { return a.impl_ == b.impl_; }

 private:
  friend struct comm::Access;
  friend struct std::hash<Communicator>;
  explicit Communicator(std::shared_ptr<comm::CommImpl> impl) : impl_(std::move(impl)) {}
  static void check_span_sizes(std::size_t a, std::size_t b, std::size_t factor, const char* message);
  comm::CommImpl& checked() const;
  std::shared_ptr<comm::CommImpl> impl_;
};

/// dst[i] = a[i] op b[i] for i < count on the calling thread, with the kernels the collectives
/// reduce with (the same bits; f16 and bf16 computed in f32 and rounded to nearest even, integer
/// sum and prod wrapping, float min and max IEEE 754-2019's). `dst` may alias `a` or `b` exactly.
/// Error(invalid_argument) for avg (not element-wise: reduce with sum, then divide by the ranks),
/// an unknown op or type, a null buffer with count > 0 or a partial overlap.
void reduce_local(void* dst, const void* a, const void* b, std::size_t count, DataType type, ReduceOp op);

/// Joins the job described by the environment. Without a launcher, a job of one rank.
Communicator init();
/// The launcher that init() finds in the environment: "tutti-run", "mpirun", "torchrun", "srun"
/// or "none". Error(invalid_argument) naming the variable where the environment is malformed.
std::string launcher();

/// `p` communicators over the in-process transport, one per rank: give each to its own thread.
std::vector<Communicator> local_group(int p);

}  // namespace tutti

/// Copies of one communicator hash alike (a communicator as a key of an unordered map).
template <>
struct std::hash<tutti::Communicator> {
  std::size_t operator()(const tutti::Communicator& c) const noexcept {
    return std::hash<const void*>()(c.impl_.get());
  }
};
