// The communicator behind the public handle: validates a call, chooses its algorithm, builds
// its schedule and hands it to the operation queue. Every collective goes through `start`.
#pragma once

#include <array>
#include <chrono>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "comm/choice.hpp"
#include "comm/topology.hpp"
#include "exec/queue.hpp"
#include "schedule/schedule.hpp"
#include "tutti/tutti.hpp"

namespace tutti::comm {

/// One collective call as the user made it: the arguments (as transports that run collectives
/// themselves take them too) and the call's options.
struct Call : transport::NativeCall {
  Options options;
};

/// A Call with these fields (`counts`, `recv_counts`: the v-collectives' spans).
Call make_call(Collective collective, const void* send, void* recv, std::size_t count, DataType type,
               std::optional<ReduceOp> op, int root, const Options& options, std::span<const std::size_t> counts = {},
               std::span<const std::size_t> recv_counts = {});

/// Element counts of a call on this rank: what `send` and `recv` must hold.
struct Extents {
  std::size_t send = 0;
  std::size_t recv = 0;
};

class CommImpl {
 public:
  explicit CommImpl(std::unique_ptr<transport::Transport> transport);
  int rank() const { return rank_; }
  int size() const { return size_; }

  /// Validates, chooses the algorithm and starts the call. Throws Error(invalid_argument) or
  /// Error(unsupported) before anything is sent.
  /// `blocking`: the caller waits at once (the progress engine is left alone).
  Request start(const Call& call, bool blocking = false);
  Request start_point_to_point(bool is_send, const void* data, std::size_t count, DataType type, int peer, int tag,
                               bool blocking);
  /// A blocking send or receive: run by the caller (OperationQueue::run_messages) where it can
  /// be; returns the sender of a receive.
  int run_point_to_point(bool is_send, const void* data, std::size_t count, DataType type, int peer, int tag);
  int sendrecv(const void* send, std::size_t send_count, int dest, void* recv, std::size_t recv_count, int source,
               DataType type, int send_tag, int recv_tag);
  Communicator split(int color, int key);

  std::chrono::milliseconds default_timeout() const { return default_timeout_; }

  /// Whether only the caller's threads may progress this communicator (MPI below
  /// MPI_THREAD_SERIALIZED): nonblocking calls then advance only in test, wait and later calls.
  bool progressed_by_caller_only() { return queue_->transport().progressed_by_caller_only(); }
  /// The transport's name ("inproc", "shm", "tcp", "mpi").
  std::string_view transport_name() const { return queue_->transport().name(); }
  transport::Kind transport_kind() const { return queue_->transport().kind(); }
  /// Whether the shared-memory direct algorithms serve `collective` on this communicator.
  bool direct_serves(Collective collective) const;
  /// What `requested` resolves to for a call of `collective` of `bytes` (the total over ranks for
  /// allgather, reduce_scatter and alltoall), exactly as `start` resolves it.
  Algorithm chosen_algorithm(Collective collective, Algorithm requested, std::size_t bytes) const;

  /// The topology, learned at the first call that needs it (a collective: an allgather).
  const Topology& topology();
  /// Whether the topology is known and spans several hosts with several ranks on one (hierarchical
  /// allreduce then has something to do).
  bool spans_hosts_with_neighbours() const { return topology_ && topology_->spans_hosts_with_neighbours(); }
  /// Makes the topology known without a collective (init() learned every rank's host already).
  void set_topology(Topology topology) {
    topology_ = std::move(topology);
    memo_.valid = false;  // a choice made before knew no hosts
  }
  /// The link init() measured (choice::probe_link, interned: choice::intern_cost), which automatic
  /// choices price with where the tuning table gives no cost_model for the transport (choice::cost_for);
  /// splits inherit it. Every rank sets the same.
  void set_link_cost(const transport::CostParams* link) {
    link_cost_ = link;
    memo_.valid = false;  // a choice made before priced the transport's costs
  }
  const transport::CostParams* link_cost() const { return link_cost_; }
  /// Test-only: this rank's host, instead of TUTTI_HOST or gethostname() (ranks as threads share
  /// one process). Takes effect while the topology is not yet known; inherited by split.
  void set_host_override(std::string host) { host_override_ = std::move(host); }

  /// The intra-host and inter-host communicators (split from this one, learning the topology
  /// first if needed).
  struct Hierarchy {
    Communicator intra;  // the ranks of my host, in rank order
    Communicator inter;  // the ranks with my local index, one per host
    /// Fails both on every rank with `error` (a step failed, here or on the caller's communicator,
    /// or was abandoned), so that no rank waits in a step for this one; never throws.
    void abort(const Error& error) const noexcept;
  };
  /// A pair of its own for layers that run their steps on the caller's thread (the sparse layer's
  /// hierarchical allreduce), apart from the pair whose queued steps hierarchical allreduce runs:
  /// calls on one pair never interleave with the other's. Collective at the first call (two splits).
  Hierarchy& caller_hierarchy();
  /// While one lives, the nonblocking calls started on `comm` are waited for at once by their
  /// caller, which progresses them (exec::OperationQueue::wait): the progress engine is not woken
  /// for them (a composite's steps run on the caller's thread, as a blocking call does, and stay
  /// requests that the caller can wait on for a while and look elsewhere between waits).
  class CallerWaits {
   public:
    explicit CallerWaits(CommImpl& comm) : comm_(comm), before_(comm.caller_waits_) { comm.caller_waits_ = true; }
    ~CallerWaits() { comm_.caller_waits_ = before_; }
    CallerWaits(const CallerWaits&) = delete;
    CallerWaits& operator=(const CallerWaits&) = delete;

   private:
    CommImpl& comm_;
    bool before_;
  };
  /// Fails the communicator on every rank with `error` (through its transport: each rank's queue
  /// fails its operations at its next progress), from outside its operations (a composite whose
  /// steps run on this communicator learned of a failure elsewhere).
  void abort_transport(const Error& error) { queue_->transport().abort(error, transport::no_seq); }

 private:
  /// The signature of `call` run with `algorithm`, with the communicator's next sequence number.
  transport::Signature next_signature(const Call& call, Algorithm algorithm);
  /// A blocking call run at once by the transport (OperationQueue::run_now); false: not taken
  /// (`validated`: the call's extents where it checked them in full).
  bool run_now(const Call& call, std::optional<Extents>& validated);
  /// Memory an in-place call needs besides the caller's buffers.
  struct Staging {
    std::unique_ptr<std::byte[]> input;   // a snapshot of the input (alltoall(v) in place)
    std::unique_ptr<std::byte[]> output;  // the result before it moves to recv (reduce_scatter in place)
  };
  exec::Operation::Buffers map_buffers(const Call& call, const Extents& extents, Staging& staging) const;
  std::chrono::milliseconds timeout_of(const Call& call) const;
  Request submit(std::shared_ptr<exec::Operation> op, bool blocking);
  Request submit_collective(std::shared_ptr<exec::Operation> op, bool blocking);
  Request start_message(const exec::PointToPoint& message, bool blocking);
  /// The three ways a call runs: a schedule over the transport, a collective the transport runs
  /// itself (direct, mpi), or hierarchical's steps on the intra- and inter-host communicators.
  Request start_call(const Call& call, bool blocking);  // start(), but for turning std::bad_alloc into an Error
  Request start_schedule(const Call& call, Algorithm algorithm, const Extents& extents, bool blocking);
  Request start_native(const Call& call, Algorithm algorithm, bool blocking);
  Request start_hierarchical(const Call& call, bool blocking);  // hierarchical.cpp
  Hierarchy& hierarchy();
  /// Topology::blocked_ranks_per_host where the topology is known and the model prices this
  /// transport's hosts (choice::within_host: routed, tcp); else 0.
  int host_blocks() const;

  // The last choice of `automatic` (calls of one size repeat, as in training): skips the lookup.
  struct ChoiceMemo {
    Collective collective{};
    Algorithm requested{};
    std::size_t bytes = 0;
    const void* version = nullptr;  // choice::active_version() when it was made
    Algorithm algorithm{};
    bool valid = false;
  };
  mutable ChoiceMemo memo_;

  // The plans of the last few schedule-driven calls (calls repeat, as in training): a repeat
  // skips building its schedule and graph. Calls with per-rank counts are planned each time.
  struct PlanKey {
    Algorithm algorithm{};
    Collective collective{};
    std::size_t count = 0, elem_size = 0;
    int root = 0;
    bool runs_ahead = false;      // the call runs ahead (run_ahead_)
    std::size_t chunk_bytes = 0;  // schedule::fit_chunks (it depends on the cost model)
    bool operator==(const PlanKey&) const = default;
  };
  std::shared_ptr<const exec::Plan> plan_for(const Call& call, Algorithm algorithm,
                                             const transport::Signature& signature, bool run_ahead);
  exec::RunAheadWindow run_ahead_;  // which rooted calls run ahead and which ring (exec::Plan::run_ahead_weight)
  static constexpr std::size_t kPlans = 8;
  struct CachedPlan {
    PlanKey key;
    std::shared_ptr<const exec::Plan> plan;
  };
  std::array<CachedPlan, kPlans> plans_;
  std::size_t next_plan_ = 0;  // the slot the next new plan takes (round robin)

  std::shared_ptr<exec::OperationQueue> queue_;
  int rank_;
  int size_;
  std::chrono::milliseconds default_timeout_;
  std::string host_override_;
  std::optional<Topology> topology_;
  const transport::CostParams* link_cost_ = nullptr;
  std::optional<Hierarchy> hierarchy_;
  std::optional<Hierarchy> caller_hierarchy_;
  bool caller_waits_ = false;  // CallerWaits
};

/// Test-only: gives this in-process rank its own host (see CommImpl::set_host_override).
void set_host_for_testing(Communicator& comm, std::string host);

/// Checks the call's arguments (throws Error(invalid_argument) naming the argument) and returns
/// the extents of its buffers on this rank.
Extents validate(const Call& call, int rank, int size);

/// a * b, or Error(invalid_argument) "<operation>: <what> overflows (a * b exceeds SIZE_MAX)".
/// The one overflow-checked product of every path that turns a caller's counts into sizes.
std::size_t checked_product(std::string_view operation, std::size_t a, std::size_t b, std::string_view what);
/// count * size_of(type) in bytes, checked as checked_product (`type` must be valid).
std::size_t checked_bytes(std::string_view operation, std::size_t count, DataType type);

/// True only for a call that validate() accepts on rank `rank`, of the kinds and forms the
/// transports' short ways take (Transport::run_now): allreduce, reduce, reduce_scatter, allgather,
/// alltoall, broadcast, gather or scatter of up to plain_count_limit elements (no product of sizes
/// can overflow), with the buffers this rank uses not overlapping or in one of the in-place forms
/// validate() takes (transport/in_place.hpp), and barrier. False says nothing: validate() decides.
bool plainly_valid(const Call& call, int rank, int size);
inline constexpr std::size_t plain_count_limit = std::size_t{1} << 20;

/// Checks a send's or recv's arguments (type, peer in [0, size), tag >= 0, data for count > 0,
/// count * element size within size_t); throws Error(invalid_argument) naming the argument.
void validate_point_to_point(bool is_send, const void* data, std::size_t count, DataType type, int peer, int tag,
                             int size);

}  // namespace tutti::comm
