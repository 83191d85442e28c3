// tutti-bench's command line, in the spirit of nccl-tests (-b/-e/-f, -n/-w, -d, -o, -r, -c; --collective
// and --algorithm have no letter: nccl-tests' -t and -a mean threads and the average mode).
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <vector>

#include "tutti/types.hpp"

namespace tutti::bench {

/// What tutti-bench can time: a collective (the library's own Collective), or point to point,
/// `sendrecv`, which is none: rank r sends to r+1 and receives from r-1, as nccl-tests' sendrecv.
using Kind = std::optional<Collective>;
inline constexpr Kind sendrecv = std::nullopt;

std::string_view to_string(Kind kind);
/// busbw = algbw × this factor (BENCHMARKS.md).
double bus_factor(Kind kind, int ranks);
/// Whether `size(B)` counts all ranks' blocks (every collective with blocks: reduce_scatter, the
/// allgathers, the alltoalls, gather, scatter) rather than one buffer (allreduce, reduce, broadcast).
bool size_is_total(Kind kind);
bool reduces(Kind kind);
/// Whether the collective has a root (broadcast, reduce, gather, scatter).
bool rooted(Kind kind);

struct BenchOptions {
  std::vector<Kind> kinds{Collective::allreduce};
  bool kinds_given = false;  // --collective was given
  bool all_kinds = false;    // --collective all (device mode: every collective gpu::Communicator has)
  std::size_t min_bytes = 8;
  std::size_t max_bytes = 64 << 20;
  double factor = 2;
  std::optional<int> iterations;  // unset: enough for about 50 ms per measurement, at least 5
  int warmup = 5;
  std::vector<DataType> types{DataType::f32};
  std::vector<ReduceOp> ops{ReduceOp::sum};
  int root = 0;
  bool check = true;
  Algorithm algorithm = Algorithm::automatic;
  bool all_algorithms = false;
  std::string json_path;
  std::vector<std::string> peers;     // "mpi", "gloo"; in device mode "sync"
  std::string device = "host";        // --device: host, emulated or cuda (device mode: gpu::Communicator)
  std::string backend = "automatic";  // --backend (device mode only)
  bool kernels = false;               // --kernels: the device's reduction kernels beside a D2D copy
  bool overlap = false;               // --overlap: each row's collective beside compute on a second stream
  bool ceiling = false;
  bool shared_buffers = false;  // --shared-buffers: buffers from Communicator::allocate
  bool calibrate = false;
  bool tune = false;
  std::string output_path;  // --calibrate/--tune: the tuning file ("" = the per-user default)
  bool quiet_progress = false;
  bool corrupt_for_testing = false;  // --corrupt-for-testing: rank 0 flips a result byte in checks
  bool primary_only = false;         // time only the form peers compare (the tuner's sweeps)
  bool per_call = false;             // --per-call: also the median call (Measure::median)
  bool sparse = false;               // --collective sparse_allreduce: the sparse table (bench/sparse_bench.hpp)
  std::vector<double> densities;     // --density: nnz / dim per rank
  std::size_t sparse_dim = std::size_t{1} << 20;  // --dim
  int sparse_qsgd_bits = 0;                       // --values qsgd:BITS (0: exact values only)
  std::string command_line;
};

/// Whether the run goes through gpu::Communicator on device buffers (--device emulated|cuda).
inline bool device_mode(const BenchOptions& options) { return options.device != "host"; }

/// Parses argv (flags, or --config FILE); throws std::invalid_argument with a message naming the
/// flag on bad input. Returns nullopt after printing the usage for -h/--help.
std::optional<BenchOptions> parse_options(int argc, char** argv);

/// "f32" → DataType::f32 (also the nccl-tests names float, half, bfloat16, double, int8, uint8,
/// int32, uint32, int64, uint64).
std::optional<DataType> parse_type(const std::string& name);

/// The sizes of the sweep: min, min·f, … up to max (max included when f reaches it).
std::vector<std::size_t> sweep_sizes(const BenchOptions& options);

}  // namespace tutti::bench
