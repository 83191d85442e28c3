#include "bench/tune.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <vector>

#include "bench/sweep.hpp"
#include "tutti/tuning.hpp"

namespace tutti::bench {

namespace {

std::string output_path(const BenchOptions& options) {
  return options.output_path.empty() ? tuning::default_path() : options.output_path;
}

// The file's table, to add to; an empty one where there is no file yet.
tuning::Table read_table(const std::string& path) {
  return std::filesystem::exists(path) ? tuning::Table::read(path) : tuning::Table{};
}

void print_cost(const tuning::CostModel& cost, std::string_view transport) {
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
std::vector<tuning::Entry> entries_for(std::string_view transport, int ranks, const std::vector<Winner>& winners,
                                       Collective collective) {
  std::vector<tuning::Entry> entries;
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
  const tuning::CostModel cost = tuning::measure(world);
  if (world.rank() != 0) return 0;
  print_cost(cost, transport);
  const std::string path = output_path(options);
  tuning::Table table = read_table(path);
  table.cost_models[std::string(transport)] = cost;
  table.write(path);
  std::printf("# wrote %s\n", path.c_str());
  return 0;
}

int tune(Communicator& world, const BenchOptions& options) {
  const std::string transport(world.transport_name());
  const tuning::CostModel cost = tuning::measure(world);
  if (world.rank() == 0) print_cost(cost, transport);
  // Automatic, the reference every forced algorithm must beat, is the cost model with the
  // parameters just measured (those the file gets), not an earlier table's entries.
  tuning::Table model;
  model.cost_models[transport] = cost;
  tuning::use(std::move(model));
  std::vector<Kind> kinds = options.kinds;
  if (!options.kinds_given)
    kinds = {Collective::allreduce, Collective::reduce_scatter, Collective::allgather,
             Collective::broadcast, Collective::reduce,         Collective::alltoall};
  std::vector<tuning::Entry> entries;
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
  tuning::Table table = read_table(path);
  std::erase_if(table.entries, [&](const tuning::Entry& e) {
    return e.transport == transport && e.ranks == world.size() &&
           std::find(tuned.begin(), tuned.end(), e.collective) != tuned.end();
  });
  table.entries.insert(table.entries.end(), entries.begin(), entries.end());
  table.cost_models[transport] = cost;
  table.write(path);
  std::printf("#\n# wrote %zu entries for %s, %d ranks to %s (TUTTI_TUNING_FILE selects another file)\n",
              entries.size(), transport.c_str(), world.size(), path.c_str());
  return 0;
}

}  // namespace tutti::bench
