// Algorithm::mpi: MPI's own collectives, run on the user's buffers over an MpiTransport's
// collective communicator, for comparison with (and as a fallback to) Tutti's schedules.
//
// Nonblocking and bounded: every rank first shares its signature (MPI_Iallgather of 40 bytes),
// so that ranks that disagree all raise the same Error(mismatch) before MPI touches the user's
// buffers, then runs the nonblocking collective (MPI_Iallreduce, MPI_Ibcast, ...). The transport
// tests both with its progress and wait, so the operation's deadline bounds them like any other.
// MPI cannot cancel a collective: one given up on (timeout, abort) stays with MPI, which may still
// read the send buffer and write the receive buffer until it completes, and it completes only
// if every rank joins it. Tutti's own memory for it is kept for the life of the process; the
// caller's buffers must then stay valid until MPI_Finalize. (The signature exchange comes first,
// so a rank that never came leaves only that exchange, on Tutti's memory, behind.)
#pragma once

#include <cstddef>
#include <memory>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

#include "transport/transport.hpp"

namespace tutti::transport {

/// One MPI collective, started by progress() once it may run. `bind` takes the caller's signature,
/// shared with every rank before the collective runs; `progress` throws Error(mismatch) naming the
/// first rank whose signature differs from rank 0's (the same on every rank), the communicator's
/// first error when it was aborted meanwhile, Error(system) when MPI fails. MPI does not say which
/// ranks it waits for, so none are named.
using MpiCollective = NativeCollective;

/// Prepares collective `kind` (any) with the arguments of a Tutti call (comm::Call: counts in elements;
/// broadcast's buffer is `recv`; `counts` = allgatherv's recv_counts or alltoallv's send_counts,
/// `recv_counts` = alltoallv's; the spans are copied). Tutti's in-place forms map onto
/// MPI_IN_PLACE; avg is MPI_SUM then reduce::divide; f16 and bf16 reduce through user-defined MPI
/// ops. The caller has validated the arguments.
///
/// Returns nullptr when `t` is not an MPI transport. Throws Error(unsupported) for a count over
/// INT_MAX elements (or displacements over INT_MAX), Error(invalid_argument) for an unknown `kind`.
std::unique_ptr<MpiCollective> prepare_mpi_collective(Transport& t, Collective kind, const void* send, void* recv,
                                                      std::size_t count, DataType type, std::optional<ReduceOp> op,
                                                      int root, std::span<const std::size_t> counts,
                                                      std::span<const std::size_t> recv_counts);

/// The same, run to completion on the caller's thread within the transport's timeout (for callers
/// without an operation queue): returns false, doing nothing, when `t` is not an MPI transport.
/// Throws as prepare_mpi_collective and progress do, and Error(timeout) (after aborting the
/// transport) when the collective did not complete in time.
bool mpi_collective(Transport& t, Collective kind, const void* send, void* recv, std::size_t count, DataType type,
                    std::optional<ReduceOp> op, int root, std::span<const std::size_t> counts,
                    std::span<const std::size_t> recv_counts);

}  // namespace tutti::transport
