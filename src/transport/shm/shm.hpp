// Shared-memory transport: processes of one host exchange messages through one segment per
// communicator (/dev/shm/<name>), and wait on futexes in it.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "bootstrap/store.hpp"
#include "transport/transport.hpp"

namespace tutti::transport::shm {

/// This rank's transport over the segment "/<name>" shared by the `size` ranks of communicator
/// `comm_id` (all on this host). Rank 0 creates the segment, the others open it; returns once all
/// ranks are attached (the segment's name is then unlinked, so nothing is left behind even if a
/// process crashes). Error(timeout) if not every rank attached within `timeout`.
/// `name` must start with "tutti-<job id>" so that tutti-run can remove leftovers.
/// Errors as Segment::attach (segment.hpp), which also refuses a segment another user could open.
std::unique_ptr<Transport> open(const std::string& name, int rank, int size, std::uint64_t comm_id,
                                std::chrono::milliseconds timeout);

/// The name of a job's world segment: "tutti-<job id>-world-<nonce>".
std::string world_segment_name(const std::string& job_id, const std::string& nonce);

/// The world communicator's transport: rank 0 draws a random nonce (96 bits) and publishes it in
/// `store` under `key`; every rank then opens world_segment_name(job_id, nonce). The store is
/// authenticated, so another local user can neither learn the name before the segment exists
/// nor take it first. Errors as open, plus the store's (Error(timeout) if rank 0 never publishes).
std::unique_ptr<Transport> open_world(bootstrap::Store& store, const std::string& key, const std::string& job_id,
                                      int rank, int size, std::uint64_t comm_id, std::chrono::milliseconds timeout);

}  // namespace tutti::transport::shm
