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

/// The job's ranks on this machine: processes that share its kernel, and so its cores, whatever
/// host names or network namespaces they have (an emulated cluster's hosts, containers). init()
/// sets it; 0 (unknown) before. Where these ranks outnumber the machine's cores, every shared-
/// memory communicator of this process waits as a crowded one does, however few its own ranks
/// (a communicator split from a crowded world is as crowded as the world).
void set_ranks_on_machine(int ranks);
int ranks_on_machine();

/// Whether `ranks` processes, or the job's ranks on this machine (ranks_on_machine, shm.hpp) if
/// more, outnumber the machine's online cores (not this process's affinity: a launcher that binds
/// each rank to one core, as mpirun does, still gives each a core of its own). Waits then yield
/// the core instead of spinning on it.
bool ranks_outnumber_cores(int ranks);

/// What tells processes on one machine from processes on another: the kernel's boot id (equal
/// across namespaces and containers of one boot), else `host` (this machine's host name).
std::string machine_id(const std::string& host);

}  // namespace tutti::transport::shm
