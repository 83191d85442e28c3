// The CUDA calls that may wait for work on other streams (measured on an H100 by tools/cuda_waits:
// a stream held at a wait_value, one call, a watchdog that releases the stream after 2 s). Every
// such call in src/ goes through this file, and only this file (ctest device_implicit_sync checks
// it), so that each one is a visible decision: none may run while an operation that could hold a
// stream of the context is in flight, and none may run under a lock that a stream's host function
// needs. Each wrapper is the CUDA call as it is, with its status returned unchanged.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

namespace tutti::device::cuda::implicit_sync {

/// cudaFree. May wait for every stream of the context, held ones included (measured).
cudaError_t free_device(void* pointer);
/// cudaFreeHost. May wait for every stream of the context, held ones included (measured).
cudaError_t free_host(void* pointer);
/// cudaHostUnregister. May wait for every stream of the context, held ones included (measured).
cudaError_t host_unregister(void* pointer);
/// cudaIpcCloseMemHandle. Unmaps a peer's memory: may wait for every stream of the context, as a
/// free does (CUDA documents an implicit synchronisation).
cudaError_t ipc_close(void* pointer);
/// cudaMalloc. Returns at once beside a held stream, but may wait for every stream of the context
/// while another thread is inside a copy to pageable memory on a held stream (measured).
cudaError_t malloc_device(void** pointer, std::size_t bytes);
/// cudaHostAlloc. As cudaMalloc: may wait for every stream of the context while another thread is
/// inside a copy to pageable memory on a held stream (measured).
cudaError_t host_alloc(void** pointer, std::size_t bytes, unsigned int flags);
/// cudaStreamSynchronize. Waits, without a deadline, for everything on `stream`; if that work
/// waits for other streams (events, wait_values), for them as well.
cudaError_t stream_synchronize(cudaStream_t stream);
/// cudaDeviceSynchronize. Waits, without a deadline, for every stream of the context.
cudaError_t device_synchronize();

}  // namespace tutti::device::cuda::implicit_sync
