// Helpers of the gpu::Communicator tests on the emulated device: ranks as threads over the
// in-process transport, each with its own emulated device; device buffers; exact comparisons.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

#include "device/device.hpp"
#include "gpu/access.hpp"
#include "gpu/gpu_impl.hpp"
#include "harness.hpp"
#include "test_waits.hpp"
#include "tutti/gpu.hpp"

namespace tutti::testing::gpu {

using tutti::DataType;
using tutti::ErrorCode;
using tutti::ReduceOp;
using tutti::gpu::DeviceKind;
using tutti::gpu::Stream;
using tutti::testing::error_code_of;
using tutti::testing::input_value;
using tutti::testing::reference_reduction;
using namespace std::chrono_literals;

inline constexpr auto deadline = 60s;  // only a hang reaches it
// The backend the collective tests ask for: TUTTI_TEST_GPU_BACKEND (host_transfer or ipc; ctest
// runs the binaries once per backend), else automatic (which takes ipc where it serves the call).
inline tutti::gpu::Backend test_backend() {
  const char* name = std::getenv("TUTTI_TEST_GPU_BACKEND");
  if (name == nullptr || *name == '\0') return tutti::gpu::Backend::automatic;
  if (const auto backend = tutti::gpu::backend_from_name(name)) return *backend;
  throw std::invalid_argument(std::string("TUTTI_TEST_GPU_BACKEND: unknown backend ") + name);
}
// The device the collective tests run on: TUTTI_TEST_GPU_DEVICE=cuda puts every rank (thread) on
// CUDA device 0 (scripts/gpu_check.sh's thread diagnostics, on a machine with a GPU; nccl refuses
// two ranks on one GPU, ipc does not); else the emulated device, one per rank.
inline DeviceKind test_device_kind() {
  const char* name = std::getenv("TUTTI_TEST_GPU_DEVICE");
  if (name == nullptr || *name == '\0' || std::string(name) == "emulated") return DeviceKind::emulated;
  if (std::string(name) == "cuda") return DeviceKind::cuda;
  throw std::invalid_argument(std::string("TUTTI_TEST_GPU_DEVICE: unknown device ") + name);
}
inline const tutti::gpu::Options options{test_backend(), std::chrono::milliseconds(30000)};

inline constexpr DataType all_types[] = {DataType::i8,  DataType::u8,  DataType::i32,  DataType::u32, DataType::i64,
                                         DataType::u64, DataType::f16, DataType::bf16, DataType::f32, DataType::f64};
inline constexpr ReduceOp all_ops[] = {ReduceOp::sum, ReduceOp::prod, ReduceOp::min, ReduceOp::max, ReduceOp::avg};

using Bytes = std::vector<std::byte>;

// Runs fn(gpu communicator, rank) on p threads, one per rank, each with its own emulated device (or
// all on CUDA device 0: test_device_kind).
inline void run_gpu_ranks(int p, const std::function<void(tutti::gpu::Communicator&, int)>& fn) {
  auto hosts = tutti::local_group(p);
  const std::string failures = tutti::testing::on_threads(p, [&](int r) {
    tutti::gpu::Communicator gpu(hosts[static_cast<std::size_t>(r)], test_device_kind());
    fn(gpu, r);
  });
  EXPECT_EQ(failures, "");
}

inline tutti::device::Device& device_of(tutti::gpu::Communicator& gpu) {
  return tutti::gpu::detail::Access::impl(gpu)->device();
}

// Waits for `stream`, then raises a failure recorded since: a result read after a failed operation
// is whatever the released stream copied back, so the failure is what a case must report.
inline void synchronize_checked(tutti::gpu::Communicator& gpu, tutti::gpu::Stream stream) {
  gpu.synchronize(stream, deadline);
  gpu.check();
}

inline Bytes values(DataType type, std::size_t count, const std::function<double(std::size_t)>& value) {
  const std::size_t es = tutti::size_of(type);
  Bytes out(count * es);
  for (std::size_t i = 0; i < count; ++i) tutti::testing::store(type, out.data() + i * es, value(i));
  return out;
}

// A device buffer holding `bytes` bytes (nullptr for 0), freed with the communicator's device.
struct DeviceBuffer {
  tutti::gpu::Communicator& gpu;
  void* data;
  DeviceBuffer(tutti::gpu::Communicator& g, std::size_t bytes) : gpu(g), data(bytes ? g.allocate(bytes) : nullptr) {}
  ~DeviceBuffer() { gpu.free(data); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  std::byte* bytes() const { return static_cast<std::byte*>(data); }
};

// "" or where `got` first differs from `want`.
inline std::string compare(const Bytes& got, const Bytes& want, DataType type, const std::string& what) {
  const std::size_t es = tutti::size_of(type);
  for (std::size_t i = 0; i < want.size(); i += es)
    if (std::memcmp(got.data() + i, want.data() + i, es) != 0)
      return what + ": element " + std::to_string(i / es) + " is " +
             std::to_string(tutti::testing::load(type, got.data() + i)) + ", expected " +
             std::to_string(tutti::testing::load(type, want.data() + i));
  return "";
}

// Throws (through the harness, naming the rank) at the first element that differs.
inline void expect_equal(const Bytes& output, const Bytes& expected, DataType type, const std::string& what) {
  const std::string diff = compare(output, expected, type, what);
  if (!diff.empty()) throw std::runtime_error(diff);
}

}  // namespace tutti::testing::gpu
