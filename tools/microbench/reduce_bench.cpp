// Throughput of the reduction kernels, beside memcpy's on the same buffers.
//
// How to read it:
// - `memcpy/<size>` copies a `size`-byte buffer: 2 x size bytes per call (read + write).
// - `<type>_<op>/<isa>/<size>` is dst = a op b over `size`-byte buffers: 3 x size bytes per call
//   (read a, read b, write dst). `_inplace` rows are a = a op b, the usual case inside a
//   collective. Rows for an ISA other than the one `reduce::apply` picked (`reduce_isa` in the
//   header) run that ISA's kernels, to compare paths; the others run `reduce::apply` itself.
// - GB/s is 10^9 of those bytes per second of CPU time (Google Benchmark's default; on an idle
//   machine CPU and wall time agree, compare the Time and CPU columns). bytes_per_second is the
//   same in 2^30 units. vs_memcpy is the row's GB/s over memcpy's at the same size in the same
//   run: near 1, the kernel moves bytes as fast as memcpy, i.e. it is memory-bound.
// - Sizes are per buffer. 32 KiB (96 KiB in all) stays in L1/L2 and shows the kernels' compute
//   speed, 1 MiB in L2/L3, 64 MiB in DRAM. For copies this large glibc's memcpy uses non-temporal
//   stores, which skip the read for ownership that the kernels' ordinary stores pay on an
//   out-of-place dst (3 counted bytes move 4; in place, dst is already in cache). The kernels keep
//   ordinary stores because in a collective the result is read again soon. So at 64 MiB
//   vs_memcpy compares two store strategies and can land on either side of 1.
//
// Run: reduce_bench [--benchmark_filter=f32_sum] [--benchmark_repetitions=3]
#include <benchmark/benchmark.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <unistd.h>

#include "reduce/dispatch.hpp"
#include "reduce/reduce.hpp"
#include "tutti/types.hpp"

namespace {

using tutti::DataType;
using tutti::ReduceOp;
using tutti::reduce::Isa;
namespace reduce = tutti::reduce;

constexpr std::size_t sizes[] = {std::size_t(32) << 10, std::size_t(1) << 20, std::size_t(64) << 20};

std::string size_label(std::size_t bytes) {
  return bytes >= (1u << 20) ? std::to_string(bytes >> 20) + "MiB" : std::to_string(bytes >> 10) + "KiB";
}

// One 64-byte-aligned allocation per buffer, kept for the whole run.
struct Buffers {
  explicit Buffers(std::size_t bytes) : a(alloc(bytes)), b(alloc(bytes)), dst(alloc(bytes)) {}
  static std::unique_ptr<std::byte[]> alloc(std::size_t bytes) {
    auto p = std::unique_ptr<std::byte[]>(new (std::align_val_t(64)) std::byte[bytes]);
    std::memset(p.get(), 0, bytes);  // touch every page before timing
    return p;
  }
  std::unique_ptr<std::byte[]> a, b, dst;
};

Buffers& buffers(std::size_t bytes) {
  static std::map<std::size_t, std::unique_ptr<Buffers>> cache;
  auto& slot = cache[bytes];
  if (!slot) slot = std::make_unique<Buffers>(bytes);
  return *slot;
}

// Ordinary gradient-like values (no NaN, no subnormals, which would time something else).
void fill(std::byte* p, DataType type, std::size_t count, int seed) {
  for (std::size_t i = 0; i < count; ++i) {
    const float value = static_cast<float>(static_cast<int>((i * 37 + seed) % 2001) - 1000) * 0.01f;
    switch (type) {
      case DataType::f32:
        reinterpret_cast<float*>(p)[i] = value;
        break;
      case DataType::f64:
        reinterpret_cast<double*>(p)[i] = value;
        break;
      case DataType::f16:
        reinterpret_cast<std::uint16_t*>(p)[i] = tutti::detail::float_to_f16_bits(value);
        break;
      case DataType::bf16:
        reinterpret_cast<std::uint16_t*>(p)[i] = tutti::detail::float_to_bf16_bits(value);
        break;
      case DataType::i32:
        reinterpret_cast<std::int32_t*>(p)[i] = static_cast<std::int32_t>(i * 7 + seed);
        break;
      default:
        std::memset(p + i * tutti::size_of(type), seed, tutti::size_of(type));
        break;
    }
  }
}

void set_rate(benchmark::State& state, double bytes_per_call) {
  state.SetBytesProcessed(static_cast<std::int64_t>(bytes_per_call * static_cast<double>(state.iterations())));
  state.counters["GB/s"] = benchmark::Counter(bytes_per_call / 1e9, benchmark::Counter::kIsIterationInvariantRate);
}

void bench_memcpy(benchmark::State& state, std::size_t bytes) {
  Buffers& buf = buffers(bytes);
  for (auto _ : state) {
    std::memcpy(buf.dst.get(), buf.a.get(), bytes);
    benchmark::ClobberMemory();
  }
  set_rate(state, 2.0 * static_cast<double>(bytes));
}

struct Kernel {
  DataType type;
  ReduceOp op;
  bool in_place;
};

// `isa` null: reduce::apply as the library calls it; otherwise that ISA's kernels.
void bench_kernel(benchmark::State& state, Kernel k, const Isa* isa, std::size_t bytes) {
  Buffers& buf = buffers(bytes);
  const std::size_t count = bytes / tutti::size_of(k.type);
  fill(buf.a.get(), k.type, count, 1);
  fill(buf.b.get(), k.type, count, 2);
  void* dst = k.in_place ? buf.a.get() : buf.dst.get();
  // In place, a keeps growing; sums of these values stay finite for far more calls than a run makes.
  for (auto _ : state) {
    if (isa)
      reduce::apply_with(*isa, k.op, k.type, dst, buf.a.get(), buf.b.get(), count);
    else
      reduce::apply(k.op, k.type, dst, buf.a.get(), buf.b.get(), count);
    benchmark::ClobberMemory();
  }
  set_rate(state, 3.0 * static_cast<double>(bytes));
}

const char* type_name(DataType type) {
  constexpr const char* names[] = {"i8", "u8", "i32", "u32", "i64", "u64", "f16", "bf16", "f32", "f64"};
  return names[static_cast<int>(type)];
}
const char* op_name(ReduceOp op) {
  constexpr const char* names[] = {"sum", "prod", "min", "max", "avg"};
  return names[static_cast<int>(op)];
}

void register_all() {
  const Kernel library_kernels[] = {
      {DataType::f32, ReduceOp::sum, false},  {DataType::f32, ReduceOp::sum, true},
      {DataType::bf16, ReduceOp::sum, false}, {DataType::bf16, ReduceOp::sum, true},
      {DataType::f16, ReduceOp::sum, false},  {DataType::f64, ReduceOp::sum, false},
      {DataType::i32, ReduceOp::sum, false},  {DataType::f32, ReduceOp::max, false},
  };
  const Kernel per_isa_kernels[] = {{DataType::f32, ReduceOp::sum, false},
                                    {DataType::bf16, ReduceOp::sum, false},
                                    {DataType::f16, ReduceOp::sum, false}};
  static const Isa isas[] = {Isa::generic, Isa::avx2, Isa::avx512};
  const Isa active = reduce::active_isa();

  for (const std::size_t bytes : sizes) {
    const std::string size = std::string("/").append(size_label(bytes));  // not "/" + ...: GCC 12 -O3 warns falsely
    benchmark::RegisterBenchmark(("memcpy" + size).c_str(), bench_memcpy, bytes);
    for (const Kernel& k : library_kernels) {
      const std::string name = std::string(type_name(k.type)) + "_" + op_name(k.op) + (k.in_place ? "_inplace" : "");
      benchmark::RegisterBenchmark((name + "/" + reduce::name(active) + size).c_str(), bench_kernel, k, nullptr, bytes);
    }
    for (const Isa& isa : isas) {
      if (isa == active || !reduce::supported(isa)) continue;
      for (const Kernel& k : per_isa_kernels) {
        const std::string name = std::string(type_name(k.type)) + "_" + op_name(k.op) + "/" + reduce::name(isa);
        benchmark::RegisterBenchmark((name + size).c_str(), bench_kernel, k, &isa, bytes);
      }
    }
  }
}

// The console output plus a vs_memcpy column: each row's GB/s over the memcpy row of its size
// (registered first, so already reported).
class VsMemcpyReporter : public benchmark::ConsoleReporter {
 public:
  VsMemcpyReporter() : ConsoleReporter(isatty(STDOUT_FILENO) ? OO_ColorTabular : OO_Tabular) {}

  void ReportRuns(const std::vector<Run>& reports) override {
    std::vector<Run> runs = reports;
    for (Run& run : runs) {
      const std::string name = run.run_name.str();
      const std::string key = name.substr(name.rfind('/') + 1) + "|" + run.aggregate_name;
      const auto rate = run.counters.find("GB/s");
      if (rate == run.counters.end()) continue;
      if (name.rfind("memcpy/", 0) == 0)
        memcpy_rate_[key] = rate->second.value;
      else if (memcpy_rate_.count(key) && memcpy_rate_[key] > 0)
        run.counters["vs_memcpy"] = benchmark::Counter(rate->second.value / memcpy_rate_[key]);
    }
    ConsoleReporter::ReportRuns(runs);
  }

 private:
  std::map<std::string, double> memcpy_rate_;
};

}  // namespace

int main(int argc, char** argv) {
  // Our column only makes sense on the console; --benchmark_format=json/csv get the stock reporter.
  bool console = true;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg.rfind("--benchmark_format=", 0) == 0) console = arg == "--benchmark_format=console";
  }
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  register_all();
  benchmark::AddCustomContext("reduce_isa", reduce::isa());
  if (console) {
    VsMemcpyReporter reporter;
    benchmark::RunSpecifiedBenchmarks(&reporter);
  } else {
    benchmark::RunSpecifiedBenchmarks();
  }
  benchmark::Shutdown();
  return 0;
}
