// What a transport's messages cost, as the cost model behind Algorithm::automatic prices them
// (comm/cost_model.hpp): α, β and γ per kind of transport, and the price of the native algorithms a
// kind of transport runs itself (shared memory's `direct`), which only that transport knows the
// shape of. The transport layer answers for both; comm asks by Kind, never by name.
#pragma once

#include <cstddef>
#include <optional>
#include <vector>

#include "transport/kind.hpp"
#include "tutti/tuning.hpp"
#include "tutti/types.hpp"

namespace tutti::transport {

/// One transport's costs: α per message (or barrier), β per byte on the wire, γ per reduced element
/// (the tuning file's cost_model, <tutti/tuning.hpp>).
using CostParams = tuning::CostModel;

/// The compiled-in costs of transports of `kind` (routed: tcp's, its slowest link).
CostParams default_cost(Kind kind);

/// The native algorithms transports of `kind` offer Algorithm::automatic for `collective` (shm:
/// direct for allreduce, reduce_scatter, allgather and broadcast; the others none: MPI's own
/// collectives are never automatic).
std::vector<Algorithm> native_candidates(Kind kind, Collective collective);

/// Predicted seconds of the native `algorithm` for a call of `bytes` on `ranks` ranks (`bytes` as
/// the cost model takes them: the total over ranks for reduce_scatter and allgather), priced by
/// the transport that runs it; nullopt where no transport runs `algorithm` natively for
/// `collective`.
std::optional<double> native_price(Algorithm algorithm, Collective collective, int ranks, std::size_t bytes,
                                   const CostParams& cost);

}  // namespace tutti::transport
