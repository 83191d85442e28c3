// The α-β-γ cost model behind Algorithm::automatic: predicted seconds of an algorithm for a call,
// from the schedules' critical path (schedule::estimate) or, for the shared-memory `direct`
// algorithms that have no schedule, from a formula of their copies and barriers.
#pragma once

#include <cstddef>
#include <string_view>
#include <vector>

#include "schedule/schedule.hpp"
#include "tutti/types.hpp"

namespace tutti::detail::choice {

/// One transport's costs: α per message (or barrier), β per byte on the wire, γ per reduced element.
struct CostParams {
  double alpha = 0;  // s
  double beta = 0;   // s/byte
  double gamma = 0;  // s/element
};

/// The compiled-in costs of "inproc", "shm", "tcp" and "mpi"; any other name gets the tcp ones
/// (the slowest assumption: a transport we know nothing about may cross a network).
CostParams default_cost(std::string_view transport);

/// Whether a call's `bytes`, as choose_algorithm and predict take it, is the total over ranks
/// (allgather(v), reduce_scatter, alltoall, gather, scatter) rather than one rank's buffer.
bool bytes_are_total(Collective collective);

/// The algorithms `automatic` may choose for `collective`: its schedule algorithms, plus `direct`
/// for allreduce, reduce_scatter, allgather and broadcast when `direct_available`. Never mpi or
/// hierarchical.
std::vector<Algorithm> candidates(Collective collective, bool direct_available);

/// Predicted seconds of `algorithm` for a call of `bytes` on `ranks` ranks (`bytes` as
/// choose_algorithm takes it: the total over ranks for allgather(v), reduce_scatter, alltoall,
/// gather and scatter; the per-rank buffer otherwise), in f32 elements. `direct` included.
/// Throws Error(unsupported) if the algorithm does not serve the collective, Error(invalid_argument)
/// for ranks < 1.
double predict(Algorithm algorithm, Collective collective, int ranks, std::size_t bytes, const CostParams& cost);

/// The candidate with the least predicted time (the earlier candidate on a tie), or nullopt-like
/// Algorithm::automatic when the collective has no candidate.
Algorithm cheapest(Collective collective, int ranks, std::size_t bytes, bool direct_available, const CostParams& cost);

}  // namespace tutti::detail::choice
