// What the watchdogs of the backends that run on the streams alone (ipc, nccl) share: the check
// that every rank called the same operation, where the ranks' processes live, and how often they look.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>

#include "gpu/host_transfer.hpp"
#include "tutti/tutti.hpp"

namespace tutti::gpu::detail {

/// How often a watchdog looks at its peers' processes while a stream waits on them.
inline constexpr auto liveness_period = std::chrono::milliseconds(100);

/// Exchanges a descriptor of `call` (collective, count, type, op, root, peer) with every rank of
/// `host` (an allgather; every rank must call it for the same operation in the same order) and
/// compares: Error(mismatch) naming two ranks and what each called, the host's error (a timeout
/// naming the silent ranks, a dead peer) prefixed with `what`, or nothing when all agree.
std::optional<Error> check_same_call(tutti::Communicator& host, const DeviceCall& call, const std::string& what);

/// Whether process `pid` (of this host) is gone or a zombie: kill(pid, 0) still succeeds on a
/// zombie, which its launcher may not have reaped yet.
bool process_dead(std::int64_t pid);

/// This machine as topology names it (TUTTI_HOST, else the host name) with its boot id: two ranks
/// whose identities are equal share memory.
std::string host_identity();

}  // namespace tutti::gpu::detail
