// The α-β-γ cost of a whole call: the critical path through all ranks' schedules. For every
// step the simulation keeps the latest path that reaches its end; a path's counts (messages,
// bytes, reduced elements) are what its time is made of.
//
// Each rank has one outgoing and one incoming port, each carrying one message at a time: without
// them a pipelined schedule's chunks would all travel at once and its critical path would hold
// one chunk instead of the whole volume a link carries. A message costs α + β·bytes from the
// start of its send to its arrival when the ports are free, as schedule.hpp says.
#include <algorithm>
#include <queue>
#include <string>

#include "schedule/algorithms.hpp"

namespace tutti::schedule {

namespace {

// A path's counts and its time; `time` is what paths are compared by, and of paths that take as
// long, the one with more messages across hosts is the critical one (Cost::rounds_across).
struct Path {
  double rounds = 0, bytes = 0, elements = 0, time = 0, rounds_across = 0;
};

const Path& later(const Path& a, const Path& b) {
  return b.time > a.time || (b.time == a.time && b.rounds_across > a.rounds_across) ? b : a;
}

struct Model {
  std::size_t elem_size;
  double alpha, beta, gamma;
  Hosts hosts;
  Path copy(Path p, std::size_t count) const { return transmit(p, count, false); }
  // A message's time on the wire (β·bytes), then its latency (α); `across` hosts or within one.
  Path transmit(Path p, std::size_t count, bool across) const {
    const double bytes = static_cast<double>(count * elem_size);
    p.bytes += bytes;
    p.time += (across ? hosts.beta : beta) * bytes;
    return p;
  }
  Path latency(Path p, bool across) const {
    p.rounds += 1;
    p.rounds_across += across ? 1 : 0;
    p.time += across ? hosts.alpha : alpha;
    return p;
  }
  int host(int rank) const { return hosts.ranks_per_host > 0 ? rank / hosts.ranks_per_host : 0; }
  Path reduction(Path p, std::size_t count) const {
    p.elements += static_cast<double>(count);
    p.time += gamma * static_cast<double>(count);
    return p;
  }
};

// Discrete-event simulation in time order. Steps become ready when their deps complete; a send
// then puts its message on the wire as soon as the sender's outgoing and the receiver's incoming
// port are free (first come, first served), occupies both for β·bytes, and arrives α later.
class Simulation {
 public:
  Simulation(std::span<const Schedule> schedules, const Model& model) : schedules_(schedules), model_(model) {
    if (auto defect = match_messages(schedules, partner_); !defect.empty())
      throw Error(ErrorCode::invalid_argument, "schedule estimate: " + defect);
    const std::size_t p = schedules.size();
    out_free_.resize(p);
    in_free_.resize(p);
    const std::size_t host_count = static_cast<std::size_t>(model.host(static_cast<int>(p) - 1)) + 1;
    host_out_free_.resize(host_count);
    host_in_free_.resize(host_count);
    for (std::size_t r = 0; r < p; ++r) {
      const auto& steps = schedules[r].steps;
      state_.emplace_back(steps.size());
      for (std::uint32_t i = 0; i < steps.size(); ++i) {
        state_[r][i].pending = static_cast<std::uint32_t>(steps[i].deps.size());
        for (auto d : steps[i].deps) state_[r][d].dependents.push_back(i);
        if (steps[i].deps.empty()) push(Path{}, {static_cast<int>(r), i});
      }
    }
  }

  Path run() {
    while (!queue_.empty()) {
      const Event e = queue_.top();
      queue_.pop();
      start(e.ref, e.ready);
    }
    for (std::size_t r = 0; r < state_.size(); ++r)
      for (std::uint32_t i = 0; i < state_[r].size(); ++i)
        if (!state_[r][i].done)
          throw Error(ErrorCode::invalid_argument,
                      "schedule estimate: deadlock at rank " + std::to_string(r) + " step " + std::to_string(i));
    return last_;
  }

 private:
  struct StepState {
    std::uint32_t pending = 0;
    std::vector<std::uint32_t> dependents;
    Path ready, end, arrival;  // arrival: a send's message at its receiver
    bool waiting = false, sent = false, done = false;
  };
  struct Event {
    Path ready;
    std::uint64_t order;
    StepRef ref;
    bool operator<(const Event& o) const {  // earliest first in a max-heap
      return ready.time != o.ready.time ? ready.time > o.ready.time : order > o.order;
    }
  };

  StepState& at(StepRef x) { return state_[static_cast<std::size_t>(x.rank)][x.step]; }
  const Step& step(StepRef x) const { return schedules_[static_cast<std::size_t>(x.rank)].steps[x.step]; }
  void push(const Path& ready, StepRef x) { queue_.push(Event{ready, order_++, x}); }

  void complete(StepRef x, const Path& end) {
    StepState& s = at(x);
    s.end = end;
    s.done = true;
    last_ = later(last_, end);
    for (auto d : s.dependents) {
      StepState& t = state_[static_cast<std::size_t>(x.rank)][d];
      t.ready = later(t.ready, end);
      if (--t.pending == 0) push(t.ready, {x.rank, d});
    }
  }

  void receive(StepRef recv, StepRef send) {
    const Step& s = step(recv);
    Path end = later(at(recv).ready, at(send).arrival);
    if (s.kind == StepKind::recv_reduce) end = model_.reduction(end, s.region.count);
    complete(recv, end);
    complete(send, end);  // a send completes with its receive
  }

  void start(StepRef x, const Path& ready) {
    const Step& s = step(x);
    StepState& st = at(x);
    st.ready = ready;
    const StepRef other = partner_[static_cast<std::size_t>(x.rank)][x.step];
    if (s.kind == StepKind::copy) return complete(x, model_.copy(ready, s.region.count));
    if (s.kind != StepKind::send) {
      if (at(other).sent) return receive(x, other);
      st.waiting = true;
      return;
    }
    Path& out = out_free_[static_cast<std::size_t>(x.rank)];
    Path& in = in_free_[static_cast<std::size_t>(other.rank)];
    const int from = model_.host(x.rank), to = model_.host(other.rank);
    const bool across = from != to;
    Path start = later(later(ready, out), in);
    if (across)
      start = later(later(start, host_out_free_[static_cast<std::size_t>(from)]),
                    host_in_free_[static_cast<std::size_t>(to)]);
    const Path wire = model_.transmit(start, s.region.count, across);
    out = in = wire;
    if (across) host_out_free_[static_cast<std::size_t>(from)] = host_in_free_[static_cast<std::size_t>(to)] = wire;
    st.arrival = model_.latency(wire, across);
    st.sent = true;
    if (at(other).waiting) receive(other, x);
  }

  std::span<const Schedule> schedules_;
  const Model& model_;
  std::vector<std::vector<StepRef>> partner_;
  std::vector<std::vector<StepState>> state_;
  std::vector<Path> out_free_, in_free_;
  std::vector<Path> host_out_free_, host_in_free_;  // the hosts' links (one host without Hosts)
  std::priority_queue<Event> queue_;
  std::uint64_t order_ = 0;
  Path last_;
};

}  // namespace

Cost estimate(std::span<const Schedule> schedules, std::size_t elem_size, double alpha, double beta, double gamma) {
  return estimate(schedules, elem_size, alpha, beta, gamma, Hosts{});
}

Cost estimate(std::span<const Schedule> schedules, std::size_t elem_size, double alpha, double beta, double gamma,
              const Hosts& hosts) {
  if (hosts.ranks_per_host < 0) throw Error(ErrorCode::invalid_argument, "schedule estimate: ranks_per_host < 0");
  const Model model{elem_size, alpha, beta, gamma, hosts};
  const Path path = Simulation(schedules, model).run();
  Cost cost{path.rounds, path.bytes, path.elements, path.time};
  cost.rounds_across = path.rounds_across;
  for (std::size_t r = 0; r < schedules.size(); ++r) {
    double out = 0, in = 0, out_across = 0, in_across = 0;
    for (const Step& step : schedules[r].steps) {
      if (step.kind == StepKind::copy) continue;
      const bool across = model.host(static_cast<int>(r)) != model.host(step.peer);
      const double message = model.latency(model.transmit(Path{}, step.region.count, across), across).time;
      if (step.kind == StepKind::send) {
        out += message;
        out_across += across ? 1 : 0;
      } else {
        in += message + (step.kind == StepKind::recv_reduce ? model.reduction(Path{}, step.region.count).time : 0);
        in_across += across ? 1 : 0;
      }
    }
    cost.busiest = std::max({cost.busiest, out, in});
    cost.busiest_across = std::max({cost.busiest_across, out_across, in_across});
  }
  return cost;
}

Cost estimate(Algorithm algorithm, Params params, double alpha, double beta, double gamma, const Hosts& hosts) {
  std::vector<Schedule> schedules;
  // alltoallv from one rank's view: every rank sends counts[q] to rank q, so receives counts[r].
  std::vector<std::size_t> recv_counts(static_cast<std::size_t>(params.size));
  for (int r = 0; r < params.size; ++r) {
    Params p = params;
    p.rank = r;
    if (params.collective == Collective::alltoallv && params.counts.size() == recv_counts.size()) {
      recv_counts.assign(recv_counts.size(), params.counts[static_cast<std::size_t>(r)]);
      p.recv_counts = recv_counts;
    }
    schedules.push_back(make(algorithm, p));
  }
  return estimate(schedules, params.elem_size, alpha, beta, gamma, hosts);
}

}  // namespace tutti::schedule
