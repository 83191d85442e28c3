// Shared-memory transport: processes of one host exchange messages through one segment per
// communicator (/dev/shm/<name>), and wait on futexes in it.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "transport/transport.hpp"

namespace tutti::transport::shm {

/// This rank's transport over the segment "/<name>" shared by the `size` ranks of communicator
/// `comm_id` (all on this host). Rank 0 creates the segment, the others open it; returns once all
/// ranks are attached (the segment's name is then unlinked, so nothing is left behind even if a
/// process crashes). Error(timeout) if not every rank attached within `timeout`.
/// `name` must start with "tutti-<job id>" so that tutti-run can remove leftovers.
std::unique_ptr<Transport> open(const std::string& name, int rank, int size, std::uint64_t comm_id,
                                std::chrono::milliseconds timeout);

}  // namespace tutti::transport::shm
