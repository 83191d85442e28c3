// The CUDA reduction kernels' launchers (kernels.cu), callable from host code that nvcc does not
// compile.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

#include "device/cuda/elementwise.hpp"
#include "tutti/types.hpp"

namespace tutti::device::cuda {

/// Enqueues dst[i] = a[i] op b[i] (i < count; avg as sum) on `stream`, in at most `max_blocks`
/// blocks. The pointers are device memory aligned to the element size (checked by the caller);
/// 16-byte aligned ones are read and written 16 bytes at a time. The launch's error, if any.
cudaError_t launch_reduce(void* dst, const void* a, const void* b, std::size_t count, DataType type, ReduceOp op,
                          const kernels::DefaultNan& nan, int max_blocks, cudaStream_t stream);

/// Enqueues data[i] /= divisor (divisor >= 1) on `stream`. The launch's error, if any.
cudaError_t launch_divide(void* data, std::size_t count, DataType type, int divisor, int max_blocks,
                          cudaStream_t stream);

/// Enqueues `rounds` times data[i] = fmaf(data[i], 0.5f, 1.0f) (Device::compute). The launch's
/// error, if any.
cudaError_t launch_compute(float* data, std::size_t count, int rounds, int max_blocks, cudaStream_t stream);

/// Loads every kernel above into the current device's context (cudaFuncGetAttributes loads a
/// kernel that CUDA's lazy module loading, the default since CUDA 12.2, would load at its first
/// launch). A first launch's loading may wait for every stream of the context, held ones
/// included: done when the device is created, no launch inside a collective loads anything.
/// The first error, if any.
cudaError_t load_kernels();

}  // namespace tutti::device::cuda
