// The checker's simulation: a sequential discrete run of all ranks of one call.
//
// Every element holds a sorted multiset of contributions (rank, index): rank q's input element i
// starts as {q:i}; a copy or receive replaces, a recv_reduce merges. At the end each output
// element must hold exactly what the collective promises, so a lost, misplaced or doubly counted
// contribution is caught, as is data read before anything wrote it ("poison"). In-place calls
// alias the buffers for real, so a schedule that reads an input element after writing the
// aliased output element computes a wrong value here too.
#include <algorithm>
#include <iterator>

#include "schedule/check_call.hpp"

namespace tutti::schedule::checker {

namespace {

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

}  // namespace

std::string simulate(Call& call) {
  init_memory(call);
  if (auto d = execute(call); !d.empty()) return d;
  return verify(call);
}

}  // namespace tutti::schedule::checker
