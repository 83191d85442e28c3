// Algorithm::mpi: MPI's own collectives, run on the user's buffers over an MpiTransport's
// collective communicator, for comparison with (and as a fallback to) Tutti's schedules.
#pragma once

#include <cstddef>
#include <optional>
#include <span>
#include <string_view>

#include "transport/transport.hpp"

namespace tutti::transport {

/// Runs collective `kind` (schedule::to_string's names: "allreduce", "reduce", "reduce_scatter",
/// "allgather", "allgatherv", "broadcast", "alltoall", "alltoallv", "gather", "scatter",
/// "barrier") with MPI's blocking collective, with the arguments of a Tutti call (detail::Call:
/// counts in elements; broadcast's buffer is `recv`; `counts` = allgatherv's recv_counts or
/// alltoallv's send_counts, `recv_counts` = alltoallv's). Tutti's in-place forms map onto
/// MPI_IN_PLACE; avg is MPI_SUM then reduce::divide; f16 and bf16 reduce through user-defined MPI
/// ops. The caller has validated the arguments.
///
/// Returns false, doing nothing, when `t` is not an MPI transport. Throws Error(system) naming the
/// MPI function when MPI fails, Error(unsupported) for a count over INT_MAX elements (or
/// displacements over INT_MAX), Error(invalid_argument) for an unknown `kind`.
/// Blocking and without a deadline: MPI cannot bound a collective's time; a peer that never
/// joins hangs it. With MPI below MPI_THREAD_MULTIPLE it holds the process-wide MPI lock meanwhile.
bool mpi_collective(Transport& t, std::string_view kind, const void* send, void* recv, std::size_t count, DataType type,
                    std::optional<ReduceOp> op, int root, std::span<const std::size_t> counts,
                    std::span<const std::size_t> recv_counts);

}  // namespace tutti::transport
