#include "bench/options.hpp"

#include <cmath>
#include <cstdio>
#include <stdexcept>
#include <string_view>

#include "bench/device_collectives.hpp"
#include "comm/tuning.hpp"
#include "core/names.hpp"
#include "tutti/compress.hpp"

namespace tutti::bench {

namespace {

constexpr const char* usage_text = R"(usage: tutti-bench [flags]   (run under tutti-run or mpirun)

  -t, --collective NAME   allreduce, reduce_scatter, allgather, broadcast, reduce, alltoall,
                          sendrecv, a comma-separated list, or all (default allreduce);
                          or sparse_allreduce: every sparse algorithm beside dense allreduce
      --density D[,D...]  with sparse_allreduce: nnz / dim per rank, in (0, 1] (default 0.01)
      --dim N             with sparse_allreduce: the vector's dimension, e.g. 1M (default 1M)
      --values qsgd:BITS  with sparse_allreduce: also a row of QSGD values (4 or 8 bits, f32, sum
                          or avg), checked against every rank's encoding decoded and summed
  -b, --minbytes SIZE     smallest size, e.g. 8, 64K, 1M (default 8)
  -e, --maxbytes SIZE     largest size (default 64M)
  -f, --stepfactor F      size multiplier between rows (default 2)
  -n, --iters N           timed iterations per size (default: enough for ~50 ms, at least 5)
  -w, --warmup_iters N    warm-up iterations per size (default 5)
  -d, --datatype TYPE     f32, f16, bf16, f64, i8, u8, i32, u32, i64, u64, or all (default f32)
  -o, --op OP             sum, prod, min, max, avg, or all (default sum)
                          (with --tune/--calibrate: -o FILE is the tuning file to write)
  -r, --root R            root of broadcast and reduce (default 0)
  -c, --check 0|1         check results in separate iterations (default 1)
  -a, --algorithm NAME    force an algorithm (ring, recursive_doubling, rabenseifner, direct, ...)
      --all-algorithms    one row group per algorithm that serves the collective
      --json FILE         also write the results as JSON (for tools/plot_bench.py)
      --peers LIST        time peers in the same run: mpi, gloo (comma-separated);
                          with --device: sync (synchronize, copy to the host, host collective,
                          copy back, synchronize: the MPI + CUDA way)
      --device KIND       host (default), or emulated or cuda: the collectives of
                          gpu::Communicator on device buffers, enqueued on a stream
      --backend NAME      with --device: automatic (default), host_transfer, ipc, nccl
      --kernels           with --device, on one rank: the device's reduction kernel
                          (dst = a op b) beside a device-to-device copy, per -d, -o and size
      --ceiling           measure memory bandwidth and flag latency; show t_bound / t
      --shared-buffers    allocate the buffers with Communicator::allocate (shared
                          memory the peers read in place: zero copy on shm)
      --calibrate         measure the cost model's alpha, beta, gamma for this transport
      --tune              sweep every algorithm and write a tuning table (with --calibrate's model)
      --output FILE       the tuning file --tune/--calibrate write (default: the per-user path)
      --no-progress       no progress line on stderr
  -h, --help              this text
)";

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

// `convert` (std::stol, std::stod) over the whole of `text`, else invalid_argument naming the flag.
template <class Convert>
auto parse_number(const std::string& text, const char* flag, const char* what, Convert convert) {
  std::size_t used = 0;
  decltype(convert(text, &used)) value{};
  try {
    value = convert(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != text.size() || text.empty())
    throw std::invalid_argument(std::string(flag) + ": expected " + what + ", got '" + text + "'");
  return value;
}

long parse_int(const std::string& text, const char* flag) {
  return parse_number(text, flag, "an integer",
                      [](const std::string& t, std::size_t* used) { return std::stol(t, used); });
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
  return parse_number(text, "--density", "a number",
                      [](const std::string& t, std::size_t* used) { return std::stod(t, used); });
}

std::vector<Kind> parse_kinds(const std::string& text) {
  constexpr Kind all[] = {Collective::allreduce,
                          Collective::reduce_scatter,
                          Collective::allgather,
                          Collective::broadcast,
                          Collective::reduce,
                          Collective::alltoall,
                          sendrecv};
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
    if (!type) throw std::invalid_argument("-d: unknown type '" + name + "'");
    out.push_back(*type);
  }
  return out;
}

std::vector<ReduceOp> parse_ops(const std::string& text) {
  std::vector<ReduceOp> out;
  for (int o = 0; o <= static_cast<int>(ReduceOp::avg); ++o)
    if (text == "all" || text == to_string(static_cast<ReduceOp>(o))) out.push_back(static_cast<ReduceOp>(o));
  if (out.empty()) throw std::invalid_argument("-o: unknown op '" + text + "' (sum, prod, min, max, avg, all)");
  return out;
}

Algorithm parse_algorithm(const std::string& name) {
  if (const auto a = core::algorithm_from_name(name)) return *a;
  throw std::invalid_argument("-a: unknown algorithm '" + name + "'");
}

// Device mode runs what gpu::Communicator has, on the backends it has, beside the sync peer.
void validate_device(const BenchOptions& o) {
  if (o.device != "emulated" && o.device != "cuda")
    throw std::invalid_argument("--device: unknown device '" + o.device + "' (host, emulated, cuda)");
  check_backend(o.backend);
  if (o.kernels) {
    if (o.kinds_given) throw std::invalid_argument("--kernels: times the reduction kernels, not a collective (no -t)");
    if (!o.peers.empty()) throw std::invalid_argument("--kernels: no peers (every row times the D2D copy beside it)");
    if (o.backend != "automatic")
      throw std::invalid_argument("--kernels: no --backend (the kernels run on the device, not through a backend)");
  }
  if (o.algorithm != Algorithm::automatic || o.all_algorithms)
    throw std::invalid_argument("-a/--all-algorithms: host mode only (with --device, choose a --backend)");
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
        "-t sparse_allreduce: host mode only, without peers, --ceiling, --json, -a or --tune (every sparse "
        "algorithm is timed)");
  if (o.sparse_dim == 0 || o.sparse_dim > (std::size_t{1} << 32))
    throw std::invalid_argument("--dim: must be in [1, 2^32] (u32 indices)");
  for (double d : o.densities)
    if (!(d > 0 && d <= 1)) throw std::invalid_argument("--density: each must be in (0, 1]");
}

void validate(const BenchOptions& o) {
  if (o.sparse) return validate_sparse(o);
  if (!o.densities.empty()) throw std::invalid_argument("--density: only with -t sparse_allreduce");
  if (o.sparse_qsgd_bits != 0) throw std::invalid_argument("--values: only with -t sparse_allreduce");
  if (o.min_bytes > o.max_bytes) throw std::invalid_argument("-b must not exceed -e");
  if (o.factor <= 1.0 && o.min_bytes != o.max_bytes) throw std::invalid_argument("-f must be greater than 1");
  if (o.iterations && *o.iterations < 1) throw std::invalid_argument("-n must be at least 1");
  if (o.warmup < 0) throw std::invalid_argument("-w must not be negative");
  if (o.root < 0) throw std::invalid_argument("-r must not be negative");
  if (o.kernels && !device_mode(o)) throw std::invalid_argument("--kernels: only with --device emulated or cuda");
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
    case Collective::alltoall:
      return (p - 1) / p;
    default:
      return 1;
  }
}

bool size_is_total(Kind kind) {
  return kind == Collective::reduce_scatter || kind == Collective::allgather || kind == Collective::alltoall;
}

bool reduces(Kind kind) {
  return kind == Collective::allreduce || kind == Collective::reduce_scatter || kind == Collective::reduce;
}

std::optional<DataType> parse_type(const std::string& name) {
  static const std::pair<const char*, DataType> aliases[] = {
      {"float", DataType::f32}, {"half", DataType::f16},   {"bfloat16", DataType::bf16}, {"double", DataType::f64},
      {"int8", DataType::i8},   {"uint8", DataType::u8},   {"int32", DataType::i32},     {"uint32", DataType::u32},
      {"int64", DataType::i64}, {"uint64", DataType::u64}, {"int", DataType::i32}};
  if (auto type = core::data_type_from_name(name)) return type;
  for (const auto& [alias, type] : aliases)
    if (name == alias) return type;
  return std::nullopt;
}

std::size_t parse_bytes(const std::string& text, const char* flag) {
  if (text.empty()) throw std::invalid_argument(std::string(flag) + ": expected a size");
  std::size_t multiplier = 1;
  std::string digits = text;
  switch (text.back()) {
    case 'K':
    case 'k':
      multiplier = std::size_t{1} << 10;
      break;
    case 'M':
    case 'm':
      multiplier = std::size_t{1} << 20;
      break;
    case 'G':
    case 'g':
      multiplier = std::size_t{1} << 30;
      break;
    default:
      break;
  }
  if (multiplier != 1) digits.pop_back();
  const long value = parse_int(digits, flag);
  if (value < 0) throw std::invalid_argument(std::string(flag) + ": size must not be negative");
  return static_cast<std::size_t>(value) * multiplier;
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

std::optional<BenchOptions> parse_options(int argc, char** argv) {
  BenchOptions o;
  for (int i = 0; i < argc; ++i) o.command_line += (i ? " " : "") + std::string(argv[i]);
  std::vector<std::string> args(argv + 1, argv + argc);
  for (const std::string& a : args)
    if (a == "--tune" || a == "--calibrate")
      o.tune = o.tune || a == "--tune", o.calibrate = o.calibrate || a == "--calibrate";
  const bool tuning = o.tune || o.calibrate;
  for (std::size_t i = 0; i < args.size(); ++i) {
    const std::string& flag = args[i];
    auto value = [&]() -> const std::string& {
      if (i + 1 >= args.size()) throw std::invalid_argument(flag + ": missing value");
      return args[++i];
    };
    if (flag == "-h" || flag == "--help") {
      std::fputs(usage_text, stdout);
      return std::nullopt;
    } else if (flag == "-t" || flag == "--collective") {
      const std::string& text = value();
      o.sparse = text == "sparse_allreduce";
      o.all_kinds = text == "all";
      if (!o.sparse) o.kinds = parse_kinds(text);
      o.kinds_given = true;
    } else if (flag == "-b" || flag == "--minbytes") {
      o.min_bytes = parse_bytes(value(), "-b");
    } else if (flag == "-e" || flag == "--maxbytes") {
      o.max_bytes = parse_bytes(value(), "-e");
    } else if (flag == "-f" || flag == "--stepfactor") {
      o.factor = static_cast<double>(parse_int(value(), "-f"));
    } else if (flag == "-n" || flag == "--iters") {
      o.iterations = static_cast<int>(parse_int(value(), "-n"));
    } else if (flag == "-w" || flag == "--warmup_iters") {
      o.warmup = static_cast<int>(parse_int(value(), "-w"));
    } else if (flag == "-d" || flag == "--datatype") {
      o.types = parse_types(value());
    } else if ((flag == "-o" && tuning) || flag == "--output") {
      o.output_path = value();
    } else if (flag == "-o" || flag == "--op") {
      o.ops = parse_ops(value());
    } else if (flag == "-r" || flag == "--root") {
      o.root = static_cast<int>(parse_int(value(), "-r"));
    } else if (flag == "-c" || flag == "--check") {
      o.check = parse_int(value(), "-c") != 0;
    } else if (flag == "-a" || flag == "--algorithm") {
      o.algorithm = parse_algorithm(value());
    } else if (flag == "--density") {
      for (const std::string& d : split_list(value())) o.densities.push_back(parse_density(d));
    } else if (flag == "--dim") {
      o.sparse_dim = parse_bytes(value(), "--dim");
    } else if (flag == "--values") {
      o.sparse_qsgd_bits = parse_values(value());
    } else if (flag == "--all-algorithms") {
      o.all_algorithms = true;
    } else if (flag == "--json") {
      o.json_path = value();
    } else if (flag == "--peers") {
      o.peers = split_list(value());
    } else if (flag == "--device") {
      o.device = value();
    } else if (flag == "--backend") {
      o.backend = value();
    } else if (flag == "--kernels") {
      o.kernels = true;
    } else if (flag == "--ceiling") {
      o.ceiling = true;
    } else if (flag == "--shared-buffers") {
      o.shared_buffers = true;
    } else if (flag == "--tune" || flag == "--calibrate") {
    } else if (flag == "--corrupt-for-testing") {  // proves the check can fail; not in --help
      o.corrupt_for_testing = true;
    } else if (flag == "--no-progress") {
      o.quiet_progress = true;
    } else {
      throw std::invalid_argument("unknown flag '" + flag + "' (see --help)");
    }
  }
  if (o.sparse && o.densities.empty()) o.densities = {0.01};
  validate(o);
  if (device_mode(o) && o.all_kinds) o.kinds = device_kinds();
  return o;
}

}  // namespace tutti::bench
