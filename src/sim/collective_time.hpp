// How long one collective call takes at scale, from Tutti's own schedules on a two-level network.
//
// Algorithm choice follows the library's rules: where the ranks lie in blocks of several on two
// or more hosts (as the simulated job always places them), allreduce runs `hierarchical` where its
// three steps, each the cheapest here, plus two of the link's α a step, take less time than the
// fastest flat candidate (the library's cost model weighs it so); on other layouts where some
// host has several ranks, from comm's own prefers_hierarchical size. Otherwise, and for each
// step of hierarchical, the candidate (choice::candidates) with the least time here.
//
// Each schedule algorithm is timed by the critical path of every rank's schedule
// (schedule::estimate with schedule::Hosts) while that is at most kExactSteps steps in all;
// beyond, by the lockstep approximation: the ranks of one host run their schedules' k-th send and
// k-th receive together, in rounds; a round lasts as long as its messages take on average (a
// ring's data passes every link in turn) but no less than the busiest port is occupied, a message
// across hosts sharing its host's link with the other ranks of the host that cross in the same
// round; where two rounds in a row cross, the latency of the first hides behind its queue on the
// link (up to the wire time behind its first message). Rings and recursive doubling/halving are
// symmetric, so every host behaves as host 0 (an algorithm whose ranks do not send and receive
// alike, such as a tree, is always simulated exactly). `direct` (shared memory) is timed by the
// cost model.
#pragma once

#include <cstddef>
#include <map>
#include <string>
#include <utility>

#include "comm/topology.hpp"
#include "tutti/sim.hpp"
#include "tutti/types.hpp"

namespace tutti::sim {

/// Every rank's schedule is simulated while the schedules hold at most this many steps in all.
inline constexpr std::size_t kExactSteps = 100'000;

/// A network level's prices.
struct Levels {
  int ranks_per_host = 1;      ///< consecutive ranks share a host
  double alpha = 0, beta = 0;  ///< across hosts
  double intra_alpha = 0, intra_beta = 0;
  double gamma = 0;
};

/// Seconds of one call of `algorithm` (a schedule algorithm) on `ranks` ranks with Params::count
/// `count` of `elem_size` bytes each; `lockstep` forces the approximation (for tests). Calls of
/// more than 16 MiB are extrapolated linearly from 8 and 16 MiB, as the library's cost model does.
double schedule_seconds(Algorithm algorithm, Collective collective, int ranks, std::size_t count, std::size_t elem_size,
                        const Levels& levels, bool lockstep = false);

class CollectiveTimes {
 public:
  struct Timed {
    double seconds = 0;
    std::string how;  ///< e.g. "ring" or "hierarchical (direct, ring x4 links, direct)"
  };
  CollectiveTimes(const Network& network, int ranks, int ranks_per_host);

  /// The engine's allreduce of `count` elements of `type` over all ranks.
  const Timed& allreduce(std::size_t count, DataType type);
  /// An allgather of `bytes` u8 per rank over all ranks (the engine's full exchange).
  const Timed& allgather(std::size_t bytes);
  /// The engine's negotiation round: an allreduce (sum) of `counts` u32 (engine::Tally), priced
  /// at the next power of two of at least kNegotiationCounts counts (at most a few hundred bytes
  /// more), so that a response cache filling up slot by slot costs few simulations.
  const Timed& negotiation(std::size_t counts);
  static constexpr std::size_t kNegotiationCounts = 64;

 private:
  // The cheapest candidate for `collective` on a communicator of `ranks` ranks, `per_host` of them
  // per host, whose links are shared by `sharing` such communicators at once; direct may serve
  // when the communicator is inside one host.
  Timed cheapest(Collective collective, int ranks, int per_host, std::size_t count, std::size_t elem,
                 int sharing) const;

  Network network_;
  int ranks_, per_host_;
  comm::Topology topology_;  // its block layout, or what prefers_hierarchical asks about, built once
  std::map<std::pair<std::size_t, DataType>, Timed> allreduce_;
  std::map<std::size_t, Timed> allgather_;
};

}  // namespace tutti::sim
