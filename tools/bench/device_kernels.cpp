#include "bench/device_kernels.hpp"

#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <stdexcept>
#include <vector>

namespace tutti::bench {

namespace {

struct KernelRow {
  std::size_t bytes = 0, count = 0;  // one buffer's bytes and elements
  DataType type = DataType::f32;
  ReduceOp op = ReduceOp::sum;
  double reduce = 0, copy = 0;  // seconds per call
  bool checked = false;
  std::size_t wrong = 0;
  // Reduce: a and b read, dst written (3 x bytes); copy: src read, dst written (2 x bytes).
  double reduce_rate() const { return reduce > 0 ? 3.0 * static_cast<double>(bytes) / reduce / 1e9 : 0; }
  double copy_rate() const { return copy > 0 ? 2.0 * static_cast<double>(bytes) / copy / 1e9 : 0; }
  double ratio() const { return copy_rate() > 0 ? reduce_rate() / copy_rate() : 0; }
};

template <class T>
void put(std::byte* at, T value) {
  std::memcpy(at, &value, sizeof(T));
}

// Reproducible inputs: finite floats with fractional parts (so that f16/bf16 round), random bits
// for the integer types (sum and prod wrap).
std::vector<std::byte> make_input(DataType type, std::size_t count, std::uint64_t seed) {
  const std::size_t size = size_of(type);
  std::vector<std::byte> out(count * size);
  std::mt19937_64 rng(seed);
  for (std::size_t i = 0; i < count; ++i) {
    const std::uint64_t bits = rng();
    const double v = static_cast<double>(static_cast<std::int64_t>(bits % 4001) - 2000) / 64;
    std::byte* at = out.data() + i * size;
    switch (type) {
      case DataType::f16:
        put(at, f16(static_cast<float>(v)));
        break;
      case DataType::bf16:
        put(at, bf16(static_cast<float>(v)));
        break;
      case DataType::f32:
        put(at, static_cast<float>(v));
        break;
      case DataType::f64:
        put(at, v);
        break;
      default:
        std::memcpy(at, &bits, size);
        break;
    }
  }
  return out;
}

// Elements of `got` whose bytes differ from `want`'s.
std::size_t count_wrong(const std::vector<std::byte>& got, const std::vector<std::byte>& want, std::size_t size) {
  std::size_t wrong = 0;
  for (std::size_t i = 0; i < got.size(); i += size) wrong += std::memcmp(got.data() + i, want.data() + i, size) != 0;
  return wrong;
}

KernelRow measure(DeviceContext& context, DataType type, ReduceOp op, std::size_t count) {
  KernelRow row{.bytes = count * size_of(type), .count = count, .type = type, .op = op};
  gpu::Communicator& device = context.gpu;
  const gpu::Stream stream = context.stream;
  const std::vector<std::byte> a = make_input(type, count, 1), b = make_input(type, count, 2);
  const DeviceMemory da(context.gpu, row.bytes), db(context.gpu, row.bytes), dst(context.gpu, row.bytes);
  device.copy(da.get(), a.data(), row.bytes, stream);
  device.copy(db.get(), b.data(), row.bytes, stream);
  context.synchronize();

  const auto reduce = [&] { device.reduce_local(dst.get(), da.get(), db.get(), count, type, op, stream); };
  const auto copy = [&] { device.copy(dst.get(), da.get(), row.bytes, stream); };
  const int warmup = context.options.warmup;
  row.reduce = time_stream(context, reduce, warmup, choose_stream_iterations(context, reduce)).time;
  row.copy = time_stream(context, copy, warmup, choose_stream_iterations(context, copy)).time;

  if (!context.options.check) return row;
  // One reduce into a poisoned dst, copied back over a differently poisoned host buffer.
  std::vector<std::byte> got(row.bytes, std::byte{0x5a});
  const std::vector<std::byte> poison(row.bytes, std::byte{0xa5});
  device.copy(dst.get(), poison.data(), row.bytes, stream);
  reduce();
  device.copy(got.data(), dst.get(), row.bytes, stream);
  context.synchronize();
  context.gpu.check();
  if (context.options.corrupt_for_testing) got[0] ^= std::byte{1};
  std::vector<std::byte> want(row.bytes);
  reduce_local(want.data(), a.data(), b.data(), count, type, op);
  row.checked = true;
  row.wrong = count_wrong(got, want, size_of(type));
  return row;
}

void print_header(const std::string& device_name) {
  std::printf("#\n# Reduction kernel dst = a op b on device %s, beside a D2D copy dst = src, one stream\n#\n",
              device_name.c_str());
  std::printf("# %10s %12s %6s %6s %19s %19s %8s %6s\n", "", "", "", "", "reduce", "d2d copy", "", "");
  std::printf("# %10s %12s %6s %6s %10s %8s %10s %8s %8s %6s\n", "size", "count", "type", "redop", "time", "GB/s",
              "time", "GB/s", "red/copy", "#wrong");
  std::printf("# %10s %12s %6s %6s %10s %8s %10s %8s %8s %6s\n", "(B)", "(elements)", "", "", "(us)", "(3 x B)", "(us)",
              "(2 x B)", "", "");
  std::fflush(stdout);
}

void print_row(const KernelRow& row) {
  std::printf("  %10zu %12zu %6s %6s %10.2f %8.2f %10.2f %8.2f %8.3f", row.bytes, row.count,
              std::string(to_string(row.type)).c_str(), std::string(to_string(row.op)).c_str(), row.reduce * 1e6,
              row.reduce_rate(), row.copy * 1e6, row.copy_rate(), row.ratio());
  if (row.checked)
    std::printf(" %6zu\n", row.wrong);
  else
    std::printf(" %6s\n", "N/A");
  std::fflush(stdout);
}

void print_footer(const std::vector<KernelRow>& rows, const std::string& device_name, std::size_t wrong) {
  const KernelRow* largest = nullptr;
  for (const KernelRow& row : rows)
    if (!largest || row.bytes > largest->bytes) largest = &row;
  std::printf("# Device               : %s%s\n", device_name.c_str(),
              device_name == "emulated" ? " (functional only: its timings say nothing about a GPU)" : "");
  if (largest)
    std::printf(
        "# D2D copy ceiling     : %.2f GB/s read + write at %zu B; the %s %s kernel there: %.2f GB/s (%.3f of it)\n",
        largest->copy_rate(), largest->bytes, std::string(to_string(largest->type)).c_str(),
        std::string(to_string(largest->op)).c_str(), largest->reduce_rate(), largest->ratio());
  std::printf("# Out of bounds values : %zu %s\n#\n", wrong, wrong == 0 ? "OK" : "ERROR");
  std::fflush(stdout);
}

void write_json(const std::vector<KernelRow>& rows, const BenchOptions& options, const std::string& device_name,
                const std::string& launcher) {
  using nlohmann::json;
  char host[256] = {};
  ::gethostname(host, sizeof(host) - 1);
  json doc = {{"tool", "tutti-bench"},
              {"version", 1},
              {"mode", "kernels"},
              {"host", host},
              {"ranks", 1},
              {"launcher", launcher},
              {"device", device_name},
              {"command", options.command_line},
              {"results", json::array()}};
  for (const KernelRow& row : rows) {
    json r = {{"type", std::string(to_string(row.type))},
              {"op", std::string(to_string(row.op))},
              {"bytes", row.bytes},
              {"count", row.count},
              {"reduce_us", row.reduce * 1e6},
              {"reduce_GBps", row.reduce_rate()},
              {"copy_us", row.copy * 1e6},
              {"copy_GBps", row.copy_rate()},
              {"reduce_over_copy", row.ratio()}};
    if (row.checked) r["wrong"] = row.wrong;
    doc["results"].push_back(std::move(r));
  }
  std::ofstream out(options.json_path);
  out << doc.dump(1) << "\n";
  if (!out) throw std::runtime_error("--json: cannot write " + options.json_path);
}

}  // namespace

int run_kernels(DeviceContext& context, const std::string& device_name, const std::string& launcher) {
  const BenchOptions& options = context.options;
  print_header(device_name);
  std::vector<KernelRow> rows;
  std::size_t wrong = 0;
  for (DataType type : options.types) {
    for (ReduceOp op : options.ops) {
      std::size_t last = 0;
      for (std::size_t bytes : sweep_sizes(options)) {
        const std::size_t count = bytes / size_of(type);
        if (count == 0 || count == last) continue;  // no element, or rounded to the row before
        last = count;
        rows.push_back(measure(context, type, op, count));
        wrong += rows.back().wrong;
        print_row(rows.back());
      }
    }
  }
  print_footer(rows, device_name, wrong);
  if (!options.json_path.empty()) write_json(rows, options, device_name, launcher);
  return wrong == 0 ? 0 : 1;
}

}  // namespace tutti::bench
