// Moving bytes between two ranks of one communicator. A transport posts sends and receives
// without blocking and reports completion through `Completion` objects that it may set from
// any thread; `wait` sleeps until one of this rank's completions changes.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "transport/kind.hpp"
#include "tutti/types.hpp"

namespace tutti::transport {

struct NativeCall;

/// What one rank calls, carried with every collective so that ranks that disagree are caught
/// before any byte is written.
struct Signature {
  /// What `call` declares when it runs `algorithm`: every field but `seq` (0; the operation queue
  /// numbers the call). The v-collectives compare their counts through `counts_hash` (allgatherv's
  /// recv_counts; alltoallv's differ per rank by design) instead of `count`.
  static Signature of(const NativeCall& call, Algorithm algorithm);

  std::uint64_t seq = 0;
  Collective collective = Collective::allreduce;
  std::size_t count = 0;
  DataType type = DataType::u8;
  std::optional<ReduceOp> op;                  // reductions only
  Algorithm algorithm = Algorithm::automatic;  // the algorithm this rank runs (ranks must agree)
  int root = -1;
  std::uint64_t counts_hash = 0;  // v-collectives: hash of the counts every rank must agree on
  bool operator==(const Signature&) const = default;
  std::string describe() const;
};

/// A Signature as bytes, for transports that carry it between processes (fixed layout, 40 bytes).
struct WireSignature {
  std::uint64_t seq = 0;
  std::uint64_t count = 0;
  std::uint64_t counts_hash = 0;
  std::int32_t root = -1;
  std::uint8_t collective = 0;  // Collective's value (a peer's byte may be out of range)
  std::uint8_t algorithm = 0;   // Algorithm's value (likewise)
  std::uint8_t type = 0;
  std::int8_t op = -1;         // -1 = none
  std::uint64_t reserved = 0;  // keeps the struct free of padding, so that it compares as bytes
  /// Every field, `reserved` included: a peer's signature agrees with ours only byte for byte.
  bool operator==(const WireSignature&) const = default;
};
static_assert(sizeof(WireSignature) == 40);
static_assert(std::has_unique_object_representations_v<WireSignature>, "WireSignature has padding");
WireSignature to_wire(const Signature& signature);
Signature from_wire(const WireSignature& wire);

enum class Channel : std::uint8_t { collective, point_to_point };

/// Identifies one message of a communicator: (channel, seq, index) plus the sender's rank.
/// Collectives: seq = sequence number, index = k-th message from that sender in the call.
/// Point to point: seq = tag, index = k-th message with that tag from that sender.
struct MessageKey {
  Channel channel = Channel::collective;
  std::uint64_t seq = 0;
  std::uint32_t index = 0;
  /// A send of a call that runs ahead of its peers (exec::Plan::notices): nothing waits on its
  /// arrival before the next call, so a transport may hold a small one back a moment to send it
  /// with the next (TCP does). Not part of what matches.
  bool runs_ahead = false;
};

/// State of one posted operation. Set by the transport (from any thread), read by the executor.
/// `peer` and `key` are recorded at post time so that the transport can find it to cancel it.
struct Completion {
  enum State : int { idle, posted, done, failed, cancelled };
  State state() const { return static_cast<State>(state_.load(std::memory_order_acquire)); }
  void set(State s) { state_.store(s, std::memory_order_release); }
  std::atomic<int> state_{idle};
  std::string error;  // written before the state becomes `failed`
  int peer = -1;
  bool is_send = false;
  MessageKey key;
  int route = -1;  // a transport that forwards operations to others (routed): which one holds it
};

/// Why a communicator was aborted: the first error, and the sequence number of the collective
/// that failed (`no_seq` for point to point), so that a rank that reaches that same call later
/// raises the same error.
struct Failure {
  Error error;
  std::uint64_t seq;
};
inline constexpr std::uint64_t no_seq = ~std::uint64_t{0};

/// One collective call in the public API's terms (the arguments of comm::Call), as the
/// collectives a transport runs itself take it:
/// counts in elements of `type`; broadcast's buffer is `recv`; in place is send == recv, in the
/// MPI forms (allgather: this rank's block already in its slot of recv; reduce_scatter: the
/// result at the start of recv). `counts` is allgatherv's recv_counts or alltoallv's send_counts,
/// `recv_counts` alltoallv's. The caller has validated the arguments.
struct NativeCall {
  Collective collective = Collective::allreduce;
  const void* send = nullptr;
  void* recv = nullptr;
  std::size_t count = 0;
  DataType type = DataType::u8;
  std::optional<ReduceOp> op;
  int root = -1;
  std::span<const std::size_t> counts;
  std::span<const std::size_t> recv_counts;
};

/// A collective a transport runs itself instead of through a schedule (shared memory's direct
/// algorithms, MPI's own collectives). The operation queue starts it once every earlier
/// collective finished and progresses it like any other operation. Not thread-safe.
class NativeCollective {
 public:
  virtual ~NativeCollective() = default;
  /// The caller's signature, given before the first `progress` (transports that compare
  /// signatures themselves keep it).
  virtual void bind(const Signature& /*signature*/) {}
  /// Advances without blocking; true once the result is in place. Throws Error on failure
  /// (timeout, peer_failure, mismatch, or the communicator's error), after aborting the
  /// communicator so that every rank fails alike.
  virtual bool progress() = 0;
  /// As `progress`, for a caller that spins on it: a false answer need not arrange for anything
  /// to wake this rank (which `progress` must, for a caller that then waits on the transport).
  virtual bool poll() { return progress(); }
  /// The ranks it waits for (empty when the transport cannot tell).
  virtual std::vector<int> waiting_for() const { return {}; }
  /// How often a waiter must progress it when completions elsewhere do not wake this transport's
  /// waiters (a composite whose steps run on other communicators); nullopt: the wake-ups suffice.
  virtual std::optional<std::chrono::microseconds> poll_period() const { return std::nullopt; }
};

/// A pause of the core between two polls of a spinning wait.
inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

class Transport;

/// Polls of a small collective before finish() first reads the clock or arranges a wake-up: its
/// peers answer within a microsecond or so.
inline constexpr int finish_spins = 128;

/// Runs `run` to completion on the caller's thread (progress, then the transport's wait, in
/// turn), for a caller with nothing else in flight on the communicator. Errors: what `progress`
/// throws, after aborting the communicator with it under `signature`'s seq; Error(timeout) once it
/// has waited `timeout`, naming the call and the ranks it waits for.
void finish(NativeCollective& run, Transport& transport, const Signature& signature, std::chrono::milliseconds timeout);

class Transport {
 public:
  virtual ~Transport() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  /// Identifies the communicator among all communicators of the job.
  virtual std::uint64_t id() const = 0;
  /// The transport's name as TUTTI_TRANSPORT spells it: "inproc", "shm", "tcp" or "mpi"; or
  /// "shm+tcp" (routed: shared memory within a host, TCP between hosts; the default, not a setting).
  virtual std::string_view name() const = 0;
  /// What this transport is: the decisions about a call (native algorithms, default costs) key on it.
  virtual Kind kind() const = 0;
  /// This rank's transport of a sub-communicator `id` made of `ranks` (in this communicator's
  /// numbering, in the new order); this rank is ranks[new_rank]. Every member calls it alike.
  virtual std::unique_ptr<Transport> split(std::uint64_t id, const std::vector<int>& ranks, int new_rank) = 0;

  /// True when `announce` catches every disagreement by itself (a table all ranks see). Otherwise
  /// the executor adds to every collective a 40-byte message carrying the caller's signature to
  /// the next rank on a ring, so that any disagreement is caught by some rank, which aborts all.
  virtual bool detects_every_mismatch() const { return false; }
  /// True when every message carries its sender's signature and the receiving rank compares it with
  /// its own on arrival, whether or not a receive for it is posted (TCP's frame headers). A
  /// collective whose every rank sends to the next one at once then needs no signature message:
  /// its first message does that work (see ScheduleOperation::messages_carry_signatures).
  bool checks_message_signatures() const { return transport::checks_message_signatures(kind()); }

  /// Sends this rank's signature of collective `seq` (announced) to `peer`, which compares it with
  /// its own on arrival and keeps nothing: how a rank waiting for a message of a call that sends no
  /// signature ring tells its sender which call it is in (Plan::run_ahead_weight). Only transports that
  /// check message signatures are asked.
  virtual void notify_signature(int /*peer*/, std::uint64_t /*seq*/) {}

  /// Starts a collective: registers this rank's signature. When ranks disagree the communicator
  /// is aborted with Error(mismatch) naming both ranks and signatures (see `aborted`).
  virtual void announce(const Signature& signature) = 0;

  /// Posts a send of `bytes` from `data` (valid until completion) to `peer`.
  virtual void post_send(int peer, const MessageKey& key, const void* data, std::size_t bytes, Completion* done) = 0;
  /// Posts a receive of exactly `bytes` into `data` from `peer`. A size disagreement fails both sides.
  virtual void post_recv(int peer, const MessageKey& key, void* data, std::size_t bytes, Completion* done) = 0;
  /// Posts a receive whose data is combined on arrival: dst = operand op incoming. Returns false
  /// when the transport cannot do that itself (the executor then receives into staging memory).
  virtual bool post_recv_reduce(int peer, const MessageKey& key, void* dst, const void* operand, std::size_t count,
                                DataType type, ReduceOp op, Completion* done) = 0;
  /// Withdraws a posted operation; returns once the transport no longer touches its buffer.
  virtual void cancel(Completion* done) = 0;
  /// Withdraws a posted point-to-point receive whose message has not begun to arrive, so that the
  /// message goes to a later receive of the same key (a receive from any source gives up the
  /// peers it did not take). Returns true once withdrawn (state cancelled); false when its
  /// message has arrived or begun to (it then completes, or fails, as usual, into its buffer).
  /// The default suits transports whose `cancel` never drops part of a matched message.
  virtual bool withdraw_recv(Completion* done) {
    cancel(done);
    return done->state() == Completion::cancelled;
  }

  /// Generation counter of this rank's completions; `wait` returns when it differs from `seen`
  /// (or at the deadline). Lets the executor sleep instead of spinning.
  virtual std::uint64_t generation() const = 0;
  virtual void wait(std::uint64_t seen, std::chrono::steady_clock::time_point deadline) = 0;
  /// `wait` for a thread that nobody waits on (the progress engine): sleeps at once where `wait`
  /// would first spin, so that it leaves the cores to the callers and the peers.
  virtual void wait_in_background(std::uint64_t seen, std::chrono::steady_clock::time_point deadline) {
    wait(seen, deadline);
  }
  /// Bumps the generation and wakes this rank's waiters (an operation finished on another thread).
  virtual void wake() = 0;
  /// Passes a moment between two polls of a spinning caller: a pause of the core, or giving it up
  /// where ranks outnumber cores (the peer being waited for may need it).
  virtual void relax() { cpu_relax(); }
  /// True when only the threads that call the communicator may progress it (MPI below
  /// MPI_THREAD_SERIALIZED): the progress engine then leaves it alone, and nonblocking operations
  /// advance only inside the caller's test, wait and later calls.
  virtual bool progressed_by_caller_only() const { return false; }
  /// Drives the transport's own I/O without blocking (copying through rings, sockets). Called by
  /// whichever thread progresses the executor; transports whose peers move the data do nothing.
  virtual void progress() {}

  /// Whether this transport runs `collective` itself with `algorithm` (shm: Algorithm::direct;
  /// mpi: Algorithm::mpi). Every rank of a communicator answers alike.
  virtual bool serves_natively(Algorithm /*algorithm*/, Collective /*collective*/) const { return false; }
  /// Prepares a collective the transport runs itself (nothing moves before its first `progress`;
  /// it fails once it has waited `timeout`, counted from its first wait: a call that never waits
  /// never reads the clock). Throws Error(unsupported) unless serves_natively(algorithm,
  /// call.collective), or when the transport cannot take these arguments (the same on every rank).
  virtual std::unique_ptr<NativeCollective> start_native(Algorithm algorithm, const NativeCall& call,
                                                         std::chrono::milliseconds timeout);
  /// Runs a blocking collective at once on the caller's thread, when the communicator has nothing
  /// else outstanding and the transport has a short way for it (shm: a small direct collective,
  /// see run_now in shm/direct_inline.cpp). `signature` is the one it announces (its seq the
  /// communicator's next). false: it declined, and nothing happened (the caller takes the general
  /// path); true: it completed. An error aborts the communicator and is thrown, as finish() does.
  virtual bool run_now(Algorithm /*algorithm*/, const NativeCall& /*call*/, const Signature& /*signature*/,
                       std::chrono::milliseconds /*timeout*/) {
    return false;
  }

  /// Set once the communicator is aborted (by any rank): the first error, to be raised by every rank.
  virtual std::optional<Failure> aborted() const = 0;
  /// Aborts the communicator for every rank with `error`, waking all of them.
  virtual void abort(const Error& error, std::uint64_t seq) = 0;
};

}  // namespace tutti::transport
