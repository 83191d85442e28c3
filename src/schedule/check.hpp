// In-process checking of schedules: runs every rank's schedule of one call together, with no
// I/O, on data that records which rank's contribution reached which element, and reports the
// first defect. Used by the tests for every p in milliseconds, before any socket is opened.
#pragma once

#include <span>
#include <string>

#include "schedule/schedule.hpp"

namespace tutti::schedule {

struct CheckOptions {
  bool in_place = false;    // run with input/output aliased as schedule.hpp's in-place rules say
  bool check_races = true;  // verify that conflicting accesses are ordered by deps (quadratic; small counts)
  // alltoallv only: the p×p matrix of element counts, [a*p + b] = what rank a sends to rank b.
  // Empty: every rank sends params.counts[b] to rank b (so rank b receives counts[b] from each).
  std::span<const std::size_t> alltoallv_counts{};
};

/// Empty string when the schedules of `algorithm` for `params` (params.rank ignored; all ranks are
/// generated) are correct: deps point backwards; regions lie inside their buffers; non-roots never
/// touch output where it does not exist; sends and receives match pairwise in count and order;
/// the execution completes without deadlock; no two unordered steps conflict on a region; and every
/// rank's output holds exactly the collective's result (for reductions: every rank's contribution
/// exactly once); for a barrier, that no rank can finish before every rank has started. Otherwise
/// a message naming the rank, step and defect. Every element carries the set of contributions
/// it holds, so the cost grows with p · count: meant for counts up to a few thousand.
std::string check(Algorithm algorithm, const Params& params, const CheckOptions& options = {});

/// The same checks on given schedules (schedules[r] is rank r's, params.collective and the rest
/// of params describe the call): for hand-built or transformed schedules.
std::string check_schedules(std::span<const Schedule> schedules, const Params& params,
                            const CheckOptions& options = {});

}  // namespace tutti::schedule
