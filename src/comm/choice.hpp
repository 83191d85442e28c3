// The algorithm choice: TUTTI_ALGO forces an algorithm per collective (as NCCL_ALGO does); else
// the tuning table's entry (tuning.hpp); else the cost model's cheapest candidate (cost_model.hpp).
// All of it lives in namespace choice; CommImpl asks `choose_algorithm` (and memoizes the answer).
#pragma once

#include <cstddef>
#include <map>
#include <string_view>

#include "transport/cost.hpp"
#include "transport/kind.hpp"
#include "tutti/types.hpp"

namespace tutti::comm::choice {

/// Parses TUTTI_ALGO's syntax, "allreduce:ring,allgather:bruck" (a later item for the same
/// collective wins). Throws Error(invalid_argument) naming TUTTI_ALGO and the item that is wrong.
std::map<Collective, Algorithm> parse_forced_algorithms(std::string_view text);

/// The algorithm asked for: `requested`, or for `automatic` what TUTTI_ALGO forces (else automatic).
Algorithm requested_algorithm(Collective collective, Algorithm requested);

/// What the algorithm choice may depend on besides the collective and its size: the same on
/// every rank of a communicator, so that every rank chooses alike.
struct ChoiceContext {
  transport::Kind kind = transport::Kind::tcp;  // Transport::kind(): what decides
  std::string_view transport;     // Transport::name(): "inproc", "shm", "tcp", "mpi", "shm+tcp" (logs, tuning files)
  int ranks = 1;                  // communicator size
  bool direct_available = false;  // the shared-memory direct algorithms can serve this call
  const transport::CostParams* link = nullptr;  // the communicator's measured link (interned), else cost_for's
  // The ranks span hosts in blocks of this many (init() learned the topology: ranks
  // [h·ranks_per_host, (h+1)·ranks_per_host) on host h, 2 or more hosts); 0: not so, or unknown.
  int ranks_per_host = 0;
};

/// The algorithm `automatic` resolves to (TUTTI_ALGO first, then the tuning table, then the cost
/// model); a forced one is checked. `bytes` is the call's size as tutti-bench reports it (the
/// total over ranks for allgather, reduce_scatter and alltoall). Throws Error(unsupported) for an
/// algorithm that does not serve the collective.
Algorithm choose_algorithm(Collective collective, Algorithm requested, const ChoiceContext& context, std::size_t bytes);

/// The algorithm for one step of a composite algorithm (hierarchical) on the communicator
/// `context` describes: what TUTTI_ALGO forces for the step's collective when that is a schedule
/// serving it, else the tuning table's or the cost model's choice for that communicator's
/// transport (so a step inside one host may run shared memory's `direct`).
Algorithm step_algorithm(Collective collective, const ChoiceContext& context, std::size_t bytes);

}  // namespace tutti::comm::choice
