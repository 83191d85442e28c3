// tutti-bench --calibrate and --tune: the measurements behind Algorithm::automatic.
#pragma once

#include "bench/options.hpp"
#include "tutti/tutti.hpp"

namespace tutti::bench {

/// Measures α (one-way latency of a small message between ranks 0 and 1), β (seconds per byte
/// of a large one) and γ (seconds per reduced f32 element on one core) on this communicator's
/// transport; prints them on rank 0. With --calibrate alone, rank 0 writes them into the tuning
/// file's `cost_model` (keeping the file's other entries). Returns 0, or 1 on an error.
int calibrate(Communicator& world, const BenchOptions& options);

/// Sweeps every applicable algorithm of each collective (allreduce, reduce_scatter, allgather,
/// broadcast, reduce, alltoall unless --collective says otherwise) over the sizes, and writes the fastest
/// per size as tuning entries for (collective, transport, ranks), with the calibrated cost model,
/// replacing the file's entries for this transport and rank count. Returns 0, or 1.
int tune(Communicator& world, const BenchOptions& options);

}  // namespace tutti::bench
