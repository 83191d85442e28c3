// The tally of a multi-process test program (under tutti-run): every rank counts its own checks,
// printing each failure with its name; at the end the counts are summed over the ranks, rank 0
// prints "N passed, M failed", and the exit status says whether every check passed everywhere.
#pragma once

#include <cstdio>
#include <exception>
#include <string>
#include <utility>

#include "harness.hpp"
#include "tutti/tutti.hpp"

namespace tutti::testing {

struct Tally {
  int passed = 0;
  int failed = 0;

  /// Runs `check` (returns an error message, empty when the check passed; an exception it throws
  /// is the error) and counts it; a failure is printed as "FAIL <name>: <error>".
  template <class Check>
  void record(const std::string& name, Check&& check) {
    std::string error;
    try {
      error = std::forward<Check>(check)();
    } catch (const std::exception& e) {
      error = std::string("exception: ") + e.what();
    }
    if (error.empty()) {
      ++passed;
    } else {
      ++failed;
      std::printf("FAIL %s: %s\n", name.c_str(), error.c_str());
    }
  }

  Tally& operator+=(const Tally& other) {
    passed += other.passed;
    failed += other.failed;
    return *this;
  }
};

/// Collective: sums the tallies over `world`'s ranks, rank 0 prints "N passed, M failed"; returns
/// the exit status (0 when nothing failed anywhere and something passed).
inline int finish(Communicator& world, const Tally& mine) {
  int totals[2] = {mine.passed, mine.failed};
  world.allreduce(totals, totals, 2, DataType::i32, ReduceOp::sum, {{}, test_timeout});
  if (world.rank() == 0) std::printf("%d passed, %d failed\n", totals[0], totals[1]);
  return totals[1] == 0 && totals[0] > 0 ? 0 : 1;
}

}  // namespace tutti::testing
