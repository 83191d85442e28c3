// The CUDA spelling of <tutti/gpu.hpp>: tutti::cuda::Communicator is a gpu::Communicator on CUDA
// device `device` (never the emulated one, whatever TUTTI_DEVICE says). A cudaStream_t converts
// to gpu::Stream implicitly, so every collective of gpu.hpp takes the caller's streams as they are:
//
//   tutti::cuda::Communicator gpu(world, local_rank);
//   gpu.allreduce(d_grad, d_grad, n, tutti::DataType::f32, tutti::ReduceOp::avg, stream);
//
// Error(unsupported) from the constructor when Tutti was built without CUDA or no device (or
// driver) is present.
#pragma once

#include "tutti/gpu.hpp"

namespace tutti::cuda {

class Communicator : public gpu::Communicator {
 public:
  explicit Communicator(tutti::Communicator& host, int device = 0)
      : gpu::Communicator(host, gpu::DeviceKind::cuda, device) {}
};

}  // namespace tutti::cuda
