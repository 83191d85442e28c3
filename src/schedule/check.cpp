// The schedule checker: a sequential discrete simulation of all ranks of one call.
//
// Every element holds a sorted multiset of contributions (rank, index): rank q's input element i
// starts as {q:i}; a copy or receive replaces, a recv_reduce merges. At the end each output
// element must hold exactly what the collective promises, so a lost, misplaced or doubly counted
// contribution is caught, as is data read before anything wrote it ("poison"). In-place calls
// alias the buffers for real, so a schedule that reads an input element after writing the
// aliased output element computes a wrong value here too. Races are found statically: two steps
// of a rank that touch overlapping memory, one writing, must be ordered by the transitive deps.
#include <algorithm>
#include <array>
#include <numeric>

#include "schedule/algorithms.hpp"
#include "schedule/check.hpp"

namespace tutti::schedule {

namespace {

using Token = std::uint64_t;
using Value = std::vector<Token>;  // sorted multiset of contributions
constexpr Token kPoison = ~Token{0};
constexpr int kIndexBits = 40;

Token token(int rank, std::size_t index) { return (static_cast<Token>(rank) << kIndexBits) | index; }

std::string describe(Token t) {
  if (t == kPoison) return "uninitialized";
  return std::to_string(t >> kIndexBits) + ":" + std::to_string(t & ((Token{1} << kIndexBits) - 1));
}

std::string describe(const Value& v) {
  std::string out = "{";
  for (std::size_t i = 0; i < v.size() && i < 12; ++i) out += (i ? " " : "") + describe(v[i]);
  return out + (v.size() > 12 ? " ...}" : "}");
}

constexpr std::array<const char*, 3> kBufferNames{"input", "output", "scratch"};
std::size_t index_of(Buffer b) { return static_cast<std::size_t>(b); }

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

bool rooted(Collective c) {
  return c == Collective::reduce || c == Collective::broadcast || c == Collective::gather || c == Collective::scatter;
}

std::string validate_params(Call& call) {
  const Params& prm = call.params;
  const auto p = static_cast<std::size_t>(prm.size);
  if (prm.size < 1) return "invalid size " + std::to_string(prm.size);
  if (rooted(prm.collective) && (prm.root < 0 || prm.root >= prm.size))
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

// Initial contents: rank q's input element i is {q:i} (the root's output for broadcast); all
// else is poison until written.
void init_memory(Call& call) {
  call.memory.assign(static_cast<std::size_t>(call.p), {});
  for (int r = 0; r < call.p; ++r) {
    const RankView& v = call.ranks[static_cast<std::size_t>(r)];
    auto& mem = call.memory[static_cast<std::size_t>(r)];
    for (std::size_t b = 0; b < 3; ++b) mem[b].assign(v.size[b], Value{kPoison});
    const bool broadcast = call.params.collective == Collective::broadcast;
    const Buffer source = broadcast ? Buffer::output : Buffer::input;
    if (broadcast && r != call.params.root) continue;
    for (std::size_t i = 0; i < v.size[index_of(source)]; ++i) {
      const Loc l = v.resolve(Region{source, i, 1});
      mem[l.mem][l.offset] = Value{token(r, i)};
    }
  }
}

std::vector<Value> read(const Call& call, int r, const Region& reg) {
  const Loc l = call.ranks[static_cast<std::size_t>(r)].resolve(reg);
  const auto& m = call.memory[static_cast<std::size_t>(r)][l.mem];
  return {m.begin() + static_cast<std::ptrdiff_t>(l.offset),
          m.begin() + static_cast<std::ptrdiff_t>(l.offset + reg.count)};
}

void write(Call& call, int r, const Region& reg, std::vector<Value> data) {
  const Loc l = call.ranks[static_cast<std::size_t>(r)].resolve(reg);
  auto& m = call.memory[static_cast<std::size_t>(r)][l.mem];
  std::move(data.begin(), data.end(), m.begin() + static_cast<std::ptrdiff_t>(l.offset));
}

// What happened-before knowledge each step has of which ranks have entered the call (barrier).
struct Knowledge {
  std::vector<std::vector<std::vector<bool>>> of;  // [rank][step][rank]
};

void learn(const Call& call, Knowledge& k, StepRef x) {
  const auto r = static_cast<std::size_t>(x.rank);
  auto& mine = k.of[r][x.step];
  mine.assign(static_cast<std::size_t>(call.p), false);
  mine[r] = true;
  auto merge = [&](const std::vector<bool>& other) {
    for (std::size_t q = 0; q < other.size(); ++q) mine[q] = mine[q] || other[q];
  };
  const Step& s = call.schedules[r].steps[x.step];
  for (auto d : s.deps) merge(k.of[r][d]);
  if (s.kind == StepKind::recv || s.kind == StepKind::recv_reduce) {
    const StepRef from = call.partner[r][x.step];
    merge(k.of[static_cast<std::size_t>(from.rank)][from.step]);
  }
}

std::string check_barrier(const Call& call, const Knowledge& k) {
  for (int r = 0; r < call.p; ++r) {
    std::vector<bool> known(static_cast<std::size_t>(call.p), false);
    known[static_cast<std::size_t>(r)] = true;
    for (const auto& step : k.of[static_cast<std::size_t>(r)])
      for (std::size_t q = 0; q < step.size(); ++q) known[q] = known[q] || step[q];
    for (int q = 0; q < call.p; ++q)
      if (!known[static_cast<std::size_t>(q)])
        return "barrier: rank " + std::to_string(r) + " may leave before rank " + std::to_string(q) + " enters";
  }
  return {};
}

// One receive: the data is the sender's snapshot from when its send started.
std::string deliver(Call& call, StepRef x, std::vector<std::vector<std::vector<Value>>>& sent) {
  const auto r = static_cast<std::size_t>(x.rank);
  const Step& s = call.schedules[r].steps[x.step];
  const StepRef from = call.partner[r][x.step];
  auto& data = sent[static_cast<std::size_t>(from.rank)][from.step];
  const Step& send = call.schedules[static_cast<std::size_t>(from.rank)].steps[from.step];
  if (read(call, from.rank, send.region) != data)
    return where(from.rank, from.step, send) + ": its region was overwritten before the send completed";
  if (s.kind == StepKind::recv_reduce) {
    auto operand = read(call, x.rank, s.operand);
    for (std::size_t i = 0; i < data.size(); ++i) {
      Value merged;
      std::merge(operand[i].begin(), operand[i].end(), data[i].begin(), data[i].end(), std::back_inserter(merged));
      data[i] = std::move(merged);
    }
  }
  write(call, x.rank, s.region, std::move(data));
  data = {};
  return {};
}

std::string describe_deadlock(const Call& call, const std::vector<StepRef>& stuck) {
  std::vector<std::vector<bool>> pending(static_cast<std::size_t>(call.p));
  for (int r = 0; r < call.p; ++r)
    pending[static_cast<std::size_t>(r)].assign(call.schedules[static_cast<std::size_t>(r)].steps.size(), false);
  for (StepRef x : stuck) pending[static_cast<std::size_t>(x.rank)][x.step] = true;
  std::string out = "deadlock: " + std::to_string(stuck.size()) + " steps never ran;";
  int shown = 0;
  for (StepRef x : stuck) {
    const auto r = static_cast<std::size_t>(x.rank);
    const Step& s = call.schedules[r].steps[x.step];
    const bool deps_done = std::none_of(s.deps.begin(), s.deps.end(), [&](auto d) { return pending[r][d]; });
    if (!deps_done || shown == 6) continue;  // only the frontier: steps blocked on a message
    const StepRef other = call.partner[r][x.step];
    out += " " + where(x.rank, x.step, s) + " waits for rank " + std::to_string(other.rank) + " step " +
           std::to_string(other.step) + ";";
    ++shown;
  }
  return out;
}

std::string execute(Call& call) {
  std::vector<std::vector<std::vector<Value>>> sent(static_cast<std::size_t>(call.p));
  Knowledge knowledge;
  for (int r = 0; r < call.p; ++r) {
    const auto n = call.schedules[static_cast<std::size_t>(r)].steps.size();
    sent[static_cast<std::size_t>(r)].resize(n);
    knowledge.of.emplace_back(n);
  }
  std::string defect;
  const bool barrier = call.params.collective == Collective::barrier;
  auto stuck = replay(call.schedules, call.partner, [&](StepRef x) {
    if (barrier) learn(call, knowledge, x);
    const Step& s = call.schedules[static_cast<std::size_t>(x.rank)].steps[x.step];
    if (s.kind == StepKind::send)
      sent[static_cast<std::size_t>(x.rank)][x.step] = read(call, x.rank, s.region);
    else if (s.kind == StepKind::copy)
      write(call, x.rank, s.region, read(call, x.rank, s.operand));
    else
      defect = deliver(call, x, sent);
    return defect.empty();
  });
  if (!defect.empty()) return defect;
  if (!stuck.empty()) return describe_deadlock(call, stuck);
  if (barrier) return check_barrier(call, knowledge);
  return {};
}

// The contributions output element j of rank r must hold.
Value expected(const Call& call, int r, std::size_t j) {
  const Params& prm = call.params;
  const std::size_t c = prm.count, ur = static_cast<std::size_t>(r);
  auto all = [&](std::size_t index) {
    Value v;
    for (int q = 0; q < call.p; ++q) v.push_back(token(q, index));
    return v;
  };
  switch (prm.collective) {
    case Collective::allreduce:
    case Collective::reduce:
      return all(j);
    case Collective::reduce_scatter:
      return all(ur * c + j);
    case Collective::allgather:
    case Collective::allgatherv:
    case Collective::gather: {
      const auto offsets = block_offsets(call.ranks[ur].params);
      const auto q =
          static_cast<std::size_t>(std::upper_bound(offsets.begin(), offsets.end(), j) - offsets.begin() - 1);
      return {token(static_cast<int>(q), j - offsets[q])};
    }
    case Collective::broadcast:
      return {token(prm.root, j)};
    case Collective::alltoall:
      return {token(static_cast<int>(j / c), ur * c + j % c)};
    case Collective::scatter:
      return {token(prm.root, ur * c + j)};
    case Collective::alltoallv: {
      std::size_t q = 0, begin = 0;
      while (j >= begin + call.matrix[q][ur]) begin += call.matrix[q++][ur];
      std::size_t sent_before = 0;  // what q sends to ranks below r comes first in q's input
      for (std::size_t b = 0; b < ur; ++b) sent_before += call.matrix[q][b];
      return {token(static_cast<int>(q), sent_before + j - begin)};
    }
    case Collective::barrier:
      break;
  }
  return {};
}

std::string verify(const Call& call) {
  for (int r = 0; r < call.p; ++r) {
    const RankView& v = call.ranks[static_cast<std::size_t>(r)];
    const auto out = read(call, r, Region{Buffer::output, 0, v.size[index_of(Buffer::output)]});
    for (std::size_t j = 0; j < out.size(); ++j) {
      const Value want = expected(call, r, j);
      if (out[j] == want) continue;
      Value missing, extra;
      std::set_difference(want.begin(), want.end(), out[j].begin(), out[j].end(), std::back_inserter(missing));
      std::set_difference(out[j].begin(), out[j].end(), want.begin(), want.end(), std::back_inserter(extra));
      return "rank " + std::to_string(r) + " output[" + std::to_string(j) + "] holds " + describe(out[j]) +
             ", expected " + describe(want) + " (missing " + describe(missing) + ", extra " + describe(extra) +
             "; a:i is rank a's element i)";
    }
  }
  return {};
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
  init_memory(call);
  if (auto d = execute(call); !d.empty()) return d;
  return verify(call);
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
