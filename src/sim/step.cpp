// The training-step simulation (tutti::sim::simulate). Time is simulated seconds; nothing sleeps.
//
// Ranks that compute at the same speed behave alike, so they are simulated as one class: the
// ordinary ranks, and each straggler on its own. The engine's negotiation is a collective, which
// keeps every rank's engine in step: a round starts when the last rank's engine joins it. Each
// rank's engine joins at its own wake-up, which follows the engine's loop (engine_cycle.cpp run()):
// a cycle after its previous wake-up, kIdleCycles cycles when nothing was pending anywhere, at
// once when a caller waits in step() (Handle::wait rings) or when it enqueues into an idle engine
// or while another rank waits. A round costs what the engine's costs: the allreduce of the
// response cache's counts (engine::Tally), plus the full exchange's allgather where some class has
// something uncached to announce. What it decides is the engine's own Table's decision on the
// classes' Ledgers (the engine's own bookkeeping, one per class), and the calls it makes are the
// engine's own plan_fusion, run one after the other, each as long as CollectiveTimes says.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "engine/negotiation.hpp"
#include "engine/timeline.hpp"
#include "sim/collective_time.hpp"
#include "tutti/sim.hpp"

namespace tutti::sim {

namespace {

using engine::Descriptor;
using engine::Message;
using engine::Table;
using Clock = std::chrono::steady_clock;
constexpr double never = std::numeric_limits<double>::infinity();

Clock::time_point at(double seconds) {
  return Clock::time_point(std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds)));
}

// Ranks that compute alike, and where their current step stands.
struct Class {
  int representative = 0;  // lowest rank
  int ranks = 0;
  double factor = 1;
  double step_factor = 1;  // this step's: factor times the jitter's draw
  int step = 0;            // current step; == steps when done
  double forward_end = 0, backward_end = 0;
  std::vector<double> enqueue;  // per gradient, this step
  std::size_t announced = 0;    // gradients announced this step (in enqueue order)
  std::size_t completed = 0;
  double last_completion = 0;
  double wake = 0;  // this class's engine's last wake-up
  bool peer_waiting = false;
  std::vector<double> step_starts;  // per step
  double waited = 0;                // in step(), over the measured steps
  std::unique_ptr<engine::Timeline> timeline;

  bool done(int steps) const { return step >= steps; }
  bool unfinished(std::size_t gradients) const { return completed < gradients; }
};

class StepSimulation {
 public:
  explicit StepSimulation(const SimulationSetup& s)
      : s_(s),
        jitter_(s.jitter < 0 ? s.profile.jitter : s.jitter),
        random_(s.seed),
        times_(s.network, s.ranks, s.ranks_per_host),
        table_(0) {
    make_classes();
    table_ = Table(static_cast<int>(classes_.size()));
    ledgers_.resize(classes_.size());
    for (const auto& g : s_.profile.gradients) {
      Descriptor d;
      d.name = g.name;
      d.kind = Collective::allreduce;
      d.type = s_.policy.fp16 && g.type == DataType::f32 ? DataType::f16 : g.type;
      d.op = ReduceOp::avg;
      d.count = g.count;
      descriptors_.push_back(d);
    }
    for (auto& c : classes_) begin_step(c, 0);
  }

  SimulationResult run() {
    while (std::any_of(classes_.begin(), classes_.end(), [&](const Class& c) { return !c.done(s_.steps); })) cycle();
    return result();
  }

 private:
  void make_classes() {
    const auto& st = s_.stragglers;
    for (std::size_t i = 0; i < st.size(); ++i) {
      const auto& x = st[i];
      if (x.rank < 0 || x.rank >= s_.ranks)
        throw Error(ErrorCode::invalid_argument, "simulate: straggler rank " + std::to_string(x.rank) +
                                                     " is outside the job of " + std::to_string(s_.ranks) + " ranks");
      if (!(x.factor >= 1)) throw Error(ErrorCode::invalid_argument, "simulate: a straggler's factor must be >= 1");
      if (std::any_of(st.begin(), st.begin() + static_cast<std::ptrdiff_t>(i),
                      [&](const Straggler& y) { return y.rank == x.rank; }))
        throw Error(ErrorCode::invalid_argument, "simulate: straggler rank " + std::to_string(x.rank) + " given twice");
    }
    if (jitter_ > 0) {  // every rank draws its own factors: each is a class
      if (s_.ranks > kMaxJitterRanks)
        throw Error(ErrorCode::invalid_argument, "simulate: jitter simulates every rank on its own, at most " +
                                                     std::to_string(kMaxJitterRanks) + " ranks");
      for (int r = 0; r < s_.ranks; ++r) {
        Class c;
        c.representative = r;
        c.ranks = 1;
        for (const auto& x : st)
          if (x.rank == r) c.factor = x.factor;
        classes_.push_back(std::move(c));
      }
      open_timelines();
      return;
    }
    Class ordinary;
    ordinary.ranks = s_.ranks;
    ordinary.representative = -1;
    for (int r = 0; r < s_.ranks && ordinary.representative < 0; ++r)
      if (std::none_of(st.begin(), st.end(), [&](const Straggler& x) { return x.rank == r; }))
        ordinary.representative = r;
    for (const auto& x : st) {
      Class c;
      c.representative = x.rank;
      c.ranks = 1;
      c.factor = x.factor;
      classes_.push_back(std::move(c));
      --ordinary.ranks;
    }
    if (ordinary.ranks > 0) classes_.insert(classes_.begin(), std::move(ordinary));
    std::sort(classes_.begin(), classes_.end(),
              [](const Class& a, const Class& b) { return a.representative < b.representative; });
    open_timelines();
  }

  void open_timelines() {
    for (auto& c : classes_)
      if (const auto file = engine::timeline_file_for(s_.timeline_path, c.representative); !file.empty())
        c.timeline = std::make_unique<engine::Timeline>(file, c.representative);
  }

  void begin_step(Class& c, double start) {
    c.step_starts.push_back(start);
    if (c.done(s_.steps)) return;
    const auto& p = s_.profile;
    c.step_factor = c.factor * draw();
    const double f = c.step_factor;
    auto& slowest = step_compute_[static_cast<std::size_t>(c.step)];
    slowest = std::max(slowest, p.compute_seconds() * f);
    c.forward_end = start + p.forward_seconds * f;
    c.enqueue.assign(p.gradients.size(), 0);
    double t = c.forward_end;
    for (std::size_t g = 0; g < p.gradients.size(); ++g) {
      t += p.gradients[g].backward_seconds * f;
      c.enqueue[g] = t;
    }
    c.backward_end = t + p.backward_tail_seconds * f;
    if (!s_.policy.overlap) std::fill(c.enqueue.begin(), c.enqueue.end(), c.backward_end);
    c.announced = c.completed = 0;
    if (c.timeline) {
      c.timeline->event("step", "FORWARD", at(start), at(c.forward_end));
      c.timeline->event("step", "BACKWARD", at(c.forward_end), at(c.backward_end));
    }
  }

  // When this class's engine joins the next round, the previous one having ended at `free`.
  double wake_of(const Class& c, double free) const {
    if (c.done(s_.steps)) return free;
    const std::size_t n = descriptors_.size();
    const double timer =
        c.wake + std::chrono::duration<double>(s_.policy.cycle_time).count() * (idle_ ? engine::kIdleCycles : 1);
    double ring = never;
    if (c.unfinished(n)) ring = c.backward_end;  // step() waits, which rings
    if ((idle_ || c.peer_waiting) && c.announced < n) ring = std::min(ring, c.enqueue[c.announced]);
    return std::max(free, std::min(timer, ring));
  }

  void cycle() {
    const std::size_t n = descriptors_.size();
    double start = 0;
    for (auto& c : classes_) {
      c.wake = wake_of(c, free_);
      start = std::max(start, c.wake);
    }
    std::vector<Message> mine(classes_.size());
    std::vector<bool> waits(classes_.size(), false);
    std::vector<std::vector<std::size_t>> announced(classes_.size());
    int waiting_ranks = 0;
    // Every class's part of the round's allreduce, summed as the engine's allreduce sums them.
    std::vector<std::uint32_t> sums(engine::Tally::kHeader + table_.cache_size(), 0);
    for (std::size_t i = 0; i < classes_.size(); ++i) {
      Class& c = classes_[i];
      auto& ledger = ledgers_[i];
      if (c.done(s_.steps)) {
        mine[i].waiting = true;  // a finished rank sits in its engine's destructor: always there
      } else {
        mine[i].waiting = c.unfinished(n) && c.wake >= c.backward_end;
        waits[i] = mine[i].waiting;
        if (mine[i].waiting) waiting_ranks += c.ranks;
        while (c.announced < n && c.enqueue[c.announced] <= c.wake) {
          ledger.enqueue(descriptors_[c.announced], table_, Clock::time_point{});
          announced[i].push_back(c.announced++);
        }
      }
      const auto part = ledger.contribution(table_, ledger.needs_exchange(Clock::time_point::min()), mine[i].waiting);
      for (std::size_t k = 0; k < sums.size(); ++k) sums[k] += part[k];
    }
    const auto tally = table_.tally(sums);
    double round = times_.negotiation(sums.size()).seconds;
    std::vector<Message> messages;
    if (tally.exchange > 0) {  // the full exchange: the allgather of 512-byte slots (plus allgatherv)
      std::size_t longest = 0;
      for (std::size_t i = 0; i < classes_.size(); ++i) {
        ledgers_[i].announce(tally, table_, mine[i]);
        longest = std::max(longest, mine[i].encode(table_.cache_size()).size());
      }
      messages = std::move(mine);
      round += times_.allgather(engine::kSlot).seconds;
      if (longest > engine::kSlotPayload) round += times_.allgather(longest - engine::kSlotPayload).seconds;
    }
    const double decided = start + round;
    const auto decision = table_.apply(tally, messages, Clock::time_point{});
    for (auto& ledger : ledgers_) ledger.settle(tally, !messages.empty(), classes_.size());
    add_if_measured(start, decided, negotiation_);
    if (start >= window_start_) ++cycles_;
    for (std::size_t i = 0; i < classes_.size(); ++i)
      if (classes_[i].timeline)
        for (std::size_t g : announced[i])
          classes_[i].timeline->event(descriptors_[g].name, "NEGOTIATE", at(classes_[i].enqueue[g]), at(decided));
    free_ = run_calls(decision.ready, decided);
    bool unannounced = false;
    for (auto& c : classes_) {
      c.peer_waiting = waiting_ranks > (waits[static_cast<std::size_t>(&c - classes_.data())] ? 1 : 0);
      if (!c.done(s_.steps) && c.announced < n && c.enqueue[c.announced] <= free_) unannounced = true;
    }
    idle_ = table_.idle() && !unannounced &&
            std::all_of(ledgers_.begin(), ledgers_.end(), [](const engine::Ledger& l) { return l.empty(); });
    for (auto& c : classes_) finish_step_if_complete(c);
  }

  // Runs the decided calls from `t` one after the other; returns when the last ends.
  double run_calls(const std::vector<Descriptor>& ready, double t) {
    if (ready.empty()) {
      if (table_.idle()) step_start_ = true;
      return t;
    }
    const auto jobs = engine::plan_fusion(ready, s_.policy.fusion_threshold, s_.policy.first_bucket_bytes, step_start_);
    step_start_ = false;
    for (const auto& members : jobs) {
      std::size_t count = 0, bytes = 0;
      for (std::size_t i : members) {
        count += ready[i].count;
        bytes += ready[i].count * size_of(ready[i].type);
      }
      const double copy = members.size() > 1 ? s_.network.copy_beta * static_cast<double>(bytes) : 0;
      const auto& call = times_.allreduce(count, ready[members[0]].type);
      const double reduce_start = t + copy, reduce_end = reduce_start + call.seconds, end = reduce_end + copy;
      if (reduce_start >= window_start_) {
        ++collectives_;
        bytes_ += static_cast<double>(bytes);
      }
      add_if_measured(reduce_start, reduce_end, allreduce_);
      note_algorithm(bytes, call.how);
      const std::string args =
          "\"bytes\": " + std::to_string(bytes) + ", \"tensors\": " + std::to_string(members.size());
      for (std::size_t i : members) {
        for (auto& c : classes_) {
          if (c.timeline) {
            c.timeline->event(ready[i].name, "QUEUE", at(t), at(t));
            if (copy > 0) c.timeline->event(ready[i].name, "MEMCPY_IN_FUSION_BUFFER", at(t), at(reduce_start));
            c.timeline->event(ready[i].name, "ALLREDUCE", at(reduce_start), at(reduce_end), args);
            if (copy > 0) c.timeline->event(ready[i].name, "MEMCPY_OUT_FUSION_BUFFER", at(reduce_end), at(end));
          }
          ++c.completed;
          c.last_completion = end;
        }
      }
      t = end;
    }
    return t;
  }

  void finish_step_if_complete(Class& c) {
    if (c.done(s_.steps) || c.unfinished(descriptors_.size())) return;
    const double optimizer_start = std::max(c.last_completion, c.backward_end);
    const double end = optimizer_start + s_.profile.optimizer_seconds * c.step_factor;
    if (c.timeline) c.timeline->event("step", "OPTIMIZER", at(optimizer_start), at(end));
    if (c.step >= 1) c.waited += optimizer_start - c.backward_end;
    ++c.step;
    if (c.step == 1 && window_start_ == never) window_start_ = end;  // steps after the first are measured
    begin_step(c, end);
  }

  // A log-normal factor of mean 1 and standard deviation jitter_ (1 without jitter).
  double draw() {
    if (jitter_ <= 0) return 1;
    const double sigma2 = std::log1p(jitter_ * jitter_);
    std::normal_distribution<double> normal(-sigma2 / 2, std::sqrt(sigma2));
    return std::exp(normal(random_));
  }

  void add_if_measured(double start, double end, double& total) const {
    if (start >= window_start_) total += end - start;
  }

  void note_algorithm(std::size_t bytes, const std::string& how) {
    char size[32];
    std::snprintf(size, sizeof size, "%.3g MB", static_cast<double>(bytes) / 1e6);
    const std::string line = std::string(size) + ": " + how;
    if (std::find(algorithms_.begin(), algorithms_.end(), line) == algorithms_.end()) algorithms_.push_back(line);
  }

  SimulationResult result() const {
    const Class* slowest = &classes_.front();
    const Class* fastest = &classes_.front();
    for (const auto& c : classes_) {
      if (c.factor > slowest->factor) slowest = &c;
      if (c.factor < fastest->factor) fastest = &c;
    }
    const double measured = std::max(1, s_.steps - 1);
    SimulationResult r;
    const auto& starts = slowest->step_starts;  // steps + 1 entries: each step's start, then the end
    r.step_seconds = s_.steps > 1 ? (starts.back() - starts[1]) / measured : starts.back() - starts.front();
    double compute = 0;  // per measured step, the slowest rank's
    for (int k = s_.steps > 1 ? 1 : 0; k < s_.steps; ++k) compute += step_compute_[static_cast<std::size_t>(k)];
    r.compute_seconds = compute / measured;
    r.exposed_seconds = std::max(0.0, r.step_seconds - r.compute_seconds);
    r.allreduce_seconds = allreduce_ / measured;
    r.negotiation_seconds = negotiation_ / measured;
    const double communication = r.allreduce_seconds + r.negotiation_seconds;
    r.hidden_fraction = communication > 0 ? std::clamp(1.0 - r.exposed_seconds / communication, 0.0, 1.0) : 1.0;
    r.collectives = static_cast<double>(collectives_) / measured;
    r.cycles = static_cast<double>(cycles_) / measured;
    r.bytes = bytes_ / measured;
    r.wait_seconds = fastest->waited / measured;
    r.algorithms = algorithms_;
    return r;
  }

  static constexpr int kMaxJitterRanks = 4096;
  const SimulationSetup& s_;
  double jitter_;
  std::mt19937_64 random_;
  CollectiveTimes times_;
  Table table_;
  std::vector<engine::Ledger> ledgers_;  // per class
  std::vector<Descriptor> descriptors_;
  std::vector<Class> classes_;
  double free_ = 0;  // when the engines' previous round and its calls ended
  bool idle_ = true;
  bool step_start_ = true;
  double window_start_ = never;
  double allreduce_ = 0, negotiation_ = 0, bytes_ = 0;
  std::size_t collectives_ = 0, cycles_ = 0;  // measured steps' calls and rounds
  std::vector<std::string> algorithms_;
  std::vector<double> step_compute_ = std::vector<double>(static_cast<std::size_t>(s_.steps), 0.0);
};

}  // namespace

SimulationResult simulate(const SimulationSetup& setup) {
  if (setup.ranks < 1) throw Error(ErrorCode::invalid_argument, "simulate: ranks must be >= 1");
  if (setup.ranks_per_host < 1 || setup.ranks % setup.ranks_per_host != 0)
    throw Error(ErrorCode::invalid_argument, "simulate: ranks per host (" + std::to_string(setup.ranks_per_host) +
                                                 ") must divide the ranks (" + std::to_string(setup.ranks) + ")");
  if (setup.steps < 1) throw Error(ErrorCode::invalid_argument, "simulate: steps must be >= 1");
  if (setup.profile.gradients.empty())
    throw Error(ErrorCode::invalid_argument, "simulate: the profile has no gradients");
  return StepSimulation(setup).run();
}

}  // namespace tutti::sim
