// Static checks of one call's schedules: regions inside their buffers, and races. Races are
// found without running anything: two steps of a rank that touch overlapping memory, one
// writing, must be ordered by the transitive deps (in place, through the real aliasing).
#include <algorithm>

#include "schedule/check_call.hpp"

namespace tutti::schedule::checker {

// Region bounds, operand shapes, and the read-only input.
std::string check_regions(const Call& call) {
  for (int r = 0; r < call.p; ++r) {
    const RankView& v = call.ranks[static_cast<std::size_t>(r)];
    const auto& steps = call.schedules[static_cast<std::size_t>(r)].steps;
    for (std::uint32_t i = 0; i < steps.size(); ++i) {
      const Step& s = steps[i];
      const bool has_operand = s.kind == StepKind::recv_reduce || s.kind == StepKind::copy;
      for (const Region* reg : {&s.region, has_operand ? &s.operand : nullptr}) {
        if (reg == nullptr) continue;
        const std::size_t size = v.size[index_of(reg->buffer)];
        if (reg->offset > size || reg->count > size - reg->offset)
          return where(r, i, s) + ": region " + describe(*reg) + " lies outside " +
                 kBufferNames[index_of(reg->buffer)] + " of " + std::to_string(size) + " elements on this rank";
      }
      if (s.kind != StepKind::send && s.region.buffer == Buffer::input)
        return where(r, i, s) + ": writes into input, the caller's read-only send buffer";
      if (!has_operand) continue;
      if (s.operand.count != s.region.count) return where(r, i, s) + ": operand and region differ in count";
      const Loc a = v.resolve(s.region), b = v.resolve(s.operand);
      const bool overlap =
          a.mem == b.mem && a.offset < b.offset + s.region.count && b.offset < a.offset + s.region.count;
      if (overlap && !(a == b)) return where(r, i, s) + ": operand partially overlaps region";
    }
  }
  return {};
}

namespace {

struct Access {
  std::size_t mem, lo, hi;
  std::uint32_t step;
  bool write;
};

std::vector<Access> accesses(const RankView& v, const Schedule& sched) {
  std::vector<Access> out;
  auto add = [&](const Region& reg, std::uint32_t i, bool write) {
    if (reg.count == 0) return;
    const Loc l = v.resolve(reg);
    out.push_back({l.mem, l.offset, l.offset + reg.count, i, write});
  };
  for (std::uint32_t i = 0; i < sched.steps.size(); ++i) {
    const Step& s = sched.steps[i];
    if (s.kind == StepKind::send) add(s.region, i, false);
    if (s.kind == StepKind::recv) add(s.region, i, true);
    if (s.kind == StepKind::recv_reduce ||
        (s.kind == StepKind::copy && !(v.resolve(s.region) == v.resolve(s.operand)))) {
      add(s.region, i, true);
      add(s.operand, i, false);
    }
  }
  std::sort(out.begin(), out.end(),
            [](const Access& a, const Access& b) { return a.mem != b.mem ? a.mem < b.mem : a.lo < b.lo; });
  return out;
}

// reach[j] has bit i when step i precedes step j through deps.
std::vector<std::vector<std::uint64_t>> reachability(const Schedule& sched) {
  const std::size_t n = sched.steps.size(), words = (n + 63) / 64;
  std::vector<std::vector<std::uint64_t>> reach(n, std::vector<std::uint64_t>(words, 0));
  for (std::size_t j = 0; j < n; ++j)
    for (auto d : sched.steps[j].deps) {
      for (std::size_t w = 0; w < words; ++w) reach[j][w] |= reach[d][w];
      reach[j][d / 64] |= std::uint64_t{1} << (d % 64);
    }
  return reach;
}

}  // namespace

std::string check_races(const Call& call) {
  for (int r = 0; r < call.p; ++r) {
    const Schedule& sched = call.schedules[static_cast<std::size_t>(r)];
    const auto list = accesses(call.ranks[static_cast<std::size_t>(r)], sched);
    const auto reach = reachability(sched);
    std::vector<Access> active;  // sweep over offsets: accesses that may still overlap
    for (const Access& a : list) {
      std::erase_if(active, [&](const Access& b) { return b.mem != a.mem || b.hi <= a.lo; });
      for (const Access& b : active) {
        if (a.step == b.step || !(a.write || b.write)) continue;
        const auto [i, j] = std::minmax(a.step, b.step);
        if (reach[j][i / 64] >> (i % 64) & 1) continue;
        const std::string aliased = call.options.in_place ? " (in place)" : "";
        return "race on rank " + std::to_string(r) + aliased + ": " + where(r, i, sched.steps[i]) + " and step " +
               std::to_string(j) + " (" + describe(sched.steps[j]) +
               ") touch overlapping memory, one writing, and no deps order them";
      }
      active.push_back(a);
    }
  }
  return {};
}

}  // namespace tutti::schedule::checker
