// Running and timing one case: Tutti's collective and the peers' (MPI, Gloo), on the same ranks
// and buffers. Every rank calls the same functions in the same order.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "bench/cases.hpp"
#include "tutti/tutti.hpp"

namespace tutti::bench {

/// A library timed beside Tutti.
class Peer {
 public:
  virtual ~Peer() = default;
  virtual std::string name() const = 0;
  /// Whether the peer has this collective for this type and op (only the case's primary form is timed).
  virtual bool supports(const Case& c) const = 0;
  virtual void run(const Case& c, Buffers& buffers) = 0;
};

/// The MPI peer (OpenMPI's own collectives on MPI_COMM_WORLD), or null with `why` set when this
/// process was not launched by mpirun or Tutti was built without MPI.
std::unique_ptr<Peer> make_mpi_peer(std::string& why);
/// The Gloo peer (TCP on loopback), or null with `why` set. Collective over `world`.
std::unique_ptr<Peer> make_gloo_peer(Communicator& world, std::string& why);

/// Runs Tutti's collective for the case once, with `algorithm` (automatic or forced).
void run_tutti(Communicator& world, const Case& c, Buffers& buffers, Algorithm algorithm);

/// Seconds per iteration: the maximum over ranks of the mean over `iterations` timed calls of
/// `op`, after `warmup` untimed ones. Every rank gets the same value.
double time_op(Communicator& world, const std::function<void()>& op, int warmup, int iterations);

/// time_op's mean and the median call: each call timed on its own, each rank's median, the
/// maximum over ranks (`median`). Every rank gets the same values.
struct CallTimes {
  double mean = 0, median = 0;
};
CallTimes time_calls(Communicator& world, const std::function<void()>& op, int warmup, int iterations);

/// Times `ops` alternately: `warmup` rounds of every op, then rounds in which each op still short
/// of its `iterations` runs once, from a barrier, each round in another order (shuffled, the same
/// on every rank). Returns each op's mean time per call (the maximum over ranks of each rank's
/// mean). So no op is measured always right after the same other one, in the state (a link's
/// token bucket, the caches) that op leaves behind.
std::vector<double> time_alternating(Communicator& world, const std::vector<std::function<void()>>& ops, int warmup,
                                     const std::vector<int>& iterations);

/// Iterations for a measurement: `fixed` when given, else enough for ~50 ms (at least 5, at
/// most 100 000) judged from a few calls; the same on every rank.
int choose_iterations(Communicator& world, const std::function<void()>& op, std::optional<int> fixed);

/// Runs the case once on fresh inputs and returns the wrong elements summed over all ranks.
/// `corrupt`: rank 0 damages its result first (to test the check).
std::size_t check_op(Communicator& world, Buffers& buffers, const std::function<void()>& op, bool corrupt = false);

/// The maximum over ranks of `value` (every rank gets it).
double max_over_ranks(Communicator& world, double value);

}  // namespace tutti::bench
