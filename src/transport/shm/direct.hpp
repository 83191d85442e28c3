// Shared-memory ("direct") collectives: the ranks of a communicator exchange data through the
// segment's data area and meet at a futex barrier, instead of sending messages.
#pragma once

#include <chrono>
#include <cstddef>
#include <optional>
#include <string_view>

#include "transport/transport.hpp"

namespace tutti::transport::shm {

/// Runs collective `kind` over the shared-memory segment of `transport`, on the caller's thread,
/// to completion. Returns false (and does nothing) if `transport` is not a shared-memory transport.
/// Kinds, with counts in elements of `type` (send == recv-style in-place forms as in the public API):
///   "allreduce"       send, recv: count elements; op required (avg = sum / size)
///   "reduce_scatter"  send: size * count, recv: count (block `rank`); op required
///   "allgather"       send: count, recv: size * count
///   "broadcast"       recv (== send) of `root`, count elements, to every rank
/// The caller guarantees that no other operation of this communicator is in flight and that
/// every rank calls the same collectives in the same order with the same arguments.
/// Errors: Error(unsupported) for another kind; Error(invalid_argument) for a missing op or a bad
/// root; Error(timeout) naming the ranks still awaited at `deadline`; Error(peer_failure) if a
/// rank it waits for died; the communicator's error if it was aborted. Every error but
/// `unsupported` aborts the communicator, so that the other ranks wake and fail too.
bool direct_collective(Transport& transport, std::string_view kind, const void* send, void* recv, std::size_t count,
                       DataType type, std::optional<ReduceOp> op, int root,
                       std::chrono::steady_clock::time_point deadline);

/// Whether `transport` is a shared-memory transport (the direct algorithms serve only those).
bool is_shm(const Transport& transport);

}  // namespace tutti::transport::shm
