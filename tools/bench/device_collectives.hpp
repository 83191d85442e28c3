// What device mode (--device) can run: the collectives of gpu::Communicator, one table row each in
// device_collectives.cpp, and the backends --backend may name. A collective added to
// gpu::Communicator is one more row there.
#pragma once

#include <span>
#include <string>
#include <vector>

#include "bench/cases.hpp"
#include "tutti/gpu.hpp"

namespace tutti::bench {

/// Enqueues the case's collective on `stream` (device pointers `send` and `recv`, as Buffers lays them out).
using DeviceEnqueue = void (*)(gpu::Communicator& gpu, const Case& c, const void* send, void* recv, gpu::Stream stream,
                               const gpu::Options& options);

struct DeviceCollective {
  Collective kind;
  DeviceEnqueue enqueue;
};

/// Every collective gpu::Communicator has, in the order `-t all` runs them.
std::span<const DeviceCollective> device_collectives();
/// The row for `kind`, or null when gpu::Communicator has no such collective (sendrecv included).
const DeviceCollective* find_device_collective(Kind kind);
std::vector<Kind> device_kinds();
/// "allreduce, broadcast, ..." for messages.
std::string device_collective_names();

/// Accepts the names of gpu::Backend; throws std::invalid_argument naming them otherwise.
void check_backend(const std::string& backend);
/// The options every device call gets for --backend `backend` (the one place a backend reaches
/// gpu::Communicator).
gpu::Options device_options(const std::string& backend);

}  // namespace tutti::bench
