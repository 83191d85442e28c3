// The α-β-γ cost model behind Algorithm::automatic: predicted seconds of an algorithm for a call,
// from the schedules' critical path (schedule::estimate) or, for a transport's native algorithms
// (shared memory's `direct`), as the transport prices them (transport/cost.hpp).
#pragma once

#include <cstddef>
#include <optional>
#include <vector>

#include "schedule/schedule.hpp"
#include "transport/cost.hpp"
#include "tutti/types.hpp"

namespace tutti::comm::choice {

/// One transport's costs (α, β, γ); transport::default_cost(kind) gives the compiled-in ones.
using CostParams = transport::CostParams;

/// Whether a call's `bytes`, as choose_algorithm and predict take it, is the total over ranks
/// (allgather(v), reduce_scatter, alltoall, gather, scatter) rather than one rank's buffer.
bool bytes_are_total(Collective collective);

/// The algorithms `automatic` may choose for `collective` on a transport of `kind`: its schedule
/// algorithms, plus the transport's native candidates (shm: `direct` for allreduce,
/// reduce_scatter, allgather and broadcast) when `direct_available`. Never mpi or hierarchical.
std::vector<Algorithm> candidates(transport::Kind kind, Collective collective, bool direct_available);

/// Where a communicator's ranks span hosts in blocks (ranks [h·ranks_per_host, (h+1)·ranks_per_host)
/// on host h, at least 2 hosts of at least 2 ranks): a message within a host costs `local`'s β per
/// byte and the larger of the two α (a message of a job that spans hosts waits on the same
/// progress and wake-ups: measured on the emulated cluster, with shared memory's α within a host
/// a 6-round ring looked cheaper than 2 rounds of recursive doubling where it ran 1.3-2× slower),
/// one across hosts the call's cost, and the ranks of a host share its link (schedule::Hosts).
/// ranks_per_host 0: every message costs the call's cost alike.
struct HostBlocks {
  int ranks_per_host = 0;
  CostParams local{};
  transport::Kind local_kind = transport::Kind::shm;  // what carries a host's part (hierarchical's steps)
  bool spans() const { return ranks_per_host >= 2; }
};

/// What carries the messages within a host for a transport of `kind` whose ranks span hosts:
/// shared memory under the routed transport, TCP (over the loopback) under tcp; none for the
/// others, whose choices do not price hosts (HostBlocks).
std::optional<transport::Kind> within_host(transport::Kind kind);

/// Predicted seconds of `algorithm` for a call of `bytes` on `ranks` ranks (`bytes` as
/// choose_algorithm takes it: the total over ranks for allgather(v), reduce_scatter, alltoall,
/// gather and scatter; the per-rank buffer otherwise), in f32 elements. A native algorithm
/// (`direct`) is priced by the transport that runs it.
/// Throws Error(unsupported) if the algorithm does not serve the collective, Error(invalid_argument)
/// for ranks < 1.
/// With `hosts` spanning, messages are priced as HostBlocks says, and an allreduce's `hierarchical`
/// is the sum of its three steps: reduce_scatter within a host (`local`, its cheapest candidate on
/// local_kind, `direct` included on shared memory), allreduce of 1/ranks_per_host of the buffer
/// across hosts (the host's ranks run theirs at once and share its link: β·ranks_per_host), allgather
/// within the host.
double predict(Algorithm algorithm, Collective collective, int ranks, std::size_t bytes, const CostParams& cost,
               const HostBlocks& hosts = {});

/// The candidate with the least predicted time (the earlier candidate on a tie); but among the
/// candidates within 5% of that time, one whose busiest port is busy at most 3/4 as long per call
/// (schedule::Cost::busiest), which a stream of calls favours. Algorithm::automatic when the
/// collective has no candidate.
/// With `hosts` spanning, an allreduce also weighs `hierarchical` (predict), which wins where it is
/// faster than every flat candidate priced as HostBlocks says; else the flat choice is the plain
/// model's (every message at `cost`), unless the candidate priced fastest as HostBlocks says is
/// predicted at least 1.3 times as fast as it, so priced (Rabenseifner's reduce_scatter, whose
/// halving pairs the nearest ranks first on such layouts, against ring on a slow link).
Algorithm cheapest(transport::Kind kind, Collective collective, int ranks, std::size_t bytes, bool direct_available,
                   const CostParams& cost, const HostBlocks& hosts = {});

}  // namespace tutti::comm::choice
