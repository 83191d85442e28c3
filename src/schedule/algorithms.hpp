// The schedule generators, one per file (the file is named after the function; a scatter is the
// mirror image of its gather and lives in the gather's file).
// Each returns Params::rank's schedule; see schedule.hpp for buffers, steps and in-place rules.
#pragma once

#include <functional>
#include <initializer_list>
#include <string>
#include <utility>

#include "schedule/schedule.hpp"

namespace tutti::schedule {

// allreduce
Schedule allreduce_ring(const Params& params);                // reduce_scatter + allgather on a ring, chunked
Schedule allreduce_recursive_doubling(const Params& params);  // log p full-size exchanges
Schedule allreduce_rabenseifner(const Params& params);        // recursive halving + recursive doubling
Schedule allreduce_binomial_tree(const Params& params);       // binomial reduce to 0, binomial broadcast

// reduce_scatter
Schedule reduce_scatter_ring(const Params& params);
Schedule reduce_scatter_rabenseifner(const Params& params);  // recursive halving

// allgather and allgatherv (Params::counts set for allgatherv)
Schedule allgather_ring(const Params& params);
Schedule allgather_recursive_doubling(const Params& params);
Schedule allgather_bruck(const Params& params);

// broadcast and reduce (Algorithm::ring = pipelined chain)
Schedule broadcast_binomial_tree(const Params& params);
Schedule broadcast_ring(const Params& params);
Schedule reduce_binomial_tree(const Params& params);
Schedule reduce_ring(const Params& params);

// alltoall (pairwise also serves alltoallv), gather, scatter, barrier
Schedule alltoall_pairwise(const Params& params);
Schedule alltoall_bruck(const Params& params);
Schedule gather_linear(const Params& params);
Schedule gather_binomial_tree(const Params& params);
Schedule scatter_linear(const Params& params);
Schedule scatter_binomial_tree(const Params& params);
Schedule barrier_dissemination(const Params& params);  // Algorithm::bruck (dissemination is Bruck's pattern)
Schedule barrier_recursive_doubling(const Params& params);

// ---- helpers shared by the generators (schedule.cpp) ----

/// Offset of block i when `count` elements are split into `parts` near-equal blocks
/// (the first count % parts blocks get one more element). block_offset(count, parts, parts) == count.
std::size_t block_offset(std::size_t count, std::size_t parts, std::size_t i);
inline std::size_t block_count(std::size_t count, std::size_t parts, std::size_t i) {
  return block_offset(count, parts, i + 1) - block_offset(count, parts, i);
}

/// Appends `tail` to `head`: tail's deps are shifted, every step of tail additionally depends on
/// `after` (indices in head), and tail's scratch regions are moved past head's scratch.
/// Returns the index offset of tail's first step in head.
std::uint32_t append(Schedule& head, const Schedule& tail, const std::vector<std::uint32_t>& after);

/// Steps of `schedule` that no later step depends on (the "last" steps, for sequencing).
std::vector<std::uint32_t> sinks(const Schedule& schedule);

/// The same exchange in the opposite direction: the steps in reverse order, sends and receives
/// swapped, each copy's source and destination swapped, input and output swapped (scratch stays),
/// and every dependency turned around. A valid schedule's mirror is valid (the k-th message
/// between two ranks becomes the k-th from the end on both sides); a gather's is the scatter
/// with the same root and count. Throws Error(invalid_argument) for a recv_reduce, which has none.
Schedule mirror(const Schedule& schedule);

/// Number of chunks to pipeline `count` elements in, given Params::chunk_bytes (≥ 1).
std::size_t chunks_for(const Params& params, std::size_t count);

/// Marks a step that was not emitted (e.g. an empty chunk); deps_of drops it.
inline constexpr std::uint32_t no_step = ~std::uint32_t{0};

/// The given step indices without `no_step` entries: deps on steps that may have been skipped.
std::vector<std::uint32_t> deps_of(std::initializer_list<std::uint32_t> steps);

/// A send (a receive) of `region`, or no step (`no_step`) when the region is empty.
inline std::uint32_t send_if(Schedule& s, int peer, Region region, std::vector<std::uint32_t> deps = {}) {
  return region.count == 0 ? no_step : s.send(peer, region, std::move(deps));
}
inline std::uint32_t recv_if(Schedule& s, int peer, Region region, std::vector<std::uint32_t> deps = {}) {
  return region.count == 0 ? no_step : s.recv(peer, region, std::move(deps));
}

/// allgather/allgatherv/gather layout: offsets of the p blocks in the packed output, p+1 entries
/// (block b is [offsets[b], offsets[b+1])); per-rank Params::counts when set, else count each.
std::vector<std::size_t> block_offsets(const Params& params);

// ---- helpers for consumers of whole calls: the checker and the cost model (schedule.cpp) ----

/// One step of one rank's schedule.
struct StepRef {
  int rank = -1;
  std::uint32_t step = 0;
};

/// Pairs every send with its receive (the k-th send from a to b with the k-th recv/recv_reduce
/// from a in b's list) into partner[rank][step] (rank -1 for copies), after checking that deps
/// point backwards and peers are valid ranks other than self. Returns "" or the first defect.
std::string match_messages(std::span<const Schedule> schedules, std::vector<std::vector<StepRef>>& partner);

/// Runs all ranks' schedules together in an order an executor could: `run` is called once per
/// step, for a send or copy once its deps are complete, for a receive once its deps are complete
/// and its send has run. A send completes when its receive has run; other steps when they run.
/// Stops early when `run` returns false. Returns the steps that never ran (empty: no deadlock).
std::vector<StepRef> replay(std::span<const Schedule> schedules, const std::vector<std::vector<StepRef>>& partner,
                            const std::function<bool(StepRef)>& run);

}  // namespace tutti::schedule
