#include "schedule/schedule.hpp"

#include <algorithm>
#include <cmath>
#include <deque>
#include <map>
#include <utility>

#include "schedule/algorithms.hpp"

namespace tutti::schedule {

std::uint32_t Schedule::send(int peer, Region region, std::vector<std::uint32_t> deps) {
  steps.push_back(Step{StepKind::send, peer, region, {}, std::move(deps)});
  return static_cast<std::uint32_t>(steps.size() - 1);
}

std::uint32_t Schedule::recv(int peer, Region region, std::vector<std::uint32_t> deps) {
  steps.push_back(Step{StepKind::recv, peer, region, {}, std::move(deps)});
  return static_cast<std::uint32_t>(steps.size() - 1);
}

std::uint32_t Schedule::recv_reduce(int peer, Region region, Region operand, std::vector<std::uint32_t> deps) {
  steps.push_back(Step{StepKind::recv_reduce, peer, region, operand, std::move(deps)});
  return static_cast<std::uint32_t>(steps.size() - 1);
}

std::uint32_t Schedule::copy(Region dst, Region src, std::vector<std::uint32_t> deps) {
  steps.push_back(Step{StepKind::copy, -1, dst, src, std::move(deps)});
  return static_cast<std::uint32_t>(steps.size() - 1);
}

std::size_t block_offset(std::size_t count, std::size_t parts, std::size_t i) {
  const std::size_t base = count / parts, extra = count % parts;
  return i * base + std::min(i, extra);
}

std::uint32_t append(Schedule& head, const Schedule& tail, const std::vector<std::uint32_t>& after) {
  const auto shift = static_cast<std::uint32_t>(head.steps.size());
  const std::size_t scratch_base = head.scratch_count;
  auto move_region = [&](Region r) {
    if (r.buffer == Buffer::scratch) r.offset += scratch_base;
    return r;
  };
  for (const Step& step : tail.steps) {
    Step s = step;
    s.region = move_region(s.region);
    s.operand = move_region(s.operand);
    for (auto& d : s.deps) d += shift;
    s.deps.insert(s.deps.end(), after.begin(), after.end());
    head.steps.push_back(std::move(s));
  }
  head.scratch_count += tail.scratch_count;
  return shift;
}

std::vector<std::uint32_t> sinks(const Schedule& schedule) {
  std::vector<bool> has_dependent(schedule.steps.size(), false);
  for (const Step& s : schedule.steps)
    for (auto d : s.deps) has_dependent[d] = true;
  std::vector<std::uint32_t> out;
  for (std::uint32_t i = 0; i < schedule.steps.size(); ++i)
    if (!has_dependent[i]) out.push_back(i);
  return out;
}

Schedule mirror(const Schedule& schedule) {
  auto swap_buffers = [](Region r) {
    if (r.buffer != Buffer::scratch) r.buffer = r.buffer == Buffer::input ? Buffer::output : Buffer::input;
    return r;
  };
  const auto n = static_cast<std::uint32_t>(schedule.steps.size());
  Schedule out;
  out.scratch_count = schedule.scratch_count;
  out.steps.resize(n);
  for (std::uint32_t i = n; i-- > 0;) {
    const Step& s = schedule.steps[i];
    if (s.kind == StepKind::recv_reduce)
      throw Error(ErrorCode::invalid_argument, "schedule::mirror: a recv_reduce has no mirror image");
    Step& m = out.steps[n - 1 - i];
    m.kind = s.kind == StepKind::send ? StepKind::recv : s.kind == StepKind::recv ? StepKind::send : StepKind::copy;
    m.peer = s.peer;
    m.region = swap_buffers(s.kind == StepKind::copy ? s.operand : s.region);
    if (s.kind == StepKind::copy) m.operand = swap_buffers(s.region);
    // What waited for step d now comes before it: in ascending order, as i descends.
    for (auto d : s.deps) out.steps[n - 1 - d].deps.push_back(n - 1 - i);
  }
  return out;
}

std::size_t chunks_for(const Params& params, std::size_t count) {
  const std::size_t chunk_elems =
      std::max<std::size_t>(1, params.chunk_bytes / std::max<std::size_t>(1, params.elem_size));
  return std::max<std::size_t>(1, (count + chunk_elems - 1) / chunk_elems);
}

bool pipelined_chain(Algorithm algorithm, Collective collective) {
  return algorithm == Algorithm::ring && (collective == Collective::broadcast || collective == Collective::reduce);
}

void fit_chunks(Params& params, Algorithm algorithm, double alpha, double beta) {
  const bool chain = pipelined_chain(algorithm, params.collective);
  // Below 16 KiB a chunk's own costs (a message each way through the transports' queues, which
  // ranks sharing cores pay more than a ping-pong's α) outweighed the pipelining on the emulated
  // cluster (docs/performance.md, 2026-12-06, night).
  constexpr std::size_t smallest = std::size_t{16} << 10;
  const double bytes = static_cast<double>(params.count) * static_cast<double>(params.elem_size);
  if (!chain || params.size <= 2 || !(alpha > 0) || !(beta > 0) || bytes <= static_cast<double>(smallest)) return;
  // The chunk of the optimal k: n/k = sqrt(n·α / ((p−2)·β)).
  const double best = std::sqrt(bytes * alpha / (static_cast<double>(params.size - 2) * beta));
  if (best >= static_cast<double>(params.chunk_bytes)) return;
  params.chunk_bytes = std::max(smallest, static_cast<std::size_t>(best));
}

std::vector<std::uint32_t> deps_of(std::initializer_list<std::uint32_t> steps) {
  std::vector<std::uint32_t> out;
  for (auto s : steps)
    if (s != no_step) out.push_back(s);
  return out;
}

std::vector<std::size_t> block_offsets(const Params& params) {
  const auto p = static_cast<std::size_t>(params.size);
  std::vector<std::size_t> offsets(p + 1, 0);
  for (std::size_t b = 0; b < p; ++b) {
    const bool per_rank = params.collective == Collective::allgatherv && b < params.counts.size();
    offsets[b + 1] = offsets[b] + (per_rank ? params.counts[b] : params.count);
  }
  return offsets;
}

namespace {

std::string step_name(int rank, std::uint32_t step) {
  return "rank " + std::to_string(rank) + " step " + std::to_string(step);
}

// Structure of one rank's list: deps backwards, peers valid.
std::string check_structure(const Schedule& schedule, int rank, int size) {
  for (std::uint32_t i = 0; i < schedule.steps.size(); ++i) {
    const Step& s = schedule.steps[i];
    for (auto d : s.deps)
      if (d >= i) return step_name(rank, i) + ": dep " + std::to_string(d) + " does not point to an earlier step";
    if (s.kind == StepKind::copy) continue;
    if (s.peer < 0 || s.peer >= size || s.peer == rank)
      return step_name(rank, i) + ": invalid peer " + std::to_string(s.peer) + " (size " + std::to_string(size) + ")";
  }
  return {};
}

}  // namespace

std::string match_messages(std::span<const Schedule> schedules, std::vector<std::vector<StepRef>>& partner) {
  const int size = static_cast<int>(schedules.size());
  partner.assign(schedules.size(), {});
  // queues[(a, b)]: a's sends to b and b's receives from a, in list order.
  std::map<std::pair<int, int>, std::pair<std::vector<std::uint32_t>, std::vector<std::uint32_t>>> queues;
  for (int r = 0; r < size; ++r) {
    const Schedule& sched = schedules[static_cast<std::size_t>(r)];
    if (auto defect = check_structure(sched, r, size); !defect.empty()) return defect;
    partner[static_cast<std::size_t>(r)].assign(sched.steps.size(), StepRef{});
    for (std::uint32_t i = 0; i < sched.steps.size(); ++i) {
      const Step& s = sched.steps[i];
      if (s.kind == StepKind::send)
        queues[{r, s.peer}].first.push_back(i);
      else if (s.kind != StepKind::copy)
        queues[{s.peer, r}].second.push_back(i);
    }
  }
  for (const auto& [pair, lists] : queues) {
    const auto [a, b] = pair;
    const auto& [sends, recvs] = lists;
    if (sends.size() != recvs.size())
      return "rank " + std::to_string(a) + " sends " + std::to_string(sends.size()) + " messages to rank " +
             std::to_string(b) + ", which receives " + std::to_string(recvs.size()) + " from it";
    for (std::size_t k = 0; k < sends.size(); ++k) {
      const Step& s = schedules[static_cast<std::size_t>(a)].steps[sends[k]];
      const Step& t = schedules[static_cast<std::size_t>(b)].steps[recvs[k]];
      if (s.region.count != t.region.count)
        return step_name(a, sends[k]) + " sends " + std::to_string(s.region.count) + " elements to " +
               step_name(b, recvs[k]) + ", which receives " + std::to_string(t.region.count) + " (message #" +
               std::to_string(k) + " of the pair)";
      partner[static_cast<std::size_t>(a)][sends[k]] = StepRef{b, recvs[k]};
      partner[static_cast<std::size_t>(b)][recvs[k]] = StepRef{a, sends[k]};
    }
  }
  return {};
}

std::vector<StepRef> replay(std::span<const Schedule> schedules, const std::vector<std::vector<StepRef>>& partner,
                            const std::function<bool(StepRef)>& run) {
  enum State : std::uint8_t { blocked, ready, started, done };
  const std::size_t size = schedules.size();
  std::vector<std::vector<std::uint32_t>> pending(size);
  std::vector<std::vector<std::vector<std::uint32_t>>> dependents(size);
  std::vector<std::vector<State>> state(size);
  std::deque<StepRef> queue;
  for (std::size_t r = 0; r < size; ++r) {
    const auto& steps = schedules[r].steps;
    pending[r].assign(steps.size(), 0);
    dependents[r].assign(steps.size(), {});
    state[r].assign(steps.size(), blocked);
    for (std::uint32_t i = 0; i < steps.size(); ++i) {
      pending[r][i] = static_cast<std::uint32_t>(steps[i].deps.size());
      for (auto d : steps[i].deps) dependents[r][d].push_back(i);
      if (steps[i].deps.empty()) queue.push_back({static_cast<int>(r), i});
    }
  }
  auto complete = [&](StepRef x) {
    const auto r = static_cast<std::size_t>(x.rank);
    state[r][x.step] = done;
    for (auto d : dependents[r][x.step])
      if (--pending[r][d] == 0) queue.push_back({x.rank, d});
  };
  bool stop = false;
  while (!queue.empty() && !stop) {
    const StepRef x = queue.front();
    queue.pop_front();
    const auto r = static_cast<std::size_t>(x.rank);
    const Step& s = schedules[r].steps[x.step];
    const StepRef other = partner[r][x.step];
    state[r][x.step] = ready;
    if (s.kind == StepKind::copy) {
      stop = !run(x);
      complete(x);
    } else if (s.kind == StepKind::send) {
      stop = !run(x);
      state[r][x.step] = started;
      // A receive that was only waiting for this send can run now.
      if (state[static_cast<std::size_t>(other.rank)][other.step] == ready) queue.push_back(other);
    } else if (state[static_cast<std::size_t>(other.rank)][other.step] == started) {
      stop = !run(x);
      complete(x);
      complete(other);
    }
  }
  std::vector<StepRef> stuck;
  for (std::size_t r = 0; r < size; ++r)
    for (std::uint32_t i = 0; i < state[r].size(); ++i)
      if (state[r][i] != done) stuck.push_back({static_cast<int>(r), i});
  return stuck;
}

}  // namespace tutti::schedule
