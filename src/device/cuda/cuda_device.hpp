// The CUDA device: the device interface over the CUDA runtime (memory, streams, events, copies),
// the driver's stream memory operations (cuStreamWriteValue32 / cuStreamWaitValue32, found through
// cudaGetDriverEntryPointByVersion, so that nothing links libcuda and a machine without a GPU
// driver still loads Tutti) and Tutti's own reduction kernels (kernels.cu).
#pragma once

#include <memory>

#include "device/device.hpp"

namespace tutti::device::cuda {

/// CUDA device `ordinal`. Error(unsupported) when no CUDA device (or driver) is present or the
/// driver lacks stream memory operations; Error(invalid_argument) for an ordinal past the last.
std::unique_ptr<Device> make_cuda_device(int ordinal);

}  // namespace tutti::device::cuda
