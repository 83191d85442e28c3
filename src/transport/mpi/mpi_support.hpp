// What the MPI transport and Tutti's use of MPI's own collectives share: error reporting, the
// thread-level check, the process-wide lock that serializes MPI calls when MPI is not
// MPI_THREAD_MULTIPLE, and the mapping of Tutti's types and reductions onto MPI's.
#pragma once

#include <mpi.h>

#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <string>

#include "tutti/types.hpp"

namespace tutti::transport::mpi {

/// MPI's text for an error code, e.g. "MPI_ERR_TRUNCATE: message truncated".
std::string error_string(int code);

/// Throws Error(system) "<function> failed: <MPI's message>" unless `code` is MPI_SUCCESS.
void check(int code, const char* function);

/// Throws Error(invalid_argument) naming `who` unless MPI is initialized and not finalized.
void require_usable_mpi(const char* who);

/// True when MPI provides less than MPI_THREAD_SERIALIZED (a program that called plain MPI_Init):
/// only the thread that calls Tutti may call MPI, so the progress engine must leave it alone.
bool caller_threads_only();

/// Held around every MPI call: the process-wide lock when MPI provides less than
/// MPI_THREAD_MULTIPLE (so that no two threads are in MPI at once), else an empty lock.
std::unique_lock<std::mutex> serialize();

/// True while MPI is initialized and not yet finalized (destructors must not call MPI otherwise).
bool mpi_active();

/// MPI datatype of `type`. f16 and bf16 are Tutti's own 2-byte MPI types (created on first use).
MPI_Datatype datatype(DataType type);

/// Tests `requests` (each test under serialize()) until all have completed, `deadline` passes or
/// `stop` (when given) returns true, napping between tests (a brief spin, then 50 µs doubling to
/// 1 ms). Returns true once all completed. Throws Error(system) naming `what` when MPI fails one.
bool poll(std::span<MPI_Request> requests, std::chrono::steady_clock::time_point deadline, const char* what,
          const std::function<bool()>& stop = {});

/// Gives up on `request` without freeing what it uses: an MPI collective (which MPI cannot cancel)
/// or an MPI_Comm_idup that a peer never joined. MPI may still read or write `keep` until it
/// completes the request, which may be never: both are kept for the life of the process (MPI_Finalize
/// reclaims the request).
void abandon(MPI_Request request, std::shared_ptr<void> keep);

/// MPI reduction of `op` on `type` (avg reduces as sum; the caller divides). f16 and bf16 use
/// user-defined MPI_Ops that compute with reduce::apply (created on first use).
MPI_Op reduction(ReduceOp op, DataType type);

}  // namespace tutti::transport::mpi
