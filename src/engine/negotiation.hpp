// How the engine's ranks agree on what to run: the per-cycle round every rank takes part in, and
// the table every rank builds from it.
//
// A rank enqueues a tensor on one of two paths. On the *cached path*, when the response cache
// (the Table's) describes it exactly and the Table holds no entry for its name, the rank only
// counts it: each cycle every rank contributes a vector of u32 to one allreduce (sum), a header
// (Tally) and a count per cache slot (1 where the slot's tensor is pending on this rank), so
// that a slot whose sum is the number of ranks is ready on every rank (sum = p is AND, sum > 0
// is OR). That allreduce is the whole steady state: its payload is 4 bytes per cached tensor plus
// a fixed header, whatever the number of ranks. Otherwise the tensor waits for the *full
// exchange*: each rank's Message (its announcements, flags and rank 0's stall verdicts) in a
// 512-byte slot allgathered (kSlot). It runs in a cycle only when some rank asks for it in the
// header: it has something to announce that the cache does not hold, is shutting down,
// aborting or joined, has an expired (stall) verdict, or holds a tensor on the cached path for
// half the stall warning (or limit), so that the stall inspector can name the missing ranks.
// In a full exchange every rank also moves its tensors on the cached path that are not ready
// everywhere into the Table (as slot bits in its message), so that mismatches and stalls are
// judged there exactly as for uncached tensors. Every rank applies the same tally and messages to
// its Table, so every rank's Table goes through the same states: the same tensors become ready in
// the same cycle, in the same order, and the cache assigns, replaces and evicts the same slots.
// Every round also carries the size and a hash of the cache, so ranks whose caches differ (which
// the construction rules out: every Table starts empty with the engine) are detected at once.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "tutti/types.hpp"

namespace tutti::engine {

/// The collectives the engine runs on named tensors.
inline bool engine_collective(Collective c) {
  return c == Collective::allreduce || c == Collective::allgather || c == Collective::broadcast;
}

/// What a rank enqueued under a name; ranks must agree on all of it.
struct Descriptor {
  std::string name;
  Collective kind = Collective::allreduce;  // allreduce, allgather or broadcast
  DataType type = DataType::f32;
  ReduceOp op = ReduceOp::sum;  // allreduce only
  std::int32_t root = 0;        // broadcast only
  std::uint64_t count = 0;
  std::vector<std::int64_t> dims = {};  // the tensor's shape, where the caller gave one (else empty)

  bool same_shape(const Descriptor& other) const {
    return kind == other.kind && type == other.type && op == other.op && root == other.root && count == other.count &&
           dims == other.dims;
  }
  /// e.g. "allreduce of 1000 f32 (sum)", "allreduce of 391 f32 [17, 23] (sum)".
  std::string shape() const;
};

/// The most dimensions a descriptor's shape may have (a damaged message claims more).
inline constexpr std::size_t kMaxDims = 64;

/// One rank's message of one cycle.
struct Message {
  bool shutting_down = false;
  bool aborting = false;              // the rank's engine is being destroyed by an error: every rank stops
  bool waiting = false;               // a caller on this rank is blocked waiting for a tensor
  bool joined = false;                // the rank has joined (Engine::join) and enqueues nothing more
  std::vector<std::uint32_t> cached;  // cache slots of names enqueued with the cached description
  std::vector<Descriptor> described;  // names enqueued that the cache does not describe
  std::vector<std::string> expired;   // rank 0 only: names that stalled past the stall limit

  std::vector<std::byte> encode(std::size_t cache_size) const;
  /// Throws Error(system) on a damaged message.
  static Message decode(std::span<const std::byte> bytes, std::size_t cache_size);
};

/// What the Table decided in one cycle.
struct Decision {
  // In the order every rank runs them: first those on the cached path that every rank holds, in
  // cache slot order; then those the full exchange completed, in order of first announcement.
  std::vector<Descriptor> ready;
  struct Failure {
    std::string name;
    ErrorCode code;
    std::string message;
  };
  std::vector<Failure> failed;  // names that fail (on the ranks that enqueued them)
  bool shutdown = false;        // every rank is shutting down
  std::vector<int> aborted_by;  // ranks whose engine left on an error: every rank stops
  bool all_waiting = false;     // a caller on every rank is blocked waiting
  int waiting_ranks = 0;        // ranks on which a caller is blocked waiting
  bool progress = false;        // some rank announced something, or something completed
  bool joined = false;          // every rank has joined: the join completes (and joins are reset)
  int last_joined = -1;         // with `joined`: the rank that joined last (the highest of its cycle)
};

/// A tensor some ranks have enqueued and some not yet, for the stall check.
struct Waiting {
  std::string name;
  std::vector<int> enqueued, missing;
  std::chrono::steady_clock::time_point since;  // when this rank first saw it
};

/// The fusion policy: which ready tensors run together. `ready` in the order every rank runs
/// them; returns the collective calls (jobs) as indices into `ready`, in order. Allreduces of one
/// (type, op) share a bucket up to `fusion_threshold` bytes (0: every tensor alone), the first
/// bucket of a step (`step_start`: the engine had nothing ready before) up to
/// min(first_bucket_bytes, fusion_threshold) so that communication starts early; allgathers and
/// broadcasts run alone. The engine and the step simulator (src/sim) both plan with it.
std::vector<std::vector<std::size_t>> plan_fusion(std::span<const Descriptor> ready, std::size_t fusion_threshold,
                                                  std::size_t first_bucket_bytes, bool step_start);

/// The sum of every rank's contribution to a cycle's allreduce (Ledger::contribution), decoded.
struct Tally {
  /// The header's u32 fields: exchange, waiting, fresh, the cache's size and its hash.
  static constexpr std::size_t kHeader = 5;
  std::uint32_t exchange = 0;          // ranks that ask for the full exchange this cycle
  std::uint32_t waiting = 0;           // ranks on which a caller is blocked waiting (or shutting down)
  std::uint32_t fresh = 0;             // ranks that put a tensor on the cached path this cycle
  std::vector<std::uint32_t> pending;  // per cache slot: ranks holding it on the cached path
};

/// The first allgather of a negotiation round carries up to kSlot bytes per rank (a 4-byte
/// length, then the message); a longer message sends its rest in a second, allgatherv, call.
inline constexpr std::size_t kSlot = 512;
inline constexpr std::size_t kSlotPayload = kSlot - sizeof(std::uint32_t);
/// An engine with nothing pending on any rank negotiates every kIdleCycles cycles (an enqueue
/// starts a round at once): most of a long step's rounds are these (docs/scaling.md).
inline constexpr int kIdleCycles = 25;

class Table {
 public:
  explicit Table(int size, std::size_t cache_capacity = 65536) : size_(size), cache_capacity_(cache_capacity) {}
  int size() const { return size_; }

  /// The cache slot that describes `d` exactly, if any.
  std::optional<std::uint32_t> cached_slot(const Descriptor& d) const;
  std::size_t cache_size() const { return cache_.size(); }
  /// What the cache holds, as one hash (of every slot's name and description).
  std::uint32_t cache_hash() const { return cache_hash_; }
  /// The description in a cache slot.
  const Descriptor& cached(std::uint32_t slot) const { return cache_.at(slot); }
  /// Whether some rank announced `name` in a full exchange and it is not decided yet (a rank's
  /// tensor of that name must then be announced in a full exchange too).
  bool has_entry(const std::string& name) const { return pending_.count(name) != 0; }

  /// Decodes a cycle's summed allreduce; throws Error(system) if the ranks' caches disagree
  /// (another size or hash than this Table's) or the vector has the wrong length.
  Tally tally(std::span<const std::uint32_t> sums) const;

  /// Applies one cycle: the allreduce's tally and, in a full exchange, every rank's message
  /// (messages[r] from rank r; empty in the steady state).
  Decision apply(const Tally& tally, const std::vector<Message>& messages, std::chrono::steady_clock::time_point now);
  /// A full exchange alone (no tensor on the cached path).
  Decision apply(const std::vector<Message>& messages, std::chrono::steady_clock::time_point now) {
    return apply(Tally{}, messages, now);
  }
  /// This rank saw `name` first at `since` (it held it on the cached path before announcing it):
  /// its stall checks count from then.
  void backdate(const std::string& name, std::chrono::steady_clock::time_point since);

  /// Tensors enqueued by some ranks only, that a full exchange announced.
  std::vector<Waiting> waiting() const;
  /// Nothing pending on any rank: no entry, and no tensor held on the cached path by some ranks
  /// only in the last cycle.
  bool idle() const { return pending_.empty() && !partial_; }

 private:
  struct Entry {
    std::uint64_t order = 0;                       // order of first announcement, over all cycles
    std::vector<std::optional<Descriptor>> ranks;  // what each rank announced
    int announced = 0;
    std::optional<Decision::Failure> failure;  // set once it expired (rank 0's verdict)
    std::chrono::steady_clock::time_point since;
  };
  std::optional<Decision::Failure> disagreement(const std::string& name, const Entry& e) const;
  void announce(int rank, const Descriptor& d, std::chrono::steady_clock::time_point now, Decision& decision);
  void exchange(const std::vector<Message>& messages, std::chrono::steady_clock::time_point now, Decision& decision);
  void remember(const Descriptor& d);  // caches a tensor the full exchange made ready
  void set_slot(std::uint32_t slot, const Descriptor& d);

  int size_;
  std::size_t cache_capacity_;
  std::uint64_t next_order_ = 0;
  void answer_for_joined(Decision& decision);

  std::map<std::string, Entry> pending_;
  std::vector<bool> joined_;  // ranks that have joined and not yet seen every rank join
  int last_joined_ = -1;
  // The response cache: a slot per name; full, it evicts the slot least recently ready (never one
  // ready in this cycle, `used_` counting cycles).
  std::vector<Descriptor> cache_;
  std::vector<std::uint64_t> used_;  // per slot: the last cycle it was ready
  std::unordered_map<std::string, std::uint32_t> cache_slot_;
  std::uint32_t cache_hash_ = 0;  // XOR of the slots' hashes
  std::uint64_t cycle_ = 0;
  bool partial_ = false;  // the last cycle's tally: a slot held on the cached path by some ranks only
};

/// One rank's side of a cycle: what it enqueued and has not yet seen decided. The engine keeps one
/// per rank; the step simulator one per class of ranks.
class Ledger {
 public:
  using Clock = std::chrono::steady_clock;
  /// A tensor this rank enqueued at `since`: on the cached path when `table`'s cache describes it
  /// exactly and the table has no entry for its name, else announced in the next full exchange.
  void enqueue(const Descriptor& d, const Table& table, Clock::time_point since);
  /// Whether this rank asks for the full exchange: something to announce, or a tensor held on the
  /// cached path since before `stale`.
  bool needs_exchange(Clock::time_point stale) const;
  /// This rank's part of the cycle's allreduce: the header, then 1 per cache slot it holds.
  std::vector<std::uint32_t> contribution(const Table& table, bool exchange, bool waiting) const;
  /// For the full exchange: puts into `m` what this rank announces, including its tensors on the
  /// cached path not ready everywhere (they move to the table). Returns those moved with the time
  /// each was enqueued (for Table::backdate).
  std::vector<std::pair<std::string, Clock::time_point>> announce(const Tally& tally, const Table& table, Message& m);
  /// After the table applied the cycle: what became ready leaves the cached path, and a full
  /// exchange took everything else.
  void settle(const Tally& tally, bool exchanged, std::size_t ranks);
  bool empty() const { return held_.empty() && unannounced_.empty(); }
  std::size_t held() const { return held_.size(); }

 private:
  struct Held {
    Descriptor descriptor;
    Clock::time_point since;
  };
  std::map<std::uint32_t, Held> held_;  // on the cached path, by slot
  std::vector<Held> unannounced_;       // for the next full exchange, in enqueue order
  bool fresh_ = false;                  // put something on the cached path since the last cycle
};

/// "rank 2" or "ranks 0, 1, 3": how the engine's messages name ranks.
std::string rank_list(const std::vector<int>& ranks);

}  // namespace tutti::engine
