// Predicted times. Schedule algorithms are simulated (schedule::estimate over every rank's
// schedule), so pipelining, uneven blocks and non-powers of two count as they run. A native
// algorithm (shared memory's `direct`) has no schedule: the transport that runs it prices it.
#include "comm/cost_model.hpp"

#include <algorithm>
#include <cmath>
#include <string>

#include "exec/operation.hpp"

namespace tutti::comm::choice {

namespace {

// The model's element: f32. The choice depends on bytes, not on the type.
constexpr std::size_t elem_size = 4;
// Predictions closer than this (relative) are a tie, which the earlier candidate wins: where two
// algorithms are alike (p = 2, where ring and tree broadcast are the same message), rounding
// must not flip the choice from one size class to the next.
constexpr double tie_margin = 1e-3;
// Candidates whose one call is predicted within this (relative) of the fastest are compared by
// their busiest port instead: on a 1 Gbit/s link the chain and the tree of a 32 KiB reduce take
// about as long once, but the chain's root receives the buffer once, the tree's twice.
// Only a busiest port at most this fraction of the other's counts: smaller differences (a few
// messages' α in a large call) are not worth leaving the fastest single call for.
constexpr double stream_margin = 0.05, stream_gain = 0.75;
// Rooted calls that run ahead (exec::Plan::run_ahead_weight: a small broadcast, reduce, gather or
// scatter over a transport whose messages carry signatures) overlap from call to call, so a
// stream of them is priced as such (stream_time): its busiest port a call, and once a window
// (exec::RunAheadWindow) the whole call that rings. Such a candidate replaces the choice where its
// stream is cheaper, if its single call is predicted at most this many times the fastest single
// call: the chain (`ring`) of a broadcast or reduce on 3 or 4 ranks, whose root sends or receives
// once a call where the tree's does twice, measured 1.7-2 times as fast in a loop on 4 hosts at
// 1 Gbit/s from 4 to 32 KiB (docs/performance.md, 2026-12-07, night); on 8 ranks its single call
// is priced 7/3 of the tree's (seven hops against three rounds), and the tree stays. Only where
// the largest message's wire time (β·bytes) is at least α: below, a message costs about its α on
// both of its ranks whatever the shape (the chain's middle ranks receive and send, the tree's root
// sends twice), and the chain's reduce measured up to 1.3 times as slow there. Not where ranks lie
// in blocks on hosts: one of the tree root's two messages stays within its host, and the hosts'
// links carry as much either way (the chain measured level or slower on 2 x 2).
constexpr double run_ahead_latency = 2.0;
// Where ranks lie in blocks on hosts, the flat candidate that the hosts' links price fastest
// replaces the plain model's choice only where the plain choice, priced on those links too, is
// predicted this much slower: Rabenseifner's reduce_scatter, nearest ranks first, and the
// recursive-doubling allgather, farthest first, against ring's three blocks a link at 1 Gbit/s
// (1.35-1.4 predicted, 1.5 measured: docs/performance.md, 2026-12-07, later). Closer calls are the
// model's error either way: Bruck's alltoall of 4-64 KiB, priced 1.10-1.23 ahead of pairwise,
// measured 0.67-0.76 of it on the emulated cluster; a 16 KiB allgather, priced 1.25 ahead of ring,
// measured 1.5 (it stays on ring).
constexpr double hosts_margin = 1.3;

std::size_t ceil_div(std::size_t a, std::size_t b) { return (a + b - 1) / b; }

// Elements per rank (the schedule's count) for `bytes`: at least one for a non-empty call.
std::size_t per_rank_count(Collective c, int p, std::size_t bytes) {
  const std::size_t parts = bytes_are_total(c) ? static_cast<std::size_t>(p) : 1;
  return ceil_div(bytes, elem_size * parts);
}

// A call's predicted time, its busiest port and its messages across hosts on the critical path
// (schedule::Cost).
struct Prediction {
  double time = 0, busiest = 0, across = 0, busiest_across = 0;
};

Prediction simulate(Algorithm algorithm, Collective c, int p, std::size_t bytes, const CostParams& cost,
                    const HostBlocks& hosts) {
  schedule::Params params;
  params.collective = c;
  params.size = p;
  params.count = per_rank_count(c, p, bytes);
  params.elem_size = elem_size;
  const std::vector<std::size_t> counts(static_cast<std::size_t>(p), params.count);
  if (c == Collective::allgatherv || c == Collective::alltoallv) params.counts = counts;
  schedule::fit_chunks(params, algorithm, cost.alpha, cost.beta);  // as CommImpl::plan_for cuts them
  const bool spans = hosts.spans() && p % hosts.ranks_per_host == 0;
  if (spans) params.ranks_per_host = hosts.ranks_per_host;  // the schedule CommImpl::plan_for makes
  const schedule::Cost estimated =
      spans ? schedule::estimate(algorithm, params, std::max(hosts.local.alpha, cost.alpha), hosts.local.beta,
                                 cost.gamma, {hosts.ranks_per_host, cost.alpha, cost.beta})
            : schedule::estimate(algorithm, params, cost.alpha, cost.beta, cost.gamma);
  return {estimated.time, estimated.busiest, estimated.rounds_across, estimated.busiest_across};
}

// Simulating every chunk of a 256 MiB call on 8 ranks takes tens of milliseconds; by 16 MiB every
// algorithm is in its linear regime (pipelines full, rounds growing with the chunks), so larger
// calls are extrapolated along the line through 8 and 16 MiB.
constexpr std::size_t simulated_bytes = std::size_t{16} << 20;

Prediction predict_schedule(Algorithm algorithm, Collective c, int p, std::size_t bytes, const CostParams& cost,
                            const HostBlocks& hosts) {
  if (bytes <= simulated_bytes) return simulate(algorithm, c, p, bytes, cost, hosts);
  const Prediction half = simulate(algorithm, c, p, simulated_bytes / 2, cost, hosts);
  const Prediction full = simulate(algorithm, c, p, simulated_bytes, cost, hosts);
  const auto along = [&](double at_half, double at_full) {
    return at_full + (at_full - at_half) / static_cast<double>(simulated_bytes / 2) *
                         static_cast<double>(bytes - simulated_bytes);
  };
  return {along(half.time, full.time), along(half.busiest, full.busiest), full.across, full.busiest_across};
}

Prediction predict_both(Algorithm algorithm, Collective collective, int ranks, std::size_t bytes,
                        const CostParams& cost, const HostBlocks& hosts);

// What a call costs in a stream of like calls (see run_ahead_latency): a call that runs ahead
// costs its busiest port, and every calls_ahead of them are followed by one that rings and costs
// its whole time; a call that rings every time, or whose messages cost less on the wire than
// their α, costs its whole time.
double stream_time(transport::Kind kind, Algorithm algorithm, Collective collective, int ranks, std::size_t bytes,
                   const CostParams& cost, const Prediction& predicted) {
  const std::size_t weight = exec::Plan::run_ahead_weight(kind, collective, algorithm, ranks,
                                                          per_rank_count(collective, ranks, bytes), elem_size);
  if (weight == 0) return predicted.time;
  const auto largest = static_cast<double>(weight - exec::Plan::run_ahead_bookkeeping);
  if (largest * cost.beta < cost.alpha) return predicted.time;
  const auto ahead = static_cast<double>(exec::RunAheadWindow::calls_ahead(weight));
  return (ahead * predicted.busiest + predicted.time) / (ahead + 1);
}

// The candidate cheapest() returns (stream rule) with its prediction, the prediction of the
// fastest single call (the earlier candidate on a tie; where `hosts` spans, the one with fewer
// messages across hosts, see across_tie), and every candidate with its prediction.
struct Pick {
  Algorithm chosen = Algorithm::automatic;
  Prediction fastest_time, chosen_time;
  std::vector<Algorithm> all;
  std::vector<Prediction> predicted;
};

// Whether `a` is predicted as fast as `b` (a tie) with fewer messages across hosts on its critical
// path. A message within a host is priced at the link's α (HostBlocks), so rounds within a host and
// across tie where a round within measures cheaper: a barrier on 2 hosts x 2 ranks took 38-45 us by
// recursive doubling (one round within the hosts, one across) against dissemination's 66-95 us
// (both rounds across), priced alike (docs/performance.md, 2026-12-08).
bool across_tie(const Prediction& a, const Prediction& b) {
  return a.time <= b.time * (1 + tie_margin) && b.time <= a.time * (1 + tie_margin) && a.across < b.across;
}

// `streams`: calls that run ahead may be priced as a stream (run_ahead_latency).
Pick pick(transport::Kind kind, Collective collective, int ranks, std::size_t bytes, bool direct_available,
          const CostParams& cost, const HostBlocks& hosts, bool streams) {
  const std::vector<Algorithm> all = candidates(kind, collective, direct_available);
  if (all.empty()) return {};
  std::vector<Prediction> predicted;
  std::size_t best = 0;
  for (std::size_t i = 0; i < all.size(); ++i) {
    predicted.push_back(predict_both(all[i], collective, ranks, bytes, cost, hosts));
    if (predicted[i].time < predicted[best].time * (1 - tie_margin) ||
        (hosts.spans() && across_tie(predicted[i], predicted[best])))
      best = i;
  }
  // Among those within stream_margin of the fastest call, one whose busiest port is markedly less
  // busy (stream_gain): in a stream of calls (a training step's buckets, a benchmark's loop) it
  // goes faster.
  const double limit = predicted[best].time * (1 + stream_margin);
  std::size_t chosen = best;
  for (std::size_t i = 0; i < all.size(); ++i)
    if (predicted[i].time <= limit && predicted[i].busiest < predicted[chosen].busiest * stream_gain) chosen = i;
  // A candidate that runs ahead, where its stream is cheaper than the choice's (run_ahead_latency).
  if (streams && transport::checks_message_signatures(kind)) {
    const auto stream = [&](std::size_t i) {
      return stream_time(kind, all[i], collective, ranks, bytes, cost, predicted[i]);
    };
    double chosen_stream = stream(chosen);
    for (std::size_t i = 0; i < all.size(); ++i) {
      if (predicted[i].time > predicted[best].time * run_ahead_latency) continue;
      if (const double s = stream(i); s < predicted[i].time && s < chosen_stream * (1 - tie_margin))
        chosen = i, chosen_stream = s;
    }
  }
  return {all[chosen], predicted[best], predicted[chosen], all, std::move(predicted)};
}

// Where ranks lie in blocks on hosts, a small gather or scatter runs ahead (exec::Plan::
// run_ahead_weight): a stream of them goes as fast as its busiest port takes the messages between
// hosts, each of which costs its sender and its receiver the link's α where one within a host costs
// shared memory's (the model prices both at the link's, see HostBlocks). So the candidate whose
// busiest port takes the fewest of them, among those that run ahead, where that is fewer than
// `chosen`'s (the earlier candidate on a tie), from `priced` (pick's candidates priced on the hosts): on 2 hosts x 2
// ranks at 1 Gbit/s the binomial tree's root takes one message from the other host a call where linear's takes two, and
// measured 1.1-3 times as fast from 64 B to 4 KiB (level at 32 KiB); on 2 hosts x 4, one against four, 2.4-5.7 times as
// fast from 64 B to 4 KiB and 1.5-3.8 at 32 KiB (one run), though its single call, three rounds, is priced at more than
// twice linear's (docs/performance.md, 2026-12-08).
std::optional<Algorithm> fewest_across(transport::Kind kind, Collective collective, int ranks, std::size_t bytes,
                                       const Pick& priced, Algorithm chosen) {
  if (collective != Collective::gather && collective != Collective::scatter) return std::nullopt;
  const std::vector<Algorithm>& all = priced.all;
  const std::vector<Prediction>& predicted = priced.predicted;
  std::optional<std::size_t> best, current;
  for (std::size_t i = 0; i < all.size(); ++i) {
    if (all[i] == chosen) current = i;
    const bool runs_ahead = exec::Plan::run_ahead_weight(kind, collective, all[i], ranks,
                                                         per_rank_count(collective, ranks, bytes), elem_size) > 0;
    if (!runs_ahead) continue;
    if (!best || predicted[i].busiest_across < predicted[*best].busiest_across) best = i;
  }
  if (!best || !current || predicted[*best].busiest_across >= predicted[*current].busiest_across) return std::nullopt;
  return all[*best];
}

// Hierarchical allreduce's three steps (cost_model.hpp, predict), each its cheapest candidate.
double hierarchical_time(int ranks, std::size_t bytes, const CostParams& cost, const HostBlocks& hosts) {
  const int local = hosts.ranks_per_host, across = ranks / local;
  const bool direct = hosts.local_kind == transport::Kind::shm;
  const std::size_t block = (bytes + static_cast<std::size_t>(local) - 1) / static_cast<std::size_t>(local);
  const CostParams shared_link{cost.alpha, cost.beta * local, cost.gamma};
  const CostParams within{hosts.local.alpha, hosts.local.beta, cost.gamma};
  const auto step = [&](Collective c, int p, std::size_t b, const CostParams& at, transport::Kind kind, bool native) {
    return pick(kind, c, p, b, native, at, {}, false).fastest_time.time;
  };
  // Each step is a collective call of its own on its own communicator, started once the one before
  // it completed: besides its messages it pays a call's fixed costs, which the schedules do not
  // count. Measured on the emulated cluster (2 hosts x 2 ranks, docs/performance.md, 2026-12-07):
  // hierarchical took 15-17 us longer than recursive doubling at 64 B-1 KiB on links whose α is
  // 6-7 us, so two of the link's α a step.
  const double call = 2 * cost.alpha;
  return step(Collective::reduce_scatter, local, block * static_cast<std::size_t>(local), within, hosts.local_kind,
              direct) +
         step(Collective::allreduce, across, block, shared_link, transport::Kind::tcp, false) +
         step(Collective::allgather, local, block * static_cast<std::size_t>(local), within, hosts.local_kind, direct) +
         3 * call;
}

// Whether `hosts` prices the messages of a call on `ranks` (several hosts of its blocks).
bool priced_on_hosts(int ranks, const HostBlocks& hosts) {
  return hosts.spans() && ranks % hosts.ranks_per_host == 0 && ranks / hosts.ranks_per_host >= 2;
}

bool hierarchical_serves(Collective collective, int ranks, const HostBlocks& hosts) {
  return collective == Collective::allreduce && priced_on_hosts(ranks, hosts);
}

Prediction predict_both(Algorithm algorithm, Collective collective, int ranks, std::size_t bytes,
                        const CostParams& cost, const HostBlocks& hosts) {
  if (ranks < 1) throw Error(ErrorCode::invalid_argument, "cost model: ranks must be at least 1");
  if (algorithm == Algorithm::hierarchical && hierarchical_serves(collective, ranks, hosts)) {
    const double time = hierarchical_time(ranks, bytes, cost, hosts);
    return {time, time};
  }
  if (const auto price = transport::native_price(algorithm, collective, ranks, bytes, cost)) return {*price, *price};
  if (!schedule::applies(algorithm, collective))
    throw Error(ErrorCode::unsupported, "cost model: " + std::string(to_string(algorithm)) + " does not serve " +
                                            std::string(to_string(collective)));
  return predict_schedule(algorithm, collective, ranks, bytes, cost, hosts);
}

}  // namespace

bool bytes_are_total(Collective c) {
  return c == Collective::reduce_scatter || c == Collective::allgather || c == Collective::allgatherv ||
         c == Collective::alltoall || c == Collective::gather || c == Collective::scatter;
}

std::optional<transport::Kind> within_host(transport::Kind kind) {
  if (kind == transport::Kind::routed) return transport::Kind::shm;
  if (kind == transport::Kind::tcp) return transport::Kind::tcp;
  return std::nullopt;
}

std::vector<Algorithm> candidates(transport::Kind kind, Collective collective, bool direct_available) {
  std::vector<Algorithm> out = schedule::algorithms_for(collective);
  if (direct_available)
    for (Algorithm a : transport::native_candidates(kind, collective)) out.push_back(a);
  return out;
}

double predict(Algorithm algorithm, Collective collective, int ranks, std::size_t bytes, const CostParams& cost,
               const HostBlocks& hosts) {
  return predict_both(algorithm, collective, ranks, bytes, cost, hosts).time;
}

Algorithm cheapest(transport::Kind kind, Collective collective, int ranks, std::size_t bytes, bool direct_available,
                   const CostParams& cost, const HostBlocks& hosts) {
  // A native collective of no elements waits for no rank: nothing is cheaper (a schedule of no
  // bytes, which the model also prices at 0, still runs its rounds).
  if (bytes == 0 && direct_available)
    if (const auto native = transport::native_candidates(kind, collective); !native.empty()) return native.front();
  // Among the flat candidates, the choice of the plain model (every message at the link's cost),
  // unless the hosts' links price another one faster by hosts_margin: in closer calls, Bruck's
  // alltoall came out ahead of choices that measured faster on the emulated cluster
  // (docs/performance.md, 2026-12-07). Hierarchical is weighed against what the flat candidates
  // cost on the hosts' links, and wins only where it is faster than the fastest of them outright
  // (by more than a tie).
  const bool blocks = priced_on_hosts(ranks, hosts);
  const Pick flat = pick(kind, collective, ranks, bytes, direct_available, cost, {}, !blocks);
  if (flat.chosen == Algorithm::automatic || !blocks) return flat.chosen;
  const Pick priced = pick(kind, collective, ranks, bytes, direct_available, cost, hosts, false);
  if (hierarchical_serves(collective, ranks, hosts) &&
      hierarchical_time(ranks, bytes, cost, hosts) < priced.fastest_time.time * (1 - tie_margin))
    return Algorithm::hierarchical;
  if (const auto fewer = fewest_across(kind, collective, ranks, bytes, priced, flat.chosen)) return *fewer;
  if (priced.chosen == flat.chosen) return flat.chosen;
  const Prediction flat_on_hosts = predict_both(flat.chosen, collective, ranks, bytes, cost, hosts);
  if (flat_on_hosts.time > priced.fastest_time.time * hosts_margin || across_tie(priced.chosen_time, flat_on_hosts))
    return priced.chosen;
  return flat.chosen;
}

}  // namespace tutti::comm::choice
