// Algorithms as data. A schedule is one rank's list of steps for one collective call; it does
// no I/O. The executor runs it over a transport, the cost model counts it, tests check it.
//
// Buffers and regions. A step names regions of three buffers, in elements:
//   input   — the caller's send buffer          output — the caller's recv buffer
//   scratch — `Schedule::scratch_count` elements the executor allocates for the call.
// Layout per collective (p ranks, r = this rank, c = Params::count):
//   allreduce       input c,            output c
//   reduce          input c,            output c on root only (non-roots must not touch output)
//   reduce_scatter  input p*c,          output c
//   allgather       input c,            output p*c
//   allgatherv      input counts[r],    output sum(counts), blocks packed in rank order
//   broadcast       output c (the one buffer; root's output holds the data on entry), no input
//   alltoall        input p*c,          output p*c
//   alltoallv       input sum(counts) (send_counts), output sum(recv_counts), packed in rank order
//   gather          input c,            output p*c on root only
//   scatter         input p*c on root only, output c
//   barrier         no buffers (messages of zero elements)
//
// In place. The executor runs a schedule with input and output aliased in exactly these ways,
// so generators must stay correct under them:
//   allreduce, reduce(root): input == output.
//   reduce_scatter: output == input + r*c.   allgather/allgatherv/gather(root): input == output
//   slot of rank r.   scatter(root): output == input slot of root.   alltoall(v): never (the
//   executor snapshots the input first).
// A generator therefore reads an input element only before (in dependency order) it writes the
// aliased output element, and never relies on output contents it did not write, except the
// own slot / own block that in-place leaves in place (copy steps with src == dst are no-ops).
//
// Steps:
//   send(peer, region)                      region's data goes to peer
//   recv(peer, region)                      data from peer lands in region
//   recv_reduce(peer, region, operand)      region = operand ⊕ data from peer (operand may == region)
//   copy(region <- operand)                 local copy (elided when the addresses are equal)
// Matching: the k-th send from rank a to rank b (in list order) is received by the k-th
// recv/recv_reduce from a in b's list; their counts are equal. A step starts when every step
// in `deps` has completed (a send completes when its region may be reused). Two steps that
// touch overlapping regions, one of them writing, must be ordered by deps.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "tutti/types.hpp"

namespace tutti::schedule {

// The collectives are tutti::Collective (<tutti/types.hpp>), named by tutti::to_string.

enum class Buffer : std::uint8_t { input, output, scratch };

struct Region {
  Buffer buffer = Buffer::output;
  std::size_t offset = 0;  // elements
  std::size_t count = 0;   // elements
};

enum class StepKind : std::uint8_t { send, recv, recv_reduce, copy };

struct Step {
  StepKind kind = StepKind::copy;
  int peer = -1;                    // send, recv, recv_reduce
  Region region;                    // send: source; recv/recv_reduce/copy: destination
  Region operand;                   // recv_reduce: local operand; copy: source
  std::vector<std::uint32_t> deps;  // indices of earlier steps of the same schedule
};

struct Schedule {
  std::vector<Step> steps;
  std::size_t scratch_count = 0;  // elements

  // Builders; each returns the new step's index.
  std::uint32_t send(int peer, Region region, std::vector<std::uint32_t> deps = {});
  std::uint32_t recv(int peer, Region region, std::vector<std::uint32_t> deps = {});
  std::uint32_t recv_reduce(int peer, Region region, Region operand, std::vector<std::uint32_t> deps = {});
  std::uint32_t copy(Region dst, Region src, std::vector<std::uint32_t> deps = {});
};

struct Params {
  Collective collective = Collective::allreduce;
  int rank = 0;
  int size = 1;
  std::size_t count = 0;                       // see the layout above; unused by the v-collectives and barrier
  std::size_t elem_size = 4;                   // bytes per element (chunking decisions only)
  int root = 0;                                // reduce, broadcast, gather, scatter
  std::span<const std::size_t> counts{};       // allgatherv: recv_counts; alltoallv: send_counts
  std::span<const std::size_t> recv_counts{};  // alltoallv only
  std::size_t chunk_bytes = 1 << 18;           // pipelining granularity of ring and chain algorithms
  // Ranks lie in blocks of this many on hosts (ranks [h·L, (h+1)·L) on host h); 0: not known, or
  // one host. Where it is at least 2 and below size, reduce_scatter's Rabenseifner pairs the
  // nearest ranks first and the recursive-doubling allgather the farthest first, so that the
  // hosts' links carry the least (reduce_scatter_rabenseifner.cpp, allgather_recursive_doubling.cpp).
  // The same on every rank.
  int ranks_per_host = 0;

  /// Whether the ranks lie in blocks of several on two or more hosts (ranks_per_host above).
  bool in_host_blocks() const { return ranks_per_host >= 2 && ranks_per_host < size; }

  /// The parameters of `call` on rank `rank` of `size`: any call description with NativeCall's
  /// fields (collective, count, type, root, counts, recv_counts), which this layer does not see.
  template <class Call>
  static Params of(const Call& call, int rank, int size) {
    Params params;
    params.collective = call.collective;
    params.rank = rank;
    params.size = size;
    params.count = call.count;
    params.elem_size = size_of(call.type);
    params.root = call.root;
    params.counts = call.counts;
    params.recv_counts = call.recv_counts;
    return params;
  }
};

/// Whether `algorithm` serves `collective` (automatic, direct, hierarchical and mpi: false here).
bool applies(Algorithm algorithm, Collective collective);

/// Whether `algorithm` runs `collective` as a pipelined chain (ring broadcast and reduce).
bool pipelined_chain(Algorithm algorithm, Collective collective);

/// Fits `params.chunk_bytes` to a link of α seconds per message and β per byte where `algorithm` is
/// a pipelined chain (ring broadcast and reduce, (p−2+k)(α + nβ/k) for k chunks): k near
/// sqrt((p−2)nβ/α), as chunks of 16 KiB up to the default 256 KiB (so it only ever cuts finer).
/// Other algorithms keep their chunks. Every rank must pass the same costs (the cost model's).
void fit_chunks(Params& params, Algorithm algorithm, double alpha, double beta);

/// The algorithms that serve `collective`, in a stable order.
std::vector<Algorithm> algorithms_for(Collective collective);

/// This rank's schedule. Throws Error(unsupported) if the algorithm does not serve the collective.
Schedule make(Algorithm algorithm, const Params& params);

/// Whether, where ranks run this call and the others anything else, some rank of this call always
/// sends a message to one of the others before it waits for anything from them: for every way of
/// dividing the ranks, the ranks on one side, receiving only from each other, still send across.
/// Where messages carry their sender's signature and are checked on arrival, a call for which this
/// holds needs no signature ring: ranks that disagree exchange a message that shows it. True for
/// calls that open with a ring (the ring algorithms with no empty block, a pairwise alltoall,
/// Bruck's allgather and dissemination barrier: round 0 is a ring) and for the pairwise rounds of
/// recursive doubling and of Rabenseifner's halving over a power of two, no piece empty (the first
/// round whose partners lie across the division is reached by every rank on this side, its
/// partners in earlier rounds being on the same side). A function of the call alone, not of the
/// rank, so that all ranks of a call decide alike; schedule_test checks it against the generators
/// for every division of up to 9 ranks and 16.
bool messages_cross_every_cut(Algorithm algorithm, Collective collective, std::size_t count, int size);

/// Counts on the critical path of a whole call (all ranks' schedules together), under the
/// α-β-γ model: time = α·rounds + β·bytes + γ·elements.
struct Cost {
  double rounds = 0;    // messages on the critical path
  double bytes = 0;     // bytes transferred on the critical path
  double elements = 0;  // elements reduced on the critical path
  double time = 0;      // α·rounds + β·bytes + γ·elements along that path
  // The busiest rank's port: max over ranks of its sends' Σ(α + β·bytes), and of its receives'
  // Σ(α + β·bytes + γ·reduced). A stream of such calls goes no faster than one per this.
  double busiest = 0;
  // Of `rounds`, the messages between ranks on different hosts (Hosts; of paths that take as
  // long, the one with the most of them).
  double rounds_across = 0;
  // The most messages between hosts that one rank's port sends, or receives, in a call (Hosts).
  double busiest_across = 0;
};

/// Critical path through all ranks' schedules (schedules[r] is rank r's), where a message costs
/// α + β·bytes from the start of its send to the end of its receive, a recv_reduce adds
/// γ·count, and a copy costs β·bytes. Each rank sends one message at a time and receives one at
/// a time (the wire time β·bytes is exclusive, the latency α is not), so a pipelined schedule's
/// chunks share their link's bandwidth. Also the busiest port (Cost::busiest). Throws
/// Error(invalid_argument) on mismatched messages or a deadlock.
Cost estimate(std::span<const Schedule> schedules, std::size_t elem_size, double alpha, double beta, double gamma);

/// Ranks on hosts, for the estimate of a call that crosses a network: ranks
/// [h·ranks_per_host, (h+1)·ranks_per_host) share host h. A message between ranks of different
/// hosts costs `alpha` + `beta`·bytes (instead of the call's α and β) and also needs its hosts'
/// links, each with one outgoing and one incoming port carrying one message at a time: the
/// ranks of a host share its link's bandwidth.
struct Hosts {
  int ranks_per_host = 0;  // 0: one host (the plain estimate)
  double alpha = 0;        // s per message across hosts
  double beta = 0;         // s per byte across hosts
};

/// estimate() with the messages between hosts priced and contended as `hosts` says.
Cost estimate(std::span<const Schedule> schedules, std::size_t elem_size, double alpha, double beta, double gamma,
              const Hosts& hosts);

/// Convenience: generate every rank's schedule for `params` (params.rank is ignored) and estimate,
/// with the messages between hosts as `hosts` says.
Cost estimate(Algorithm algorithm, Params params, double alpha, double beta, double gamma, const Hosts& hosts = {});

}  // namespace tutti::schedule
