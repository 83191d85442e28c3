#include "bench/tune.hpp"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>
#include <vector>

#include "bench/sweep.hpp"
#include "comm/choice.hpp"
#include "comm/tuning.hpp"
#include "reduce/reduce.hpp"
#include "schedule/schedule.hpp"
#include "tutti/topology.hpp"

namespace tutti::bench {

namespace {

namespace choice = tutti::comm::choice;
using clock = std::chrono::steady_clock;

// One-way time of a `bytes` message between ranks 0 and 1 (ping-pong), the same on every rank.
double one_way(Communicator& world, std::size_t bytes, int rounds, int partner) {
  std::vector<std::byte> buffer(std::max<std::size_t>(bytes, 1));
  const bool measures = world.rank() == 0 || world.rank() == partner;
  world.barrier();
  const auto start = clock::now();
  for (int i = 0; i < rounds && measures; ++i) {
    if (world.rank() == 0) {
      world.send(buffer.data(), bytes, DataType::u8, partner);
      world.recv(buffer.data(), bytes, DataType::u8, partner);
    } else {
      world.recv(buffer.data(), bytes, DataType::u8, 0);
      world.send(buffer.data(), bytes, DataType::u8, 0);
    }
  }
  const double seconds = measures ? std::chrono::duration<double>(clock::now() - start).count() : 0;
  return max_over_ranks(world, seconds / (2.0 * rounds));
}

// The rank that rank 0 measures against: the first on another host where the ranks span hosts
// (the links between hosts are what limit a composite transport such as shm+tcp), else rank 1.
// Collective.
int partner_of_rank_0(Communicator& world) {
  const HostLayout layout = host_layout(world);
  for (int r = 1; r < world.size(); ++r)
    if (layout.host_of_rank[static_cast<std::size_t>(r)] != layout.host_of_rank[0]) return r;
  return 1;
}

// Seconds per f32 element of the sum kernel on one core (the slowest rank's).
double reduce_time(Communicator& world) {
  constexpr std::size_t n = std::size_t{1} << 22;
  std::vector<float> a(n, 1.0f), b(n, 2.0f);
  reduce::apply(ReduceOp::sum, DataType::f32, a.data(), a.data(), b.data(), n);  // warm
  const auto start = clock::now();
  constexpr int repeats = 5;
  for (int i = 0; i < repeats; ++i) reduce::apply(ReduceOp::sum, DataType::f32, a.data(), a.data(), b.data(), n);
  return max_over_ranks(world, std::chrono::duration<double>(clock::now() - start).count() / (repeats * n));
}

choice::CostParams measure_cost(Communicator& world) {
  choice::CostParams cost;
  cost.gamma = reduce_time(world);
  if (world.size() < 2) return cost;
  const int partner = partner_of_rank_0(world);
  cost.alpha = one_way(world, 8, 2000, partner);
  constexpr std::size_t large = std::size_t{4} << 20;
  cost.beta = std::max(0.0, one_way(world, large, 20, partner) - cost.alpha) / static_cast<double>(large);
  return cost;
}

std::string output_path(const BenchOptions& options) {
  return options.output_path.empty() ? choice::default_path() : options.output_path;
}

choice::Table read_table(const std::string& path) {
  std::ifstream in(path);
  if (!in) return choice::Table{};
  std::stringstream text;
  text << in.rdbuf();
  return choice::Table::parse(text.str(), path);
}

void write_table(const choice::Table& table, const std::string& path) {
  const std::filesystem::path file(path);
  if (file.has_parent_path()) std::filesystem::create_directories(file.parent_path());
  std::ofstream out(path);
  out << table.to_json();
  if (!out) throw std::runtime_error("cannot write the tuning file " + path);
}

void print_cost(const choice::CostParams& cost, std::string_view transport) {
  std::printf("# cost model for %s: alpha %.3f us, beta %.4f ns/B (%.2f GB/s), gamma %.4f ns/element\n",
              std::string(transport).c_str(), cost.alpha * 1e6, cost.beta * 1e9, cost.beta > 0 ? 1e-9 / cost.beta : 0.0,
              cost.gamma * 1e9);
}

struct Winner {
  std::size_t bytes;
  Algorithm algorithm;  // automatic: no forced algorithm beat the cost model's choice here
};

// A forced algorithm goes into the table only where its time beat automatic's (the cost model's
// choice, with the cost model just measured) by this fraction: an entry won on noise would pin a
// slower algorithm over a whole range of sizes.
constexpr double tune_margin = 0.05;

// Each algorithm's best of `passes` alternating measurements of the primary form (checked in the
// first): this machine's noise is larger than the differences the table must capture.
std::vector<double> best_times(Communicator& world, const BenchOptions& options, const Case& base,
                               const std::vector<Algorithm>& algorithms) {
  constexpr int passes = 3;
  std::vector<double> times(algorithms.size(), std::numeric_limits<double>::infinity());
  for (int pass = 0; pass < passes; ++pass) {
    for (std::size_t i = 0; i < algorithms.size(); ++i) {
      if (algorithms[i] == Algorithm::mpi) continue;
      BenchOptions once = options;
      once.check = options.check && pass == 0;
      once.primary_only = true;
      const Measure m = primary(measure_row(world, once, base, algorithms[i], {}, std::nullopt));
      if (m.wrong != 0)
        throw std::runtime_error(std::string(to_string(base.kind)) + " with " + std::string(to_string(algorithms[i])) +
                                 ": wrong results while tuning");
      times[i] = std::min(times[i], m.time);
    }
  }
  return times;
}

// Per size for `kind`, the forced algorithm that beat automatic by tune_margin, else automatic;
// prints each size's times on rank 0.
std::vector<Winner> tune_kind(Communicator& world, const BenchOptions& options, Kind kind) {
  std::vector<Winner> winners;
  const std::vector<Algorithm> algorithms = algorithms_to_sweep(world, kind);
  const bool printer = world.rank() == 0;
  if (printer)
    std::printf(
        "#\n# %s: per size, the table's entry (a forced algorithm %.0f%% faster than automatic, else "
        "automatic: none) and automatic's time / the fastest forced one's\n",
        std::string(to_string(kind)).c_str(), tune_margin * 100);
  for (std::size_t bytes : sweep_sizes(options)) {
    const Case base = make_case(kind, DataType::f32, ReduceOp::sum, 0, bytes, world.size());
    if (case_bytes(base, world.size()) == 0 && bytes > 0) continue;
    const std::vector<double> times = best_times(world, options, base, algorithms);
    double best = std::numeric_limits<double>::infinity(), automatic = 0;
    Algorithm fastest = Algorithm::automatic;
    std::string line;
    for (std::size_t i = 0; i < algorithms.size(); ++i) {
      const Algorithm a = algorithms[i];
      if (a == Algorithm::mpi) continue;
      char cell[64];
      std::snprintf(cell, sizeof(cell), " %s=%.1fus", std::string(to_string(a)).c_str(), times[i] * 1e6);
      line += cell;
      if (a == Algorithm::automatic) {
        automatic = times[i];
      } else if (times[i] < best) {
        best = times[i];
        fastest = a;
      }
    }
    const Algorithm entry = best < automatic * (1 - tune_margin) ? fastest : Algorithm::automatic;
    winners.push_back({case_bytes(base, world.size()), entry});
    if (printer)
      std::printf("  %10zu %-18s %5.2fx %s\n", case_bytes(base, world.size()), std::string(to_string(entry)).c_str(),
                  automatic / best, line.c_str());
  }
  return winners;
}

// Ranges between the geometric means of neighbouring sizes, merged where the winner repeats;
// none where automatic won (the cost model chooses there).
std::vector<choice::Entry> entries_for(std::string_view transport, int ranks, const std::vector<Winner>& winners,
                                       Collective collective) {
  std::vector<choice::Entry> entries;
  for (std::size_t k = 0; k < winners.size(); ++k) {
    if (winners[k].algorithm == Algorithm::automatic) continue;
    const std::size_t lo =
        k == 0 ? 0
               : static_cast<std::size_t>(std::sqrt(static_cast<double>(winners[k - 1].bytes) * winners[k].bytes)) + 1;
    const std::size_t hi =
        k + 1 == winners.size()
            ? std::numeric_limits<std::size_t>::max()
            : static_cast<std::size_t>(std::sqrt(static_cast<double>(winners[k].bytes) * winners[k + 1].bytes));
    if (k > 0 && winners[k - 1].algorithm == winners[k].algorithm) {
      entries.back().max_bytes = hi;
      continue;
    }
    entries.push_back({collective, std::string(transport), ranks, lo, hi, winners[k].algorithm});
  }
  return entries;
}

}  // namespace

int calibrate(Communicator& world, const BenchOptions& options) {
  const std::string_view transport = world.transport_name();
  const choice::CostParams cost = measure_cost(world);
  if (world.rank() != 0) return 0;
  print_cost(cost, transport);
  const std::string path = output_path(options);
  choice::Table table = read_table(path);
  table.cost_models[std::string(transport)] = cost;
  write_table(table, path);
  std::printf("# wrote %s\n", path.c_str());
  return 0;
}

int tune(Communicator& world, const BenchOptions& options) {
  const std::string transport(world.transport_name());
  const choice::CostParams cost = measure_cost(world);
  if (world.rank() == 0) print_cost(cost, transport);
  // Automatic, the reference every forced algorithm must beat, is the cost model with the
  // parameters just measured (those the file gets), not an earlier table's entries.
  choice::Table model;
  model.cost_models[transport] = cost;
  choice::set_active(std::move(model));
  std::vector<Kind> kinds = options.kinds;
  if (!options.kinds_given)
    kinds = {Collective::allreduce, Collective::reduce_scatter, Collective::allgather,
             Collective::broadcast, Collective::reduce,         Collective::alltoall};
  std::vector<choice::Entry> entries;
  std::vector<Collective> tuned;
  for (Kind kind : kinds) {
    if (kind == sendrecv) continue;
    const Collective collective = *kind;
    const auto winners = tune_kind(world, options, kind);
    for (auto& e : entries_for(transport, world.size(), winners, collective)) entries.push_back(std::move(e));
    tuned.push_back(collective);
  }
  if (world.rank() != 0) return 0;
  const std::string path = output_path(options);
  choice::Table table = read_table(path);
  std::erase_if(table.entries, [&](const choice::Entry& e) {
    return e.transport == transport && e.ranks == world.size() &&
           std::find(tuned.begin(), tuned.end(), e.collective) != tuned.end();
  });
  table.entries.insert(table.entries.end(), entries.begin(), entries.end());
  table.cost_models[transport] = cost;
  write_table(table, path);
  std::printf("#\n# wrote %zu entries for %s, %d ranks to %s (TUTTI_TUNING_FILE selects another file)\n",
              entries.size(), transport.c_str(), world.size(), path.c_str());
  return 0;
}

}  // namespace tutti::bench
