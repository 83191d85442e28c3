// The checker's view of one call, shared by its parts: check.cpp lays out each rank's buffers
// and in-place aliasing and runs the checks; check_regions.cpp validates regions and finds
// races statically; check_simulation.cpp runs the call on contribution-tracking data.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "schedule/algorithms.hpp"
#include "schedule/check.hpp"

namespace tutti::schedule::checker {

using Token = std::uint64_t;
using Value = std::vector<Token>;  // sorted multiset of contributions

inline constexpr std::array<const char*, 3> kBufferNames{"input", "output", "scratch"};
inline std::size_t index_of(Buffer b) { return static_cast<std::size_t>(b); }

struct Loc {
  std::size_t mem = 0;
  std::size_t offset = 0;
  bool operator==(const Loc&) const = default;
};

// One rank's view of the call: its parameters, its buffers' sizes and its in-place aliasing.
struct RankView {
  Params params;
  std::array<std::size_t, 3> size{};  // logical sizes of input, output, scratch
  bool aliased = false;
  Buffer alias_from = Buffer::input;  // this buffer lives inside alias_into at alias_offset
  Buffer alias_into = Buffer::output;
  std::size_t alias_offset = 0;
  std::vector<std::size_t> send_counts, recv_counts;  // alltoallv

  Loc resolve(const Region& r) const {
    if (aliased && r.buffer == alias_from) return {index_of(alias_into), alias_offset + r.offset};
    return {index_of(r.buffer), r.offset};
  }
};

struct Call {
  Params params;
  CheckOptions options;
  int p = 1;
  std::vector<std::vector<std::size_t>> matrix;  // alltoallv: matrix[a][b] = a sends to b
  std::span<const Schedule> schedules;
  std::vector<RankView> ranks;
  std::vector<std::vector<StepRef>> partner;
  std::vector<std::array<std::vector<Value>, 3>> memory;
};

std::string describe(const Region& r);
std::string describe(const Step& s);
/// "rank r step i (what the step does)", the prefix of a defect.
std::string where(int rank, std::uint32_t step, const Step& s);

/// Region bounds, operand shapes, and the read-only input: "" or the first defect.
std::string check_regions(const Call& call);

/// Two steps of a rank that touch overlapping memory, one writing, unordered by the transitive
/// deps: "" or the first such pair.
std::string check_races(const Call& call);

/// Runs the call (call.partner matched) on data that records contributions and compares every
/// output element with what the collective promises; for a barrier, that no rank can leave
/// before every rank entered. "" or the first defect.
std::string simulate(Call& call);

}  // namespace tutti::schedule::checker
