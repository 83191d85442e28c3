// Tutti over MPI: a Tutti communicator built from an MPI communicator, for programs that are
// already MPI programs (launched by mpirun, with MPI initialized by themselves).
#pragma once

#include <mpi.h>

#include "tutti/tutti.hpp"

namespace tutti {

/// A Tutti communicator over the ranks of `comm`, with the same rank numbering. Tutti's
/// schedules run over MPI point-to-point on duplicates of `comm` (so they never match the
/// program's own messages), and `Algorithm::mpi` runs MPI's own collective instead.
/// Collective over `comm`.
///
/// MPI must be initialized. At MPI_THREAD_MULTIPLE Tutti calls MPI from its progress thread too,
/// so nonblocking collectives advance while the caller computes; at MPI_THREAD_SERIALIZED it
/// serializes every MPI call of the process itself. Below that (plain MPI_Init: SINGLE or
/// FUNNELED) it calls MPI only on the thread that calls it, so what is lost is background
/// progress: a nonblocking operation advances only inside test(), wait() and later calls on the
/// communicator, and the training engine (which calls from its own thread) refuses such a
/// communicator with Error(unsupported). Call Tutti from the thread that initialized MPI then.
/// `comm` itself may be freed afterwards, but MPI must outlive the communicator: destroy
/// it (every copy) before MPI_Finalize.
/// Set-up is bounded by TUTTI_TIMEOUT_MS (as split is): a rank of `comm` that does not call
/// from_mpi in time makes the others raise Error(timeout) by then.
/// Throws Error(invalid_argument) for MPI_COMM_NULL or MPI not initialized, Error(timeout),
/// Error(system) when MPI fails.
///
/// Failures reach every rank: the first error (a mismatch, a timeout) is sent to every rank on a
/// communicator of Tutti's own, and each raises it. MPI cannot cancel a collective: after an
/// `Algorithm::mpi` collective failed or timed out once every rank had joined it, MPI may still
/// use its buffers, which must stay valid until MPI_Finalize.
Communicator from_mpi(MPI_Comm comm);

/// The MPI datatype of `type`, for a program that calls MPI on the same buffers. f16 and bf16 are
/// Tutti's own 2-byte MPI types (created at the first call, while MPI is initialized).
MPI_Datatype mpi_datatype(DataType type);
/// The MPI reduction of `op` on `type`: MPI's own where it has one; for f16 and bf16, Tutti's own
/// MPI_Ops, which reduce with Tutti's kernels (created at the first call). avg is MPI_SUM (the
/// caller divides by the ranks).
MPI_Op mpi_op(ReduceOp op, DataType type);

}  // namespace tutti
