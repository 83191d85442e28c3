// tutti-bench --device emulated|cuda: the collectives of gpu::Communicator on device buffers,
// enqueued on one stream, beside the sync peer (--peers sync) and the device-to-device copy of the
// same bytes, size by size in one run.
#pragma once

#include "bench/options.hpp"
#include "tutti/tutti.hpp"

namespace tutti::bench {

/// Runs the device sweep on every rank (rank 0 prints; --json written there). Returns the exit
/// status: 0, 1 when a result was wrong or the device could not be opened on some rank (rank 0
/// then prints one line naming the device and why).
int run_device(Communicator& world, const BenchOptions& options, const std::string& launcher);

}  // namespace tutti::bench
