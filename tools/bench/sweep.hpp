// The measured sweep of tutti-bench: for each collective, algorithm, type, op and size, Tutti
// out of place and in place, then each peer, alternating size by size; checked with -c.
#pragma once

#include <memory>
#include <optional>
#include <vector>

#include "bench/ceiling.hpp"
#include "bench/options.hpp"
#include "bench/report.hpp"
#include "bench/runner.hpp"
#include "tutti/tutti.hpp"

namespace tutti::bench {

/// The algorithms `--all-algorithms` sweeps for `kind` on this communicator (automatic first).
std::vector<Algorithm> algorithms_to_sweep(Communicator& world, Kind kind);

/// One row: times Tutti (both forms), then the peers (primary form), with checks.
Row measure_row(Communicator& world, const BenchOptions& options, const Case& base, Algorithm algorithm,
                const std::vector<std::unique_ptr<Peer>>& peers, const std::optional<Ceiling>& ceiling);

/// Runs the whole sweep, printing on rank 0; returns the report (every rank has the same rows).
Report run_sweep(Communicator& world, const BenchOptions& options, const std::vector<std::unique_ptr<Peer>>& peers,
                 const std::optional<Ceiling>& ceiling);

}  // namespace tutti::bench
