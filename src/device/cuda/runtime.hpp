// The CUDA runtime and driver as the CUDA device (cuda_device.cpp) uses them: their errors as
// tutti::Error, the native handles behind Stream and Event, the driver's stream memory operations
// found at run time (nothing links libcuda), the host's default NaN for the kernels, and this
// process's shared allocations by handle.
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "device/cuda/kernels.hpp"
#include "device/device.hpp"

namespace tutti::device::cuda {

/// Error(system) naming `function` and CUDA's error when `status` is not success; clears a
/// non-sticky error first.
void check(cudaError_t status, const char* function);
/// Error(system) naming `function` and the driver's error code when `status` is not success.
void check(CUresult status, const char* function);

inline cudaStream_t native(Stream stream) { return static_cast<cudaStream_t>(stream.handle); }
inline cudaEvent_t native(Event event) { return static_cast<cudaEvent_t>(event.handle); }

/// The host's default NaN, from the host kernels themselves, so the device's kernels give the
/// same bits.
kernels::DefaultNan host_default_nan();

using WriteValue32 = CUresult (*)(CUstream, CUdeviceptr, cuuint32_t, unsigned int);
using WaitValue32 = CUresult (*)(CUstream, CUdeviceptr, cuuint32_t, unsigned int);

/// The driver's entry point `symbol` (CUDA 12.0's version of it); Error(unsupported) when the
/// driver has none.
void* driver_entry_point(const char* symbol);
template <class F>
F driver_entry(const char* symbol) {
  return reinterpret_cast<F>(driver_entry_point(symbol));
}

/// This process's shared allocations by handle: CUDA cannot open a handle in the process that made
/// it, so ranks that are threads of one process use the owner's pointer instead.
struct LocalShared {
  std::mutex mutex;
  std::vector<std::pair<IpcHandle, void*>> made;
  void* find(const IpcHandle& handle);
  void erase(void* p);
};
LocalShared& local_shared();

}  // namespace tutti::device::cuda
