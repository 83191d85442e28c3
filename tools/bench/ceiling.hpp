// The ceiling of BENCHMARKS.md, measured in the same run: the memory bandwidth B of all ranks
// copying at once (bytes read plus bytes written) and the one-way latency of a flag between two
// ranks through shared memory.
#pragma once

#include "bench/cases.hpp"
#include "tutti/tutti.hpp"

namespace tutti::bench {

struct Ceiling {
  double memory_bandwidth = 0;  // bytes per second, all ranks together
  double latency = 0;           // seconds, one way (0 with one rank)
};

/// Collective over `world`. Throws std::runtime_error if shared memory cannot be set up.
Ceiling measure_ceiling(Communicator& world);

/// The lower bound on the time of a case: max(bytes through memory / B, one-way latency).
double time_bound(const Case& c, int ranks, const Ceiling& ceiling);

}  // namespace tutti::bench
