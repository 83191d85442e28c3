// Collective calls timed at scale (collective_time.hpp).
#include "sim/collective_time.hpp"

#include <algorithm>
#include <bit>
#include <vector>

#include "comm/cost_model.hpp"
#include "comm/topology.hpp"
#include "schedule/schedule.hpp"

namespace tutti::sim {

namespace {

schedule::Params params_for(Collective collective, int ranks, std::size_t count, std::size_t elem_size) {
  schedule::Params params;
  params.collective = collective;
  params.size = ranks;
  params.count = count;
  params.elem_size = elem_size;
  return params;
}

// The lockstep approximation (collective_time.hpp) over the schedules of host 0's ranks; returns
// a negative time when the schedules do not send and receive alike (no rounds to align).
double lockstep_seconds(std::span<const schedule::Schedule> host, std::size_t elem_size, const Levels& levels) {
  using schedule::StepKind;
  struct Message {
    int peer;
    std::size_t count;
  };
  std::vector<std::vector<Message>> sends(host.size());
  std::vector<std::vector<std::size_t>> reductions(host.size());  // per receive: elements reduced
  std::vector<double> copies(host.size(), 0);
  for (std::size_t r = 0; r < host.size(); ++r)
    for (const auto& step : host[r].steps) {
      if (step.kind == StepKind::send) sends[r].push_back({step.peer, step.region.count});
      if (step.kind == StepKind::recv || step.kind == StepKind::recv_reduce)
        reductions[r].push_back(step.kind == StepKind::recv_reduce ? step.region.count : 0);
      if (step.kind == StepKind::copy)
        copies[r] += levels.intra_beta * static_cast<double>(step.region.count * elem_size);
    }
  for (std::size_t r = 0; r < host.size(); ++r)
    if (sends[r].size() != reductions[r].size() || sends[r].size() != sends[0].size()) return -1;
  double total = *std::max_element(copies.begin(), copies.end());
  const int per_host = levels.ranks_per_host;
  double queued = 0;  // the wire time behind the first message of the last round, where it crossed
  for (std::size_t k = 0; k < sends[0].size(); ++k) {
    int crossing = 0;
    for (std::size_t r = 0; r < host.size(); ++r) crossing += sends[r][k].peer / per_host != 0 ? 1 : 0;
    // Rounds across hosts back to back (Rabenseifner's, nearest ranks first): a message of this
    // round waits for one of the last round's, which arrives α after its wire time while the link
    // still carries the rest of that round; the latency hides behind that queue.
    if (crossing > 0) total -= std::min(levels.alpha, queued);
    queued = 0;
    if (crossing > 0) {
      double largest = 0;
      for (std::size_t r = 0; r < host.size(); ++r)
        if (sends[r][k].peer / per_host != 0)
          largest = std::max(largest, static_cast<double>(sends[r][k].count * elem_size));
      queued = levels.beta * largest * (crossing - 1);
    }
    // A round lasts as long as a message takes on average along the ranks (a ring's data passes
    // every link in turn, so its path holds each link's latency once), but no less than the
    // busiest port is occupied (a slow link's wire time throttles the whole pipeline).
    double occupied = 0, along = 0;
    for (std::size_t r = 0; r < host.size(); ++r) {
      const double bytes = static_cast<double>(sends[r][k].count * elem_size);
      const bool across = sends[r][k].peer / per_host != 0;
      const double wire = across ? levels.beta * bytes * crossing : levels.intra_beta * bytes;
      const double reduce = levels.gamma * static_cast<double>(reductions[r][k]);
      occupied = std::max(occupied, wire + reduce);
      along += (across ? levels.alpha : levels.intra_alpha) + wire + reduce;
    }
    const double round = std::max(occupied, along / static_cast<double>(host.size()));
    total += round;
  }
  return total;
}

double simulate(Algorithm algorithm, Collective collective, int ranks, std::size_t count, std::size_t elem_size,
                const Levels& levels, bool lockstep) {
  schedule::Params params = params_for(collective, ranks, count, elem_size);
  schedule::fit_chunks(params, algorithm, levels.alpha, levels.beta);  // as the library cuts them for its link
  const int per_host = std::clamp(levels.ranks_per_host, 1, ranks);
  params.ranks_per_host = per_host;  // as the library's plan does where ranks lie in blocks on hosts
  params.rank = 0;
  const schedule::Schedule first = schedule::make(algorithm, params);
  const bool exact = !lockstep && first.steps.size() * static_cast<std::size_t>(ranks) <= kExactSteps;
  if (!exact) {
    std::vector<schedule::Schedule> host{first};
    for (int r = 1; r < per_host; ++r) {
      params.rank = r;
      host.push_back(schedule::make(algorithm, params));
    }
    Levels clamped = levels;
    clamped.ranks_per_host = per_host;
    const double t = lockstep_seconds(host, elem_size, clamped);
    if (t >= 0) return t;
  }
  std::vector<schedule::Schedule> all{first};
  for (int r = 1; r < ranks; ++r) {
    params.rank = r;
    all.push_back(schedule::make(algorithm, params));
  }
  const schedule::Hosts hosts{per_host, levels.alpha, levels.beta};
  return schedule::estimate(all, elem_size, levels.intra_alpha, levels.intra_beta, levels.gamma, hosts).time;
}

}  // namespace

double schedule_seconds(Algorithm algorithm, Collective collective, int ranks, std::size_t count, std::size_t elem_size,
                        const Levels& levels, bool lockstep) {
  // As the library's cost model does (comm/cost_model.cpp): by 16 MiB per rank every algorithm
  // is in its linear regime, so larger calls are extrapolated along the line through 8 and 16 MiB.
  const std::size_t linear = (std::size_t{16} << 20) / elem_size;
  if (count <= linear) return simulate(algorithm, collective, ranks, count, elem_size, levels, lockstep);
  const double half = simulate(algorithm, collective, ranks, linear / 2, elem_size, levels, lockstep);
  const double full = simulate(algorithm, collective, ranks, linear, elem_size, levels, lockstep);
  return full + (full - half) / static_cast<double>(linear / 2) * static_cast<double>(count - linear);
}

namespace {

// Consecutive ranks share a host, `per_host` to each.
comm::Topology hosts_of(int ranks, int per_host) {
  std::vector<std::uint64_t> host_of(static_cast<std::size_t>(ranks));
  for (int r = 0; r < ranks; ++r) host_of[static_cast<std::size_t>(r)] = static_cast<std::uint64_t>(r / per_host);
  return comm::Topology(std::move(host_of));
}

}  // namespace

CollectiveTimes::CollectiveTimes(const Network& network, int ranks, int ranks_per_host)
    : network_(network), ranks_(ranks), per_host_(ranks_per_host), topology_(hosts_of(ranks, ranks_per_host)) {}

CollectiveTimes::Timed CollectiveTimes::cheapest(Collective collective, int ranks, int per_host, std::size_t count,
                                                 std::size_t elem, int sharing) const {
  Timed best;
  if (ranks == 1) return Timed{0, "local"};
  const bool one_host = per_host >= ranks;
  const Levels levels{per_host,      network_.alpha, network_.beta * sharing, network_.intra_alpha, network_.intra_beta,
                      network_.gamma};
  bool first = true;
  for (Algorithm a : comm::choice::candidates(transport::Kind::shm, collective, one_host)) {
    double t = 0;
    if (a == Algorithm::direct) {
      const comm::choice::CostParams cost{network_.intra_alpha, network_.intra_beta, network_.gamma};
      const bool total = comm::choice::bytes_are_total(collective);
      const std::size_t bytes = count * elem * (total ? static_cast<std::size_t>(ranks) : 1);
      t = comm::choice::predict(a, collective, ranks, bytes, cost);
    } else {
      t = schedule_seconds(a, collective, ranks, count, elem, levels);
    }
    if (first || t < best.seconds) best = Timed{t, std::string(to_string(a))};
    first = false;
  }
  return best;
}

const CollectiveTimes::Timed& CollectiveTimes::allreduce(std::size_t count, DataType type) {
  const auto key = std::make_pair(count, type);
  if (auto it = allreduce_.find(key); it != allreduce_.end()) return it->second;
  const std::size_t elem = size_of(type);
  const int hosts = ranks_ / per_host_;
  const auto hierarchical = [&] {
    // Equal ranks per host: reduce_scatter inside each host, per_host concurrent allreduces of
    // one block across the hosts (sharing each host's link), allgather inside each host; each step
    // a call of its own, which the library prices at two of the link's α besides its messages.
    const std::size_t block = (count + static_cast<std::size_t>(per_host_) - 1) / static_cast<std::size_t>(per_host_);
    const Timed rs = cheapest(Collective::reduce_scatter, per_host_, per_host_, block, elem, 1);
    const Timed across = cheapest(Collective::allreduce, hosts, 1, block, elem, per_host_);
    const Timed ag = cheapest(Collective::allgather, per_host_, per_host_, block, elem, 1);
    return Timed{rs.seconds + across.seconds + ag.seconds + 3 * 2 * network_.alpha,
                 "hierarchical (" + rs.how + ", " + across.how + " across hosts, " + ag.how + ")"};
  };
  Timed timed;
  if (topology_.blocked_ranks_per_host() > 0) {
    // Ranks in blocks on hosts: as the library's cost model decides (comm::choice::cheapest),
    // hierarchical where it is faster than the fastest flat candidate with the hosts' links priced.
    timed = cheapest(Collective::allreduce, ranks_, per_host_, count, elem, 1);
    if (Timed h = hierarchical(); h.seconds < timed.seconds) timed = std::move(h);
  } else if (comm::prefers_hierarchical(topology_, count * elem)) {
    timed = hierarchical();
  } else {
    timed = cheapest(Collective::allreduce, ranks_, per_host_, count, elem, 1);
  }
  return allreduce_.emplace(key, std::move(timed)).first->second;
}

const CollectiveTimes::Timed& CollectiveTimes::negotiation(std::size_t counts) {
  return allreduce(std::bit_ceil(std::max(counts, kNegotiationCounts)), DataType::u32);
}

const CollectiveTimes::Timed& CollectiveTimes::allgather(std::size_t bytes) {
  if (auto it = allgather_.find(bytes); it != allgather_.end()) return it->second;
  return allgather_.emplace(bytes, cheapest(Collective::allgather, ranks_, per_host_, bytes, 1, 1)).first->second;
}

}  // namespace tutti::sim
