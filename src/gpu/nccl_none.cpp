// Builds without NCCL (no CUDA toolkit, or no nccl.h in it): the nccl backend is unsupported.
#include "gpu/nccl.hpp"

namespace tutti::gpu::detail {

std::unique_ptr<Nccl> Nccl::create(std::shared_ptr<device::Device>, tutti::Communicator) {
  throw Error(ErrorCode::unsupported, "tutti::gpu: the nccl backend is not available: Tutti was built without NCCL");
}

}  // namespace tutti::gpu::detail
