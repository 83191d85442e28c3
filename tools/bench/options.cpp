#include "bench/options.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string_view>
#include <system_error>

#include "bench/device_collectives.hpp"
#include "common/cli.hpp"
#include "tutti/compress.hpp"

namespace tutti::bench {

namespace {

std::vector<std::string> split_list(const std::string& text) {
  std::vector<std::string> out;
  std::size_t start = 0;
  while (start <= text.size()) {
    const std::size_t end = std::min(text.find(',', start), text.size());
    if (end > start) out.push_back(text.substr(start, end - start));
    start = end + 1;
  }
  return out;
}

// "qsgd:BITS" as compress::Compression reads it; the bits.
int parse_values(const std::string& text) {
  try {
    const compress::Compression c = compress::Compression::parse(text);
    if (c.kind == compress::Compression::Kind::qsgd) return c.bits;
  } catch (const Error&) {
  }
  throw std::invalid_argument("--values: expected qsgd:4 or qsgd:8, got '" + text + "'");
}

double parse_density(const std::string& text) {
  double value = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (text.empty() || ec != std::errc() || end != text.data() + text.size())
    throw std::invalid_argument("--density: expected a number, got '" + text + "'");
  return value;
}

std::vector<Kind> parse_kinds(const std::string& text) {
  constexpr Kind all[] = {Collective::allreduce,  Collective::reduce_scatter, Collective::allgather,
                          Collective::broadcast,  Collective::reduce,         Collective::alltoall,
                          Collective::allgatherv, Collective::alltoallv,      Collective::gather,
                          Collective::scatter,    Collective::barrier,        sendrecv};
  if (text == "all") return {std::begin(all), std::end(all)};
  std::vector<Kind> out;
  for (const std::string& name : split_list(text)) {
    bool found = false;
    for (Kind kind : all)
      if (name == to_string(kind)) out.push_back(kind), found = true;
    if (!found) throw std::invalid_argument("--collective: unknown collective '" + name + "'");
  }
  return out;
}

std::vector<DataType> parse_types(const std::string& text) {
  std::vector<DataType> out;
  if (text == "all") {
    for (int t = 0; t <= static_cast<int>(DataType::f64); ++t) out.push_back(static_cast<DataType>(t));
    return out;
  }
  for (const std::string& name : split_list(text)) {
    const auto type = parse_type(name);
    if (!type) throw std::invalid_argument("-d/--datatype: unknown type '" + name + "'");
    out.push_back(*type);
  }
  return out;
}

std::vector<ReduceOp> parse_ops(const std::string& text) {
  std::vector<ReduceOp> out;
  for (int o = 0; o <= static_cast<int>(ReduceOp::avg); ++o)
    if (text == "all" || text == to_string(static_cast<ReduceOp>(o))) out.push_back(static_cast<ReduceOp>(o));
  if (out.empty()) throw std::invalid_argument("-o/--op: unknown op '" + text + "' (sum, prod, min, max, avg, all)");
  return out;
}

Algorithm parse_algorithm(const std::string& name) {
  if (const auto a = algorithm_from_name(name)) return *a;
  throw std::invalid_argument("--algorithm: unknown algorithm '" + name + "'");
}

// Device mode runs what gpu::Communicator has, on the backends it has, beside the sync peer.
void validate_device(const BenchOptions& o) {
  if (o.device != "emulated" && o.device != "cuda")
    throw std::invalid_argument("--device: unknown device '" + o.device + "' (host, emulated, cuda)");
  check_backend(o.backend);
  if (o.kernels) {
    if (o.kinds_given)
      throw std::invalid_argument("--kernels: times the reduction kernels, not a collective (no --collective)");
    if (!o.peers.empty()) throw std::invalid_argument("--kernels: no peers (every row times the D2D copy beside it)");
    if (o.backend != "automatic")
      throw std::invalid_argument("--kernels: no --backend (the kernels run on the device, not through a backend)");
    if (std::find(o.ops.begin(), o.ops.end(), ReduceOp::avg) != o.ops.end())
      throw std::invalid_argument("--kernels: no avg (an average is a sum divided once: time -o sum)");
    if (o.overlap) throw std::invalid_argument("--overlap: times collectives beside compute (not with --kernels)");
  }
  if (o.algorithm != Algorithm::automatic || o.all_algorithms)
    throw std::invalid_argument("--algorithm/--all-algorithms: host mode only (with --device, choose a --backend)");
  if (o.tune || o.calibrate) throw std::invalid_argument("--tune/--calibrate: host mode only");
  if (o.ceiling)
    throw std::invalid_argument("--ceiling: host mode only (with --device every row has the D2D copy ceiling)");
  for (const std::string& peer : o.peers)
    if (peer != "sync")
      throw std::invalid_argument("--peers: '" + peer + "' is a host-mode peer (with --device: sync)");
  if (o.all_kinds) return;
  for (Kind kind : o.kinds)
    if (!find_device_collective(kind))
      throw std::invalid_argument("--collective: gpu::Communicator has no " + std::string(to_string(kind)) +
                                  " (it has " + device_collective_names() + ")");
}

// The sparse table takes -d, -o, -n, -w, -c, --density and --dim, and nothing of the sweep's.
void validate_sparse(const BenchOptions& o) {
  if (device_mode(o) || o.tune || o.calibrate || o.ceiling || !o.peers.empty() || o.all_algorithms ||
      o.algorithm != Algorithm::automatic || !o.json_path.empty())
    throw std::invalid_argument(
        "--collective sparse_allreduce: host mode only, without peers, --ceiling, --json, --algorithm or --tune (every "
        "sparse "
        "algorithm is timed)");
  if (o.sparse_dim == 0 || o.sparse_dim > (std::size_t{1} << 32))
    throw std::invalid_argument("--dim: must be in [1, 2^32] (u32 indices)");
  for (double d : o.densities)
    if (!(d > 0 && d <= 1)) throw std::invalid_argument("--density: each must be in (0, 1]");
}

void validate(const BenchOptions& o) {
  if (o.sparse) return validate_sparse(o);
  if (!o.densities.empty()) throw std::invalid_argument("--density: only with --collective sparse_allreduce");
  if (o.sparse_qsgd_bits != 0) throw std::invalid_argument("--values: only with --collective sparse_allreduce");
  if (o.min_bytes > o.max_bytes) throw std::invalid_argument("-b/--minbytes must not exceed -e/--maxbytes");
  if (o.factor <= 1.0 && o.min_bytes != o.max_bytes)
    throw std::invalid_argument("-f/--stepfactor must be greater than 1");
  if (o.iterations && *o.iterations < 1) throw std::invalid_argument("-n/--iters must be at least 1");
  if (o.warmup < 0) throw std::invalid_argument("-w/--warmup_iters must not be negative");
  if (o.root < 0) throw std::invalid_argument("-r/--root must not be negative");
  if (o.kernels && !device_mode(o)) throw std::invalid_argument("--kernels: only with --device emulated or cuda");
  if (o.overlap && !device_mode(o)) throw std::invalid_argument("--overlap: only with --device emulated or cuda");
  if (device_mode(o)) return validate_device(o);
  if (o.backend != "automatic") throw std::invalid_argument("--backend: only with --device emulated or cuda");
  for (const std::string& peer : o.peers)
    if (peer != "mpi" && peer != "gloo")
      throw std::invalid_argument("--peers: unknown peer '" + peer + "' (mpi, gloo; sync with --device)");
}

}  // namespace

std::string_view to_string(Kind kind) { return kind ? tutti::to_string(*kind) : "sendrecv"; }

double bus_factor(Kind kind, int ranks) {
  const double p = ranks;
  switch (kind.value_or(Collective::barrier)) {  // sendrecv: 1
    case Collective::allreduce:
      return ranks > 1 ? 2 * (p - 1) / p : 0;
    case Collective::reduce_scatter:
    case Collective::allgather:
    case Collective::allgatherv:
    case Collective::alltoall:
    case Collective::alltoallv:
    case Collective::gather:
    case Collective::scatter:
      return (p - 1) / p;
    case Collective::barrier:
      return 0;
    default:
      return 1;
  }
}

bool size_is_total(Kind kind) {
  return kind && *kind != Collective::allreduce && *kind != Collective::reduce && *kind != Collective::broadcast &&
         *kind != Collective::barrier;
}

bool reduces(Kind kind) {
  return kind == Collective::allreduce || kind == Collective::reduce_scatter || kind == Collective::reduce;
}

bool rooted(Kind kind) {
  return kind == Collective::broadcast || kind == Collective::reduce || kind == Collective::gather ||
         kind == Collective::scatter;
}

std::optional<DataType> parse_type(const std::string& name) {
  static const std::pair<const char*, DataType> aliases[] = {
      {"float", DataType::f32}, {"half", DataType::f16},   {"bfloat16", DataType::bf16}, {"double", DataType::f64},
      {"int8", DataType::i8},   {"uint8", DataType::u8},   {"int32", DataType::i32},     {"uint32", DataType::u32},
      {"int64", DataType::i64}, {"uint64", DataType::u64}, {"int", DataType::i32}};
  if (auto type = data_type_from_name(name)) return type;
  for (const auto& [alias, type] : aliases)
    if (name == alias) return type;
  return std::nullopt;
}

std::vector<std::size_t> sweep_sizes(const BenchOptions& options) {
  std::vector<std::size_t> sizes;
  double size = static_cast<double>(options.min_bytes);
  while (true) {
    const auto bytes = static_cast<std::size_t>(std::llround(size));
    if (bytes > options.max_bytes) break;
    if (sizes.empty() || bytes != sizes.back()) sizes.push_back(bytes);
    if (options.factor <= 1.0 || bytes == options.max_bytes) break;
    size = std::max(size * options.factor, size + 1);
  }
  return sizes;
}

namespace {

// The flags whose text is read after parsing (lists, names), as given.
struct Text {
  std::string collective, datatype, op, algorithm, density, values, peers;
  std::int64_t factor = 2;
  std::int64_t check = 1;
  int iterations = 0;
};

// The sweep's flags: nccl-tests' short flags where they mean what they mean there; long names only
// where nccl-tests' letter means something else (its -t is threads, its -a the average mode).
void add_sweep_flags(CLI::App& app, BenchOptions& o, Text& t) {
  app.add_option(
      "--collective", t.collective,
      "allreduce, reduce_scatter, allgather, broadcast, reduce, alltoall, allgatherv, alltoallv, gather, scatter, "
      "barrier, sendrecv, a comma-separated "
      "list, or all (default allreduce); or sparse_allreduce: every sparse algorithm beside dense "
      "allreduce");
  tools::add_size(app, "-b,--minbytes", o.min_bytes, "smallest size, e.g. 8, 64K, 1MiB (default 8)");
  tools::add_size(app, "-e,--maxbytes", o.max_bytes, "largest size (default 64M)");
  app.add_option("-f,--stepfactor", t.factor, "size multiplier between rows (default 2)")
      ->transform(tools::number<std::int64_t>());
  app.add_option("-n,--iters", t.iterations, "timed iterations per size (default: enough for ~50 ms, at least 5)")
      ->transform(tools::number<int>());
  app.add_option("-w,--warmup_iters", o.warmup, "warm-up iterations per size (default 5)")
      ->transform(tools::number<int>());
  app.add_option("-d,--datatype", t.datatype,
                 "f32, f16, bf16, f64, i8, u8, i32, u32, i64, u64, a list, or all (default f32)");
  app.add_option("-o,--op", t.op, "sum, prod, min, max, avg, or all (default sum)");
  app.add_option("-r,--root", o.root, "root of broadcast and reduce (default 0)")->transform(tools::number<int>());
  app.add_option("-c,--check", t.check, "0|1: check results in separate iterations (default 1)")
      ->transform(tools::number<std::int64_t>());
  app.add_option("--algorithm", t.algorithm,
                 "force an algorithm (ring, recursive_doubling, rabenseifner, direct, ...)");
  app.add_flag("--all-algorithms", o.all_algorithms, "one row group per algorithm that serves the collective");
  app.add_option("--json", o.json_path, "also write the results as JSON (for tools/plot_bench.py)")->type_name("FILE");
  app.add_option("--peers", t.peers,
                 "time peers in the same run: mpi, gloo (comma-separated); with --device: sync (synchronize, "
                 "copy to the host, host collective, copy back, synchronize: the MPI + CUDA way)");
  app.add_flag("--ceiling", o.ceiling, "measure memory bandwidth and flag latency; show t_bound / t");
  app.add_flag("--per-call", o.per_call,
               "also time each call and report the median call (each rank's median, the largest over ranks) "
               "beside the mean, for Tutti and the peers: a mean well above it is a tail of slow calls "
               "(costs a clock read per call)");
  app.add_flag("--shared-buffers", o.shared_buffers,
               "allocate the buffers with Communicator::allocate (shared memory the peers read in place)");
  app.add_flag("--no-progress", o.quiet_progress, "no progress line on stderr");
  app.add_flag("--corrupt-for-testing", o.corrupt_for_testing)->group("");  // proves the check can fail
}

// The other modes: sparse, device, tuning.
void add_mode_flags(CLI::App& app, BenchOptions& o, Text& t) {
  app.add_option("--density", t.density,
                 "with --collective sparse_allreduce: nnz / dim per rank, in (0, 1], a comma-separated list "
                 "(default 0.01)");
  tools::add_size(app, "--dim", o.sparse_dim,
                  "with --collective sparse_allreduce: the vector's dimension, e.g. 1M (default 1M)");
  app.add_option("--values", t.values,
                 "with --collective sparse_allreduce: qsgd:BITS, also a row of QSGD values (4 or 8 bits, f32, sum "
                 "or avg), checked against every rank's encoding decoded and summed");
  app.add_option("--device", o.device,
                 "host (default), or emulated or cuda: the collectives of gpu::Communicator on device buffers, "
                 "enqueued on a stream");
  app.add_option("--backend", o.backend, "with --device: automatic (default), host_transfer, ipc, nccl");
  app.add_flag("--kernels", o.kernels,
               "with --device, on one rank: the device's reduction kernel (dst = a op b) beside a "
               "device-to-device copy, per -d, -o and size");
  app.add_flag("--overlap", o.overlap,
               "with --device: each row also times the collective (primary form) beside a compute kernel of "
               "about as long on a second stream, and both together (both / max: 1 is perfect overlap)");
  app.add_flag("--calibrate", o.calibrate, "measure the cost model's alpha, beta, gamma for this transport");
  app.add_flag("--tune", o.tune, "sweep every algorithm and write a tuning table (with --calibrate's model)");
  app.add_option("--output", o.output_path, "the tuning file --tune/--calibrate write (default: the per-user path)")
      ->type_name("FILE");
}

// The flags read as text: into the options.
void read_text(const CLI::App& app, const Text& t, BenchOptions& o) {
  o.factor = static_cast<double>(t.factor);
  o.check = t.check != 0;
  if (app.count("-n") > 0) o.iterations = t.iterations;
  if (app.count("--collective") > 0) {
    o.kinds_given = true;
    o.sparse = t.collective == "sparse_allreduce";
    o.all_kinds = t.collective == "all";
    if (!o.sparse) o.kinds = parse_kinds(t.collective);
  }
  if (app.count("-d") > 0) o.types = parse_types(t.datatype);
  if (app.count("-o") > 0) o.ops = parse_ops(t.op);
  if (o.kernels && t.op == "all") std::erase(o.ops, ReduceOp::avg);  // the element-wise ops
  if (app.count("--algorithm") > 0) o.algorithm = parse_algorithm(t.algorithm);
  if (app.count("--density") > 0)
    for (const std::string& d : split_list(t.density)) o.densities.push_back(parse_density(d));
  if (app.count("--values") > 0) o.sparse_qsgd_bits = parse_values(t.values);
  if (app.count("--peers") > 0) o.peers = split_list(t.peers);
}

}  // namespace

std::optional<BenchOptions> parse_options(int argc, char** argv) {
  BenchOptions o;
  for (int i = 0; i < argc; ++i) o.command_line += (i ? " " : "") + std::string(argv[i]);
  CLI::App app("Tutti's collectives measured the way nccl-tests measures them (run under tutti-run or mpirun).",
               "tutti-bench");
  tools::configure(app);
  Text text;
  add_sweep_flags(app, o, text);
  add_mode_flags(app, o, text);
  app.footer("Sizes: bytes, or a whole number with K, M, G, KiB, MiB or GiB (powers of 1024, any case).");
  const std::vector<tools::Renamed> renamed = {{"-t", "--collective"}, {"-a", "--algorithm"}};
  if (!tools::parse(app, argc, argv, renamed)) return std::nullopt;
  read_text(app, text, o);
  if (o.sparse && o.densities.empty()) o.densities = {0.01};
  validate(o);
  if (device_mode(o) && o.all_kinds) o.kinds = device_kinds();
  return o;
}

}  // namespace tutti::bench
