// The CUDA calls that may wait for other streams, each in one place (implicit_sync.hpp says why).
#include "device/cuda/implicit_sync.hpp"

namespace tutti::device::cuda::implicit_sync {

cudaError_t free_device(void* pointer) { return cudaFree(pointer); }
cudaError_t free_host(void* pointer) { return cudaFreeHost(pointer); }
cudaError_t host_unregister(void* pointer) { return cudaHostUnregister(pointer); }
cudaError_t ipc_close(void* pointer) { return cudaIpcCloseMemHandle(pointer); }
cudaError_t malloc_device(void** pointer, std::size_t bytes) { return cudaMalloc(pointer, bytes); }
cudaError_t host_alloc(void** pointer, std::size_t bytes, unsigned int flags) {
  return cudaHostAlloc(pointer, bytes, flags);
}
cudaError_t stream_synchronize(cudaStream_t stream) { return cudaStreamSynchronize(stream); }
cudaError_t device_synchronize() { return cudaDeviceSynchronize(); }

}  // namespace tutti::device::cuda::implicit_sync
