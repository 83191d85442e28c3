// The active tuning table (<tutti/tuning.hpp>: the table, its file format) and the automatic
// choices cached from it.
//
// Every rank of a communicator must choose alike, so the choice reads only the call, the active
// table and the cost parameters; ranks of one job must therefore see the same file.
#pragma once

#include <cstddef>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "comm/cost_model.hpp"
#include "schedule/schedule.hpp"
#include "tutti/tuning.hpp"
#include "tutti/types.hpp"

namespace tutti::comm::choice {

using tuning::BackendEntry;
using tuning::default_path;
using tuning::Entry;
using tuning::Table;

/// Makes the table TUTTI_TUNING_FILE names (else the default path's, when that file exists) the
/// active one; does so once per process, and not after set_active. Called by tutti::init() and at
/// the first automatic choice. Throws Error(invalid_argument) naming the file if TUTTI_TUNING_FILE
/// names a missing, unreadable or malformed file (and again at the next call); a malformed default
/// file is logged as a warning and ignored.
void load_from_environment();

/// Replaces the active table (an empty one: the cost model's defaults only) and forgets every
/// cached choice. For tests and `tutti-bench --tune`.
void set_active(Table table);

/// The active table. Thread-safe; the reference stays valid for the life of the process (tables
/// set_active replaces are kept, as choices in flight may still read them).
const Table& active();

/// Changes whenever the active table does (set_active, reset_for_testing, the first load): callers
/// that memoize choices compare it.
const void* active_version();

/// The active table's cost_model entry for `transport` (a Transport::name()), else `link` (a
/// communicator's measured link), else the compiled-in costs of its kind (transport::default_cost).
CostParams cost_for(std::string_view transport, transport::Kind kind, const CostParams* link = nullptr);

/// Where an automatic choice came from.
struct Choice {
  Algorithm algorithm = Algorithm::automatic;  // automatic: no candidate serves the collective
  bool from_table = false;                     // else from the cost model
  std::string_view origin;                     // from_table: the table's file (valid for the process)
  CostParams cost;                             // !from_table: the parameters it used
};

/// What `automatic` resolves to when TUTTI_ALGO is silent: the first active-table entry that
/// matches and can serve the call on a transport of `kind` named `transport` (`direct` only when
/// `direct_available`; never mpi or
/// hierarchical), else the cost model's cheapest candidate for the size class of `bytes` (the
/// powers of two: a class [2^k, 2^(k+1)) is decided at 2^k, whatever size came first), priced by
/// cost_for(transport, kind, link): `link` is the communicator's measured link (probe_link; interned).
/// `ranks_per_host` (ChoiceContext): the ranks span hosts in blocks of that many; the model then
/// prices messages within a host at the host transport's costs (shared memory's for shm+tcp, cost_for
/// of it), the others on the hosts' shared links (cost_model.hpp, HostBlocks), and an allreduce
/// may resolve to `hierarchical`.
/// Cached per (collective, kind, transport, ranks, direct_available, link, ranks_per_host, class);
/// thread-safe; below a microsecond once cached.
Choice automatic_choice(Collective collective, transport::Kind kind, std::string_view transport, int ranks,
                        bool direct_available, std::size_t bytes, const CostParams* link = nullptr,
                        int ranks_per_host = 0);

/// The one copy of `cost` for the life of the process (equal costs, equal pointers): what a
/// communicator keeps of its measured link, and what choices are cached by.
const CostParams* intern_cost(const CostParams& cost);

/// The size class of `bytes` (0 for 0, else 1 + floor(log2 bytes)) and the size it is decided at.
int size_class(std::size_t bytes);
std::size_t class_size(int size_class);

/// The short link probe init() runs when the ranks span hosts and nothing names the transport's
/// costs: rank 0 ping-pongs 8 B with the first rank on another host (else rank 1), the median one
/// way being α, then streams 1 MiB to it (8 MiB where that took under 5 ms) for β. Every rank gets
/// rank 0's values (a broadcast) with the γ of cost_for(transport, kind), so every rank prices
/// alike; the caller keeps them with the communicator (CommImpl::set_link_cost), whose splits
/// inherit them. Collective over `comm`, with no other call in flight; nothing with one rank or a
/// clock that measured no time.
std::optional<CostParams> probe_link(Communicator& comm, std::string_view transport, transport::Kind kind);

/// Test-only: forgets cached choices; with `reload`, also the active table and whether the
/// environment was loaded (the next load_from_environment reads it again).
void reset_for_testing(bool reload = false);

}  // namespace tutti::comm::choice
