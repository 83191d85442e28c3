// How the engine's ranks agree on what to run: the per-cycle message each rank sends, and the
// table every rank builds from all ranks' messages.
//
// Each cycle every rank sends one message: the tensors it enqueued since the previous cycle
// (a bit for each name the response cache knows with the same description, the full description
// otherwise), whether it is shutting down, and (rank 0 only) the names it declares stalled for
// too long. Every rank decodes every rank's message in rank order and applies it to its Table,
// so that every rank's Table goes through the same states: the same tensors become ready in the
// same cycle, in the same order, and the cache assigns the same slots. No rank coordinates and
// the steady state costs one small allgather per cycle.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
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
  std::vector<Descriptor> ready;  // in the order every rank runs them
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

/// The first allgather of a negotiation round carries up to kSlot bytes per rank (a 4-byte
/// length, then the message); a longer message sends its rest in a second, allgatherv, call.
inline constexpr std::size_t kSlot = 512;
inline constexpr std::size_t kSlotPayload = kSlot - sizeof(std::uint32_t);
/// An engine with nothing pending on any rank negotiates every kIdleCycles cycles.
inline constexpr int kIdleCycles = 10;

class Table {
 public:
  explicit Table(int size, std::size_t cache_capacity = 65536) : size_(size), cache_capacity_(cache_capacity) {}

  /// The cache slot that describes `d` exactly, if any (a rank then sends one bit).
  std::optional<std::uint32_t> cached_slot(const Descriptor& d) const;
  std::size_t cache_size() const { return cache_.size(); }

  /// Applies every rank's message of one cycle (messages[r] from rank r).
  Decision apply(const std::vector<Message>& messages, std::chrono::steady_clock::time_point now);

  /// Tensors enqueued by some ranks only.
  std::vector<Waiting> waiting() const;
  bool idle() const { return pending_.empty(); }

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

  int size_;
  std::size_t cache_capacity_;
  std::uint64_t next_order_ = 0;
  void answer_for_joined(Decision& decision);

  std::map<std::string, Entry> pending_;
  std::vector<bool> joined_;  // ranks that have joined and not yet seen every rank join
  int last_joined_ = -1;
  std::vector<Descriptor> cache_;
  std::unordered_map<std::string, std::uint32_t> cache_slot_;
};

/// "rank 2" or "ranks 0, 1, 3": how the engine's messages name ranks.
std::string rank_list(const std::vector<int>& ranks);

}  // namespace tutti::engine
