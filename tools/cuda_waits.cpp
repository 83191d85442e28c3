// cuda-waits: which CUDA calls wait for a stream held at a wait_value, on this machine's driver.
// The stream-aware collectives hold streams at cuStreamWaitValue32 until the host side of an
// operation is done; a CUDA call that waits for such a stream, on a thread the operation needs,
// hangs it. Each probe holds a stream, makes one call, and has a watchdog release the stream after
// 2 s: a call that returned only then waits for held streams. Some probes put a copy to pageable
// memory (another thread waits in it) or a host function behind the wait. Three probe the
// kernels: a kernel's first launch (CUDA's lazy loading loads it then), loading the rest as the
// CUDA device does when it is created (load_kernels), and a loaded kernel's first launch. The
// last probe holds one stream and counts how many of 24 other streams, each given a small memset,
// finish it within a second: a stream that does not shares a hardware queue with the held one
// (CUDA_DEVICE_MAX_CONNECTIONS, read when CUDA starts; 8 by default). Prints one line per probe;
// exit status 1 if CUDA fails. (What the signalling costs: tools/cuda_latency.cpp.)
//   cuda-waits [DEVICE]        (scripts/gpu_check.sh runs it with and without the variable set)
#include <cuda.h>
#include <cuda_runtime.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <thread>
#include <vector>

#include "device/cuda/kernels.hpp"

namespace {

using clock_type = std::chrono::steady_clock;
constexpr std::size_t mib4 = std::size_t{4} << 20;

void must(cudaError_t status, const char* what) {
  if (status == cudaSuccess) return;
  std::fprintf(stderr, "cuda-waits: %s: %s\n", what, cudaGetErrorString(status));
  std::exit(1);
}

struct Held {
  volatile unsigned* flag = nullptr;
  CUdeviceptr address = 0;
  unsigned generation = 0;
  cudaStream_t stream = nullptr;

  Held() {
    void* p = nullptr;
    must(cudaHostAlloc(&p, 4096, cudaHostAllocMapped | cudaHostAllocPortable), "cudaHostAlloc (flag)");
    flag = static_cast<volatile unsigned*>(p);
    *flag = 0;
    void* device = nullptr;
    must(cudaHostGetDevicePointer(&device, p, 0), "cudaHostGetDevicePointer");
    address = reinterpret_cast<CUdeviceptr>(device);
    must(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate (held)");
  }
  void hold() {
    ++generation;
    if (cuStreamWaitValue32(stream, address, generation, CU_STREAM_WAIT_VALUE_GEQ) != CUDA_SUCCESS) {
      std::fprintf(stderr, "cuda-waits: cuStreamWaitValue32 failed\n");
      std::exit(1);
    }
  }
  void release() { *flag = generation; }
};

void CUDART_CB nothing(void*) {}

enum class Behind { nothing, pageable_copy, host_function };

// Runs `call` while `held` is held, with `behind` enqueued after the wait (a copy to pageable
// memory, made by another thread, which waits in it; or a host function); prints whether it
// returned before the watchdog's release.
void probe(Held& held, const char* name, const std::function<void()>& call, Behind behind = Behind::nothing,
           void* device = nullptr, void* pageable = nullptr) {
  held.hold();
  std::thread copier;
  if (behind == Behind::host_function) must(cudaLaunchHostFunc(held.stream, nothing, nullptr), "cudaLaunchHostFunc");
  const bool busy = behind == Behind::pageable_copy;
  if (busy) {
    copier = std::thread([&] { cudaMemcpyAsync(pageable, device, mib4, cudaMemcpyDeviceToHost, held.stream); });
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  std::atomic<bool> returned{false};
  std::thread watchdog([&] {
    const auto start = clock_type::now();
    while (!returned.load() && clock_type::now() - start < std::chrono::seconds(2))
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    held.release();
  });
  const auto start = clock_type::now();
  call();
  returned = true;
  const double ms = std::chrono::duration<double, std::milli>(clock_type::now() - start).count();
  watchdog.join();
  if (copier.joinable()) copier.join();
  must(cudaStreamSynchronize(held.stream), "cudaStreamSynchronize (held)");
  const char* tag = busy ? "[copy to pageable on it]" : behind == Behind::host_function ? "[host function on it]" : "";
  std::printf("%-26s %-48s %s (%.1f ms)\n", tag, name, ms > 1500 ? "WAITS for the held stream" : "returns", ms);
}

}  // namespace

int main(int argc, char** argv) {
  const int ordinal = argc > 1 ? std::atoi(argv[1]) : 0;
  const char* connections = std::getenv("CUDA_DEVICE_MAX_CONNECTIONS");
  must(cudaSetDevice(ordinal), "cudaSetDevice");
  cudaDeviceProp properties{};
  must(cudaGetDeviceProperties(&properties, ordinal), "cudaGetDeviceProperties");
  std::printf("cuda-waits: %s, CUDA_DEVICE_MAX_CONNECTIONS=%s\n", properties.name,
              connections ? connections : "(unset)");
  Held held;
  cudaStream_t other = nullptr;
  must(cudaStreamCreateWithFlags(&other, cudaStreamNonBlocking), "cudaStreamCreate");
  void* device = nullptr;
  must(cudaMalloc(&device, mib4), "cudaMalloc");
  std::vector<char> host_a(mib4), host_b(mib4);
  void* p = nullptr;
  void* registered = std::aligned_alloc(4096, mib4);

  probe(held, "cudaHostAlloc 4 MiB", [&] { cudaHostAlloc(&p, mib4, cudaHostAllocMapped | cudaHostAllocPortable); });
  probe(held, "cudaFreeHost", [&] { cudaFreeHost(p); });
  probe(held, "cudaHostRegister 4 MiB", [&] { cudaHostRegister(registered, mib4, cudaHostRegisterMapped); });
  probe(held, "cudaHostUnregister", [&] { cudaHostUnregister(registered); });
  probe(held, "cudaMalloc 4 MiB", [&] { cudaMalloc(&p, mib4); });
  probe(held, "cudaFree", [&] { cudaFree(p); });
  probe(held, "cudaMallocAsync 4 MiB + sync, other stream", [&] {
    cudaMallocAsync(&p, mib4, other);
    cudaStreamSynchronize(other);
  });
  probe(held, "cudaFreeAsync + sync, other stream", [&] {
    cudaFreeAsync(p, other);
    cudaStreamSynchronize(other);
  });
  probe(held, "copy to pageable 4 MiB + sync, other stream", [&] {
    cudaMemcpyAsync(host_b.data(), device, mib4, cudaMemcpyDeviceToHost, other);
    cudaStreamSynchronize(other);
  });
  probe(held, "cudaStreamCreate", [&] {
    cudaStream_t s = nullptr;
    cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  });
  probe(held, "cudaEventCreate", [&] {
    cudaEvent_t e = nullptr;
    cudaEventCreateWithFlags(&e, cudaEventDisableTiming);
  });
  // Kernels: CUDA loads a kernel at its first launch (lazy module loading, the default since
  // CUDA 12.2) unless something loaded it before; the CUDA device loads its own when it is created
  // (load_kernels). Which of the two waits for a held stream?
  float* numbers = static_cast<float*>(device);
  const tutti::device::kernels::DefaultNan nan{};
  probe(held, "first launch of a kernel + sync, other stream", [&] {
    tutti::device::cuda::launch_reduce(numbers, numbers, numbers, 1024, tutti::DataType::f32, tutti::ReduceOp::sum, nan,
                                       1, other);
    cudaStreamSynchronize(other);
  });
  probe(held, "load_kernels (the rest, unlaunched)", [&] { tutti::device::cuda::load_kernels(); });
  probe(held, "first launch of a loaded kernel + sync, other", [&] {
    tutti::device::cuda::launch_divide(numbers, 1024, tutti::DataType::f64, 2, 1, other);
    cudaStreamSynchronize(other);
  });
  const auto busy = [&](const char* name, const std::function<void()>& call) {
    probe(held, name, call, Behind::pageable_copy, device, host_a.data());
  };
  busy("cudaHostAlloc 4 MiB", [&] { cudaHostAlloc(&p, mib4, cudaHostAllocMapped); });
  busy("cudaMalloc 4 MiB", [&] { cudaMalloc(&p, mib4); });
  busy("cudaMallocAsync 64 MiB + sync, other stream", [&] {
    cudaMallocAsync(&p, std::size_t{64} << 20, other);
    cudaStreamSynchronize(other);
  });
  busy("copy from pageable 4 MiB, other stream",
       [&] { cudaMemcpyAsync(device, host_b.data(), mib4, cudaMemcpyHostToDevice, other); });

  const auto host_function = [&](const char* name, const std::function<void()>& call) {
    probe(held, name, call, Behind::host_function);
  };
  host_function("cudaHostAlloc 4 MiB", [&] { cudaHostAlloc(&p, mib4, cudaHostAllocMapped); });
  host_function("cudaMalloc 4 MiB", [&] { cudaMalloc(&p, mib4); });
  host_function("copy from pageable 4 MiB, other stream",
                [&] { cudaMemcpyAsync(device, host_b.data(), mib4, cudaMemcpyHostToDevice, other); });

  // Streams behind the held one's hardware queue.
  constexpr int streams = 24;
  held.hold();
  std::vector<cudaStream_t> s(streams);
  std::vector<cudaEvent_t> done(streams);
  for (int i = 0; i < streams; ++i) {
    must(cudaStreamCreateWithFlags(&s[static_cast<std::size_t>(i)], cudaStreamNonBlocking), "cudaStreamCreate");
    must(cudaEventCreateWithFlags(&done[static_cast<std::size_t>(i)], cudaEventDisableTiming), "cudaEventCreate");
    must(cudaMemsetAsync(static_cast<char*>(device) + i * 256, i, 256, s[static_cast<std::size_t>(i)]), "memset");
    must(cudaEventRecord(done[static_cast<std::size_t>(i)], s[static_cast<std::size_t>(i)]), "cudaEventRecord");
  }
  std::this_thread::sleep_for(std::chrono::seconds(1));
  int finished = 0;
  for (cudaEvent_t e : done) finished += cudaEventQuery(e) == cudaSuccess ? 1 : 0;
  held.release();
  must(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  std::printf("%-26s %-48s %d of %d finished within 1 s%s\n", "", "memset on 24 other streams", finished, streams,
              finished < streams ? " (the others share the held stream's hardware queue)" : "");
  return 0;
}
