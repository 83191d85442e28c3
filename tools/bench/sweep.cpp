#include "bench/sweep.hpp"

namespace tutti::bench {

namespace {

struct Timed {
  Measure measure;
  int iterations = 0;
};

// Times and checks `op` on `buffers`; `iterations` 0 = choose.
Timed time_and_check(Communicator& world, const BenchOptions& options, Buffers& buffers,
                     const std::function<void()>& op, int iterations) {
  Timed t;
  t.iterations = iterations > 0 ? iterations : choose_iterations(world, op, options.iterations);
  if (options.per_call) {
    const CallTimes times = time_calls(world, op, options.warmup, t.iterations);
    t.measure.time = times.mean, t.measure.median = times.median;
  } else {
    t.measure.time = time_op(world, op, options.warmup, t.iterations);
  }
  if (options.check) t.measure.wrong = check_op(world, buffers, op, options.corrupt_for_testing);
  return t;
}

}  // namespace

std::vector<Algorithm> algorithms_to_sweep(Communicator& world, Kind kind) {
  if (kind == sendrecv) return {Algorithm::automatic};
  return world.algorithms(*kind);
}

Row measure_row(Communicator& world, const BenchOptions& options, const Case& base, Algorithm algorithm,
                const std::vector<std::unique_ptr<Peer>>& peers, const std::optional<Ceiling>& ceiling) {
  Row row;
  row.c = base;
  row.algorithm = to_string(algorithm);
  if (algorithm == Algorithm::automatic && base.kind != sendrecv)
    row.chosen = to_string(world.chosen_algorithm(*base.kind, case_bytes(base, world.size()), algorithm));
  if (ceiling) row.bound = time_bound(base, world.size(), *ceiling);
  const bool primary_in_place = base.kind == Collective::broadcast;
  for (const bool in_place : {false, true}) {
    if (!has_form(base.kind, in_place) || (options.primary_only && in_place != primary_in_place)) continue;
    Case c = base;
    c.in_place = in_place;
    Buffers buffers(c, world.rank(), world.size(), options.shared_buffers ? &world : nullptr);
    const Timed t = time_and_check(
        world, options, buffers, [&] { run_tutti(world, c, buffers, algorithm); }, 0);
    (in_place ? row.in_place : row.out_of_place) = t.measure;
    for (const auto& peer : peers) {  // each with its own iteration count (Gloo is far slower)
      if (!peer->supports(c)) continue;
      (in_place == primary_in_place ? row.peers : row.peers_in_place)[peer->name()] =
          time_and_check(
              world, options, buffers, [&] { peer->run(c, buffers); }, 0)
              .measure;
    }
  }
  return row;
}

Report run_sweep(Communicator& world, const BenchOptions& options, const std::vector<std::unique_ptr<Peer>>& peers,
                 const std::optional<Ceiling>& ceiling) {
  std::vector<std::string> peer_names;
  for (const auto& peer : peers) peer_names.push_back(peer->name());
  Report report(world.size(), std::string(world.transport_name()), peer_names, ceiling.has_value(), world.rank() == 0);
  const bool printer = world.rank() == 0;
  const std::vector<std::size_t> sizes = sweep_sizes(options);
  // Work ~ bytes moved, with a floor for the latency-bound sizes; for the ETA only.
  double total = 0;
  std::vector<std::pair<Kind, std::vector<Algorithm>>> groups;
  for (Kind kind : options.kinds) {
    std::vector<Algorithm> algorithms{options.algorithm};
    if (options.all_algorithms) algorithms = algorithms_to_sweep(world, kind);
    groups.emplace_back(kind, algorithms);
  }
  for (const auto& [kind, algorithms] : groups)
    for (std::size_t bytes : sizes)
      total += static_cast<double>(algorithms.size() * options.types.size() * options.ops.size()) *
               static_cast<double>(std::max<std::size_t>(bytes, 1 << 16));
  Progress progress(printer && !options.quiet_progress, total);
  double done = 0;
  // With more than one algorithm (--all-algorithms) the groups are measured side by side: each
  // size's row of every algorithm before the next size, the first of them rotating from size to
  // size, so that no group always runs first (its first row paying for the first touch of the
  // run's memory and the cache's state that the group before left) and no group's rows come
  // minutes after another's on a machine whose speed drifts. The rows are then reported group
  // by group. With one algorithm each row is reported as it is measured.
  for (const auto& [kind, algorithms] : groups) {
    const bool one = algorithms.size() == 1;
    std::vector<std::vector<Row>> measured(algorithms.size());
    if (one && printer) report.header(kind, std::string(to_string(algorithms.front())));
    // A barrier moves no data: one row, whatever the types and sizes.
    const std::vector<DataType> types =
        kind == Collective::barrier ? std::vector<DataType>{options.types.front()} : options.types;
    std::size_t turn = 0;
    for (DataType type : types) {
      for (ReduceOp op : reduces(kind) ? options.ops : std::vector<ReduceOp>{ReduceOp::sum}) {
        std::size_t last = ~std::size_t{0};
        for (std::size_t bytes : sizes) {
          const Case base = make_case(kind, type, op, options.root, bytes, world.size());
          if (case_bytes(base, world.size()) == last) continue;  // rounded to the same size as before
          last = case_bytes(base, world.size());
          for (std::size_t k = 0; k < algorithms.size(); ++k, ++turn) {
            const std::size_t a = (k + turn / algorithms.size()) % algorithms.size();
            Row row = measure_row(world, options, base, algorithms[a], peers, ceiling);
            done += static_cast<double>(std::max<std::size_t>(bytes, 1 << 16));
            progress.finish();
            if (one)
              report.row(row);
            else
              measured[a].push_back(std::move(row));
            progress.update(std::string(to_string(kind)) + " " + human_bytes(bytes), done);
          }
        }
      }
    }
    for (std::size_t a = 0; a < measured.size() && !one; ++a) {
      progress.finish();
      if (printer) report.header(kind, std::string(to_string(algorithms[a])));
      for (const Row& row : measured[a]) report.row(row);
    }
  }
  progress.finish();
  return report;
}

}  // namespace tutti::bench
