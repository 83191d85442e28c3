// tutti-bench --collective sparse_allreduce: every sparse algorithm (and automatic) per density, beside a
// dense allreduce of the same vector, each result checked against the dense one.
#pragma once

#include "bench/options.hpp"
#include "tutti/tutti.hpp"

namespace tutti::bench {

/// Runs the sparse table; returns the exit status (1 when a result was wrong).
int run_sparse(Communicator& world, const BenchOptions& options);

}  // namespace tutti::bench
