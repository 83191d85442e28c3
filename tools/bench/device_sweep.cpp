#include "bench/device_sweep.hpp"

#include <cstdio>
#include <cstring>
#include <memory>

#include "bench/device_collectives.hpp"
#include "bench/device_kernels.hpp"
#include "bench/device_runner.hpp"

namespace tutti::bench {

namespace {

// Every rank opens its device once before the collective gpu::Communicator constructor: a rank
// that cannot (no CUDA, no GPU) would otherwise leave the others waiting in it. Returns the
// device's name, or "" on every rank when some rank failed, with that rank's reason in `why`.
std::string open_everywhere(Communicator& world, gpu::DeviceKind kind, std::string& why) {
  std::string name;
  char reason[512] = {};
  bool failed = false;
  try {
    name = gpu::device_name(kind);
  } catch (const std::exception& e) {
    failed = true;
    std::snprintf(reason, sizeof(reason), "%s", e.what());
  }
  // The lowest failing rank tells everyone why.
  int first = failed ? world.rank() : world.size();
  world.allreduce(std::span<int>(&first, 1), ReduceOp::min);
  if (first == world.size()) return name;
  world.broadcast(reason, sizeof(reason), DataType::u8, first);
  why = (world.size() > 1 ? "rank " + std::to_string(first) + ": " : std::string()) + reason;
  return "";
}

// One row: Tutti's device collective in both forms, then the sync peer (primary form) and the
// copy of the same bytes, each timed and checked on this size's buffers.
Row measure_device_row(DeviceContext& context, const Case& base, const DeviceCollective& collective, bool sync) {
  Row row;
  row.c = base;
  row.algorithm = context.options.backend;
  const bool primary_in_place = base.kind == Collective::broadcast;
  const bool check = context.options.check;
  for (const bool in_place : {false, true}) {
    if (!has_form(base.kind, in_place)) continue;
    Case c = base;
    c.in_place = in_place;
    Buffers host(c, context.world.rank(), context.world.size());
    DeviceBuffers device(context.gpu, host, c);
    device.upload(context.stream);
    const auto op = [&] {
      collective.enqueue(context.gpu, c, device.send(), device.recv(), context.stream, context.call_options);
    };
    Measure m = time_stream(context, op, context.options.warmup, choose_stream_iterations(context, op));
    if (check) m.wrong = check_device(context, host, device, op, context.options.corrupt_for_testing);
    (in_place ? row.in_place : row.out_of_place) = m;
    if (context.options.overlap && in_place == primary_in_place) {
      const Overlap overlap = time_overlap(context, op, m.time);
      row.compute = overlap.compute, row.both = overlap.both;
    }
    if (in_place != primary_in_place || !sync) continue;
    const auto peer = [&] { run_sync(context, c, host, device); };
    Measure s = time_stream(context, peer, context.options.warmup, choose_stream_iterations(context, peer));
    if (check) s.wrong = check_device(context, host, device, peer, false);
    row.peers["sync"] = s;
  }
  row.copy = time_copy(context, case_bytes(base, context.world.size()));
  return row;
}

void sweep(DeviceContext& context, Report& report) {
  const BenchOptions& options = context.options;
  const bool printer = context.world.rank() == 0;
  const bool sync = !options.peers.empty();
  const int p = context.world.size();
  for (Kind kind : options.kinds) {
    const DeviceCollective* collective = find_device_collective(kind);
    if (printer) report.header(kind, options.backend);
    for (DataType type : options.types) {
      for (ReduceOp op : reduces(kind) ? options.ops : std::vector<ReduceOp>{ReduceOp::sum}) {
        std::size_t last = ~std::size_t{0};
        for (std::size_t bytes : sweep_sizes(options)) {
          const Case base = make_case(kind, type, op, options.root, bytes, p);
          if (case_bytes(base, p) == last) continue;  // rounded to the same size as before
          last = case_bytes(base, p);
          report.row(measure_device_row(context, base, *collective, sync));
        }
      }
    }
  }
}

}  // namespace

int run_device(Communicator& world, const BenchOptions& options, const std::string& launcher) {
  const bool printer = world.rank() == 0;
  // --kernels times one device's kernels: one rank, so that no other rank shares the device or
  // waits for it with a deadline.
  if (options.kernels && world.size() != 1) {
    if (printer)
      std::fprintf(stderr, "tutti-bench: --kernels runs on one rank (this job has %d): launch it with -n 1\n",
                   world.size());
    return 2;
  }
  if (options.root >= world.size()) throw std::invalid_argument("-r: root must be below the number of ranks");
  const gpu::DeviceKind kind = options.device == "cuda" ? gpu::DeviceKind::cuda : gpu::DeviceKind::emulated;
  std::string why;
  const std::string device_name = open_everywhere(world, kind, why);
  if (device_name.empty()) {
    if (printer) std::fprintf(stderr, "tutti-bench: --device %s: %s\n", options.device.c_str(), why.c_str());
    return 1;
  }
  const std::string transport(world.transport_name());
  if (options.kernels) {
    std::printf("# tutti-bench: device kernels on %s; %s\n", device_name.c_str(), options.command_line.c_str());
    gpu::Communicator gpu(world, kind);
    gpu::Stream stream = gpu.create_stream();
    DeviceContext context{world, gpu, stream, options, device_options(options.backend)};
    const int status = run_kernels(context, device_name, launcher);
    gpu.destroy_stream(stream);
    return status;
  }
  if (printer)
    std::printf("# tutti-bench: %d ranks over %s, device %s, backend %s; %s\n", world.size(), transport.c_str(),
                device_name.c_str(), options.backend.c_str(), options.command_line.c_str());
  gpu::Communicator gpu(world, kind);
  gpu::Stream stream = gpu.create_stream();
  DeviceContext context{world, gpu, stream, options, device_options(options.backend)};
  Report report(world.size(), transport, options.peers, false, printer);
  report.set_device(device_name, options.backend, options.overlap);
  sweep(context, report);  // on an error, ~gpu::Communicator destroys the stream
  gpu.destroy_stream(stream);
  if (printer) {
    report.footer(std::nullopt);
    if (!options.json_path.empty()) report.write_json(options.json_path, options.command_line, launcher, std::nullopt);
  }
  return report.wrong() == 0 ? 0 : 1;
}

}  // namespace tutti::bench
