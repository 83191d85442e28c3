#include "device/cuda/runtime.hpp"

#include <cstdint>
#include <cstring>
#include <limits>

#include "reduce/reduce.hpp"

namespace tutti::device::cuda {

void check(cudaError_t status, const char* function) {
  if (status == cudaSuccess) return;
  cudaGetLastError();  // clears a non-sticky error
  throw Error(ErrorCode::system, std::string("tutti::device::") + function + " (cuda): " + cudaGetErrorName(status) +
                                     ": " + cudaGetErrorString(status));
}

void check(CUresult status, const char* function) {
  if (status != CUDA_SUCCESS)
    throw Error(ErrorCode::system,
                std::string("tutti::device::") + function + " (cuda): driver error " + std::to_string(status));
}

kernels::DefaultNan host_default_nan() {
  const float f[2] = {std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity()};
  const double d[2] = {std::numeric_limits<double>::infinity(), -std::numeric_limits<double>::infinity()};
  float fr = 0;
  double dr = 0;
  reduce::apply(ReduceOp::sum, DataType::f32, &fr, &f[0], &f[1], 1);
  reduce::apply(ReduceOp::sum, DataType::f64, &dr, &d[0], &d[1], 1);
  return {kernels::bits_as<std::uint32_t>(fr), kernels::bits_as<std::uint64_t>(dr)};
}

void* driver_entry_point(const char* symbol) {
  void* entry = nullptr;
  cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
  const cudaError_t status = cudaGetDriverEntryPointByVersion(symbol, &entry, 12000, cudaEnableDefault, &found);
  if (status != cudaSuccess || found != cudaDriverEntryPointSuccess || entry == nullptr)
    throw Error(ErrorCode::unsupported, std::string("tutti::device (cuda): the driver has no ") + symbol);
  return entry;
}

void* LocalShared::find(const IpcHandle& handle) {
  std::lock_guard lock(mutex);
  for (auto& [h, p] : made)
    if (std::memcmp(h.bytes, handle.bytes, sizeof(h.bytes)) == 0) return p;
  return nullptr;
}

void LocalShared::erase(void* p) {
  std::lock_guard lock(mutex);
  std::erase_if(made, [&](const auto& entry) { return entry.second == p; });
}

LocalShared& local_shared() {
  static LocalShared shared;
  return shared;
}

}  // namespace tutti::device::cuda
