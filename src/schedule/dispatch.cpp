// Which algorithm serves which collective, and the one switch from (algorithm, collective) to
// a generator. The table is the single source of truth: applies() and algorithms_for() read it.
#include <array>
#include <string>

#include "core/names.hpp"
#include "schedule/algorithms.hpp"

namespace tutti::schedule {

namespace {

using Generator = Schedule (*)(const Params&);

struct Entry {
  Collective collective;
  Algorithm algorithm;
  Generator generator;
};

// In each collective's preferred order when nothing else decides.
constexpr std::array<Entry, 25> kTable{{
    {Collective::allreduce, Algorithm::ring, allreduce_ring},
    {Collective::allreduce, Algorithm::recursive_doubling, allreduce_recursive_doubling},
    {Collective::allreduce, Algorithm::rabenseifner, allreduce_rabenseifner},
    {Collective::allreduce, Algorithm::binomial_tree, allreduce_binomial_tree},
    {Collective::reduce_scatter, Algorithm::ring, reduce_scatter_ring},
    {Collective::reduce_scatter, Algorithm::rabenseifner, reduce_scatter_rabenseifner},
    {Collective::allgather, Algorithm::ring, allgather_ring},
    {Collective::allgather, Algorithm::recursive_doubling, allgather_recursive_doubling},
    {Collective::allgather, Algorithm::bruck, allgather_bruck},
    {Collective::allgatherv, Algorithm::ring, allgather_ring},
    {Collective::allgatherv, Algorithm::recursive_doubling, allgather_recursive_doubling},
    {Collective::allgatherv, Algorithm::bruck, allgather_bruck},
    {Collective::broadcast, Algorithm::binomial_tree, broadcast_binomial_tree},
    {Collective::broadcast, Algorithm::ring, broadcast_ring},
    {Collective::reduce, Algorithm::binomial_tree, reduce_binomial_tree},
    {Collective::reduce, Algorithm::ring, reduce_ring},
    {Collective::alltoall, Algorithm::pairwise, alltoall_pairwise},
    {Collective::alltoall, Algorithm::bruck, alltoall_bruck},
    {Collective::alltoallv, Algorithm::pairwise, alltoall_pairwise},
    {Collective::gather, Algorithm::linear, gather_linear},
    {Collective::gather, Algorithm::binomial_tree, gather_binomial_tree},
    {Collective::scatter, Algorithm::linear, scatter_linear},
    {Collective::scatter, Algorithm::binomial_tree, scatter_binomial_tree},
    {Collective::barrier, Algorithm::bruck, barrier_dissemination},
    {Collective::barrier, Algorithm::recursive_doubling, barrier_recursive_doubling},
}};

const Entry* find(Algorithm algorithm, Collective collective) {
  for (const Entry& e : kTable)
    if (e.algorithm == algorithm && e.collective == collective) return &e;
  return nullptr;
}

// Generators assume sane parameters; a bad one here is the caller's bug, named precisely.
void validate(Algorithm algorithm, const Params& params) {
  const std::string what = "schedule: " + std::string(to_string(params.collective)) + " with algorithm '" +
                           std::string(tutti::to_string(algorithm)) + "': ";
  const auto size = static_cast<std::size_t>(params.size);
  if (params.size < 1 || params.rank < 0 || params.rank >= params.size)
    throw Error(ErrorCode::invalid_argument,
                what + "rank " + std::to_string(params.rank) + " outside size " + std::to_string(params.size));
  if (core::has_root(params.collective) && (params.root < 0 || params.root >= params.size))
    throw Error(ErrorCode::invalid_argument,
                what + "root " + std::to_string(params.root) + " outside size " + std::to_string(params.size));
  if (params.collective == Collective::allgatherv && params.counts.size() != size)
    throw Error(ErrorCode::invalid_argument,
                what + "counts has " + std::to_string(params.counts.size()) + " entries, expected one per rank");
  if (params.collective == Collective::alltoallv && (params.counts.size() != size || params.recv_counts.size() != size))
    throw Error(ErrorCode::invalid_argument, what + "counts and recv_counts need one entry per rank");
}

}  // namespace

bool applies(Algorithm algorithm, Collective collective) { return find(algorithm, collective) != nullptr; }

std::vector<Algorithm> algorithms_for(Collective collective) {
  std::vector<Algorithm> out;
  for (const Entry& e : kTable)
    if (e.collective == collective) out.push_back(e.algorithm);
  return out;
}

Schedule make(Algorithm algorithm, const Params& params) {
  const Entry* entry = find(algorithm, params.collective);
  if (entry == nullptr)
    throw Error(ErrorCode::unsupported, "schedule: algorithm '" + std::string(tutti::to_string(algorithm)) +
                                            "' does not serve " + std::string(to_string(params.collective)));
  validate(algorithm, params);
  return entry->generator(params);
}

bool messages_cross_every_cut(Algorithm algorithm, Collective collective, std::size_t count, int size) {
  if (size < 2) return false;
  const bool power_of_two = (size & (size - 1)) == 0;
  switch (collective) {
    case Collective::allreduce:  // the ring's reduce-scatter sends block r - k: none may be empty
      return (algorithm == Algorithm::ring && count >= static_cast<std::size_t>(size)) ||
             (algorithm == Algorithm::recursive_doubling && power_of_two && count > 0) ||
             (algorithm == Algorithm::rabenseifner && power_of_two && count >= static_cast<std::size_t>(size));
    case Collective::reduce_scatter:  // count: each rank's block, so none is empty
      return (algorithm == Algorithm::ring || (algorithm == Algorithm::rabenseifner && power_of_two)) && count > 0;
    case Collective::allgather:  // round 0 of Bruck's: the own block to rank - 1, with nothing before
      return count > 0 && (algorithm == Algorithm::ring || algorithm == Algorithm::bruck ||
                           (algorithm == Algorithm::recursive_doubling && power_of_two));
    case Collective::alltoall:  // step 1 of p - 1: block r + 1 out, block r - 1 in (count: each block's)
      return algorithm == Algorithm::pairwise && count > 0;
    case Collective::barrier:  // round 0 signals rank + 1 (or rank ^ 1) with nothing before (no data, yet a message)
      return algorithm == Algorithm::bruck || (algorithm == Algorithm::recursive_doubling && power_of_two);
    default:
      return false;
  }
}

}  // namespace tutti::schedule
