// The schedule checker: sets up one call (each rank's buffer sizes per schedule.hpp's layout and,
// in place, its real aliasing), matches the messages, then runs the static checks
// (check_regions.cpp) and the simulation that checks results (check_simulation.cpp).
#include <numeric>

#include "core/names.hpp"
#include "schedule/check.hpp"
#include "schedule/check_call.hpp"

namespace tutti::schedule {

namespace checker {

std::string describe(const Region& r) {
  return std::string(kBufferNames[index_of(r.buffer)]) + "[" + std::to_string(r.offset) + ", +" +
         std::to_string(r.count) + ")";
}

std::string describe(const Step& s) {
  switch (s.kind) {
    case StepKind::send:
      return "send " + describe(s.region) + " to " + std::to_string(s.peer);
    case StepKind::recv:
      return "recv " + describe(s.region) + " from " + std::to_string(s.peer);
    case StepKind::recv_reduce:
      return "recv_reduce " + describe(s.region) + " = " + describe(s.operand) + " + data from " +
             std::to_string(s.peer);
    case StepKind::copy:
      return "copy " + describe(s.region) + " <- " + describe(s.operand);
  }
  return "?";
}

std::string where(int rank, std::uint32_t step, const Step& s) {
  return "rank " + std::to_string(rank) + " step " + std::to_string(step) + " (" + describe(s) + ")";
}

}  // namespace checker

using namespace checker;

namespace {

std::size_t sum(const std::vector<std::size_t>& v) { return std::accumulate(v.begin(), v.end(), std::size_t{0}); }

void set_alias(RankView& v, Buffer from, Buffer into, std::size_t offset) {
  v.aliased = true;
  v.alias_from = from;
  v.alias_into = into;
  v.alias_offset = offset;
}

// Buffer sizes per schedule.hpp's layout table.
void lay_out(const Call& call, int r, RankView& v) {
  const std::size_t c = call.params.count, p = static_cast<std::size_t>(call.p), ur = static_cast<std::size_t>(r);
  const bool root = r == call.params.root;
  const auto offsets = block_offsets(v.params);
  std::size_t in = 0, out = 0;
  switch (call.params.collective) {
    case Collective::allreduce:
      in = out = c;
      break;
    case Collective::reduce:
      in = c, out = root ? c : 0;
      break;
    case Collective::reduce_scatter:
      in = p * c, out = c;
      break;
    case Collective::allgather:
    case Collective::allgatherv:
      in = offsets[ur + 1] - offsets[ur], out = offsets[p];
      break;
    case Collective::broadcast:
      out = c;
      break;
    case Collective::alltoall:
      in = out = p * c;
      break;
    case Collective::alltoallv:
      in = sum(v.send_counts), out = sum(v.recv_counts);
      break;
    case Collective::gather:
      in = c, out = root ? p * c : 0;
      break;
    case Collective::scatter:
      in = root ? p * c : 0, out = c;
      break;
    case Collective::barrier:
      break;
  }
  v.size = {in, out, call.schedules[ur].scratch_count};
}

// The aliasing schedule.hpp's in-place rules prescribe.
void alias_in_place(const Call& call, int r, RankView& v) {
  const std::size_t c = call.params.count, ur = static_cast<std::size_t>(r);
  const bool root = r == call.params.root;
  switch (call.params.collective) {
    case Collective::allreduce:
      return set_alias(v, Buffer::input, Buffer::output, 0);
    case Collective::reduce:
      return root ? set_alias(v, Buffer::input, Buffer::output, 0) : void();
    case Collective::reduce_scatter:
      return set_alias(v, Buffer::output, Buffer::input, ur * c);
    case Collective::allgather:
    case Collective::allgatherv:
      return set_alias(v, Buffer::input, Buffer::output, block_offsets(v.params)[ur]);
    case Collective::gather:
      return root ? set_alias(v, Buffer::input, Buffer::output, ur * c) : void();
    case Collective::scatter:
      return root ? set_alias(v, Buffer::output, Buffer::input, ur * c) : void();
    default:
      return;  // broadcast has one buffer; alltoall(v) snapshots its input; barrier has none
  }
}

std::string validate_params(Call& call) {
  const Params& prm = call.params;
  const auto p = static_cast<std::size_t>(prm.size);
  if (prm.size < 1) return "invalid size " + std::to_string(prm.size);
  if (core::has_root(prm.collective) && (prm.root < 0 || prm.root >= prm.size))
    return "invalid root " + std::to_string(prm.root);
  if (prm.collective == Collective::allgatherv && prm.counts.size() != p) return "allgatherv needs one count per rank";
  if (prm.collective != Collective::alltoallv) return {};
  const auto& m = call.options.alltoallv_counts;
  if (m.empty() && prm.counts.size() != p) return "alltoallv needs counts (one per rank) or a p×p matrix";
  if (!m.empty() && m.size() != p * p) return "alltoallv matrix needs p×p entries";
  call.matrix.assign(p, std::vector<std::size_t>(p));
  for (std::size_t a = 0; a < p; ++a)
    for (std::size_t b = 0; b < p; ++b) call.matrix[a][b] = m.empty() ? prm.counts[b] : m[a * p + b];
  return {};
}

// Per-rank parameters (rank, and alltoallv's per-rank counts), also kept in the rank views.
std::vector<Params> rank_params(Call& call) {
  std::vector<Params> out;
  call.ranks.assign(static_cast<std::size_t>(call.p), RankView{});
  for (int r = 0; r < call.p; ++r) {
    RankView& v = call.ranks[static_cast<std::size_t>(r)];
    v.params = call.params;
    v.params.rank = r;
    if (call.params.collective == Collective::alltoallv) {
      for (int q = 0; q < call.p; ++q) {
        v.send_counts.push_back(call.matrix[static_cast<std::size_t>(r)][static_cast<std::size_t>(q)]);
        v.recv_counts.push_back(call.matrix[static_cast<std::size_t>(q)][static_cast<std::size_t>(r)]);
      }
      v.params.counts = v.send_counts;  // call.ranks is not resized again: the spans stay valid
      v.params.recv_counts = v.recv_counts;
    }
    out.push_back(v.params);
  }
  return out;
}

std::string run_checks(Call& call) {
  for (int r = 0; r < call.p; ++r) {
    lay_out(call, r, call.ranks[static_cast<std::size_t>(r)]);
    if (call.options.in_place) alias_in_place(call, r, call.ranks[static_cast<std::size_t>(r)]);
  }
  if (auto d = match_messages(call.schedules, call.partner); !d.empty()) return d;
  if (auto d = check_regions(call); !d.empty()) return d;
  if (call.options.check_races)
    if (auto d = check_races(call); !d.empty()) return d;
  return simulate(call);
}

std::string with_context(const Params& params, const CheckOptions& options, const std::string& defect) {
  if (defect.empty()) return defect;
  return std::string(to_string(params.collective)) + " p=" + std::to_string(params.size) +
         " count=" + std::to_string(params.count) + (options.in_place ? " in place" : "") + ": " + defect;
}

}  // namespace

std::string check_schedules(std::span<const Schedule> schedules, const Params& params, const CheckOptions& options) {
  Call call{params, options, params.size, {}, schedules, {}, {}, {}};
  if (auto d = validate_params(call); !d.empty()) return with_context(params, options, d);
  if (schedules.size() != static_cast<std::size_t>(params.size))
    return with_context(params, options, "expected one schedule per rank");
  rank_params(call);
  return with_context(params, options, run_checks(call));
}

std::string check(Algorithm algorithm, const Params& params, const CheckOptions& options) {
  Call call{params, options, params.size, {}, {}, {}, {}, {}};
  if (auto d = validate_params(call); !d.empty()) return with_context(params, options, d);
  std::vector<Schedule> schedules;
  try {
    for (const Params& prm : rank_params(call)) schedules.push_back(make(algorithm, prm));
  } catch (const std::exception& e) {
    return with_context(params, options, std::string("generator threw: ") + e.what());
  }
  call.schedules = schedules;
  const std::string defect = with_context(params, options, run_checks(call));
  return defect.empty() ? defect : std::string(tutti::to_string(algorithm)) + " " + defect;
}

}  // namespace tutti::schedule
