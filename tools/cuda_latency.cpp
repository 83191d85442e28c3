// cuda-latency: what the stream-aware backends' signalling costs on this GPU and driver. The
// backends hold a stream at cuStreamWaitValue32 until a flag is written: by the host (host_transfer's
// `done`, ipc's `validated`) or by another rank's stream (ipc's step flags, in a host shared-memory
// segment every rank registers). Each probe times round trips, k = 1, 2, ...: stream s1 waits until
// A >= k and writes B = k; a relay stream waits until B >= k and writes C = k (without a relay s1
// writes C); the host, once the streams have been parked at their waits for 0, 50 or 500 us,
// writes A = k and spins until it reads C >= k. The relay is
//   - none: host -> stream -> host;
//   - a second stream of this process, with B in pinned host memory or in device memory;
//   - a stream of a second process on the same GPU (ranks as processes sharing one GPU, as the
//     device check's gate runs them), with B in a shared segment both processes register.
// Prints the median and 90th percentile of 200 round trips per probe, then the host's time per
// enqueued stream operation (write, wait, copy, kernel, host function) and per query the device
// layer makes around an enqueue (pointer attributes of device, pinned and pageable memory; the
// current device). Exit status 1 if CUDA fails or the second process does not answer.
//   cuda-latency [DEVICE]        (scripts/gpu_check.sh's cuda_waits stage)
#include <cuda.h>
#include <cuda_runtime.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "device/cuda/kernels.hpp"

namespace {

using clock_type = std::chrono::steady_clock;
constexpr int rounds = 200;
constexpr int delays[] = {0, 50, 500};
constexpr std::size_t segment_bytes = 4096;
// Words of the shared segment: B at [0], C at [32] (each on a line of its own), and two host-only
// words: `go` (the second process may start CUDA) and `armed` (its waits are enqueued).
constexpr int word_b = 0, word_c = 32, word_go = 64, word_armed = 80;

void must(cudaError_t status, const char* what) {
  if (status == cudaSuccess) return;
  std::fprintf(stderr, "cuda-latency: %s: %s\n", what, cudaGetErrorString(status));
  std::exit(1);
}
void driver(CUresult result, const char* what) {
  if (result == CUDA_SUCCESS) return;
  std::fprintf(stderr, "cuda-latency: %s failed (%d)\n", what, static_cast<int>(result));
  std::exit(1);
}
CUdeviceptr device_address(void* host) {
  void* device = nullptr;
  must(cudaHostGetDevicePointer(&device, host, 0), "cudaHostGetDevicePointer");
  return reinterpret_cast<CUdeviceptr>(device);
}
void CUDART_CB nothing(void*) {}

// The second process: waits for `go`, then enqueues every relay of the cross-process probe (B >= k,
// then C = k, k = 1 .. n) on a stream of its own and lets it run out. Leaves if the first process
// goes away.
int peer(volatile unsigned* shared, int ordinal, unsigned n) {
  const pid_t parent = getppid();
  while (shared[word_go] == 0) {
    if (getppid() != parent) return 1;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  must(cudaSetDevice(ordinal), "cudaSetDevice (second process)");
  void* base = const_cast<unsigned*>(shared);
  must(cudaHostRegister(base, segment_bytes, cudaHostRegisterMapped | cudaHostRegisterPortable), "cudaHostRegister");
  const CUdeviceptr b = device_address(base) + word_b * sizeof(unsigned);
  const CUdeviceptr c = device_address(base) + word_c * sizeof(unsigned);
  cudaStream_t s = nullptr;
  must(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate (second process)");
  for (unsigned k = 1; k <= n; ++k) {
    driver(cuStreamWaitValue32(s, b, k, CU_STREAM_WAIT_VALUE_GEQ), "cuStreamWaitValue32");
    driver(cuStreamWriteValue32(s, c, k, CU_STREAM_WRITE_VALUE_DEFAULT), "cuStreamWriteValue32");
  }
  shared[word_armed] = 1;
  while (cudaStreamQuery(s) == cudaErrorNotReady) {
    if (getppid() != parent) _exit(1);  // the first process is gone: its writes never come
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return 0;
}

// One probe: `rounds` round trips; `relay` enqueues the relay of round k (nothing where another
// process relays, or none is wanted). `a` is host memory s1 waits on; `c` host memory the host reads.
void probe(const std::string& name, unsigned& k, volatile unsigned* a, CUdeviceptr a_device, CUdeviceptr b,
           volatile unsigned* c, int delay_us, const std::function<void(unsigned)>& relay) {
  cudaStream_t s1 = nullptr;
  must(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking), "cudaStreamCreate");
  std::vector<double> us;
  for (int i = 0; i < rounds; ++i) {
    ++k;
    driver(cuStreamWaitValue32(s1, a_device, k, CU_STREAM_WAIT_VALUE_GEQ), "cuStreamWaitValue32");
    driver(cuStreamWriteValue32(s1, b, k, CU_STREAM_WRITE_VALUE_DEFAULT), "cuStreamWriteValue32");
    relay(k);
    const auto parked = clock_type::now() + std::chrono::microseconds(delay_us);
    while (clock_type::now() < parked) {
    }
    const auto start = clock_type::now();
    *a = k;
    while (*c < k)
      if (clock_type::now() - start > std::chrono::seconds(2)) {
        std::fprintf(stderr, "cuda-latency: %s: no answer within 2 s\n", name.c_str());
        std::exit(1);
      }
    us.push_back(std::chrono::duration<double, std::micro>(clock_type::now() - start).count());
  }
  must(cudaStreamSynchronize(s1), "cudaStreamSynchronize");
  cudaStreamDestroy(s1);
  std::sort(us.begin(), us.end());
  std::printf("%-62s median %7.1f us, p90 %7.1f us\n", name.c_str(), us[us.size() / 2], us[us.size() * 9 / 10]);
}

// The host's time per enqueue of one kind of stream operation (mean of 2000, the stream running).
void enqueue_cost(const char* name, const std::function<void()>& call, cudaStream_t stream) {
  constexpr int calls = 2000;
  const auto start = clock_type::now();
  for (int i = 0; i < calls; ++i) call();
  const double us = std::chrono::duration<double, std::micro>(clock_type::now() - start).count() / calls;
  must(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  std::printf("%-62s %7.2f us per call\n", name, us);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 5 && std::strcmp(argv[1], "--peer") == 0) {
    void* base = mmap(nullptr, segment_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, std::atoi(argv[2]), 0);
    if (base == MAP_FAILED) return 1;
    return peer(static_cast<volatile unsigned*>(base), std::atoi(argv[3]), static_cast<unsigned>(std::atol(argv[4])));
  }
  const int ordinal = argc > 1 ? std::atoi(argv[1]) : 0;
  // The second process is started before this one makes its first CUDA call (a fork after it
  // could not use CUDA); it waits for `go`.
  const int fd = memfd_create("cuda-latency", 0);
  if (fd < 0 || ftruncate(fd, segment_bytes) != 0) return std::perror("cuda-latency: memfd"), 1;
  void* base = mmap(nullptr, segment_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (base == MAP_FAILED) return std::perror("cuda-latency: mmap"), 1;
  auto* shared = static_cast<volatile unsigned*>(base);
  const unsigned cross_rounds = rounds * static_cast<unsigned>(std::size(delays));
  const pid_t child = fork();
  if (child == 0) {
    const std::string fd_text = std::to_string(fd), ordinal_text = std::to_string(ordinal),
                      n_text = std::to_string(cross_rounds);
    execl("/proc/self/exe", "cuda-latency", "--peer", fd_text.c_str(), ordinal_text.c_str(), n_text.c_str(),
          static_cast<char*>(nullptr));
    _exit(127);
  }
  if (child < 0) return std::perror("cuda-latency: fork"), 1;

  must(cudaSetDevice(ordinal), "cudaSetDevice");
  cudaDeviceProp properties{};
  must(cudaGetDeviceProperties(&properties, ordinal), "cudaGetDeviceProperties");
  std::printf("cuda-latency: %s, %d round trips per probe\n", properties.name, rounds);
  // This process's flags: A at [0], C at [32], B at [64] (pinned host memory), B in device memory.
  void* page = nullptr;
  must(cudaHostAlloc(&page, segment_bytes, cudaHostAllocMapped | cudaHostAllocPortable), "cudaHostAlloc");
  std::memset(page, 0, segment_bytes);
  auto* host = static_cast<volatile unsigned*>(page);
  const CUdeviceptr a = device_address(page), c = a + 32 * sizeof(unsigned), b_host = a + 64 * sizeof(unsigned);
  void* flag_memory = nullptr;
  must(cudaMalloc(&flag_memory, 256), "cudaMalloc");
  must(cudaMemset(flag_memory, 0, 256), "cudaMemset");
  const CUdeviceptr b_device = reinterpret_cast<CUdeviceptr>(flag_memory);
  cudaStream_t s2 = nullptr;
  must(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking), "cudaStreamCreate");
  unsigned k = 0;
  const auto relay_on = [&](CUdeviceptr b) {
    return [&, b](unsigned n) {
      driver(cuStreamWaitValue32(s2, b, n, CU_STREAM_WAIT_VALUE_GEQ), "cuStreamWaitValue32");
      driver(cuStreamWriteValue32(s2, c, n, CU_STREAM_WRITE_VALUE_DEFAULT), "cuStreamWriteValue32");
    };
  };
  for (int delay : delays) {
    const std::string parked = ", parked " + std::to_string(delay) + " us";
    probe("host -> stream -> host" + parked, k, host, a, c, host + 32, delay, [](unsigned) {});
    probe("+ a second stream, B in host memory" + parked, k, host, a, b_host, host + 32, delay, relay_on(b_host));
    probe("+ a second stream, B in device memory" + parked, k, host, a, b_device, host + 32, delay, relay_on(b_device));
  }
  // Across processes: B and C in the shared segment, the relay on the second process's stream.
  must(cudaHostRegister(base, segment_bytes, cudaHostRegisterMapped | cudaHostRegisterPortable), "cudaHostRegister");
  const CUdeviceptr shared_b = device_address(base) + word_b * sizeof(unsigned);
  int status = 0;
  shared[word_go] = 1;
  const auto armed_by = clock_type::now() + std::chrono::seconds(30);
  while (shared[word_armed] == 0 && clock_type::now() < armed_by)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  if (shared[word_armed] == 0) {
    std::printf("cuda-latency: the second process did not get ready within 30 s: no cross-process probe\n");
    status = 1;
  } else {
    unsigned cross = 0;
    for (int delay : delays)
      probe("+ a stream of another process, B in shared host memory, parked " + std::to_string(delay) + " us", cross,
            host, a, shared_b, shared + word_c, delay, [](unsigned) {});
  }
  kill(child, status == 0 ? 0 : SIGKILL);
  int child_status = 0;
  const auto reaped_by = clock_type::now() + std::chrono::seconds(10);
  while (waitpid(child, &child_status, WNOHANG) == 0) {
    if (clock_type::now() > reaped_by) {
      kill(child, SIGKILL);
      waitpid(child, &child_status, 0);
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  if (status == 0 && !(WIFEXITED(child_status) && WEXITSTATUS(child_status) == 0)) {
    std::printf("cuda-latency: the second process failed (status %d)\n", child_status);
    status = 1;
  }
  cudaHostUnregister(base);

  cudaStream_t s = nullptr;
  must(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate");
  void* scratch = nullptr;
  must(cudaMalloc(&scratch, 1 << 16), "cudaMalloc");
  auto* bytes = static_cast<std::byte*>(scratch);
  auto* numbers = static_cast<float*>(scratch);
  const tutti::device::kernels::DefaultNan nan{};
  enqueue_cost(
      "[enqueue] cuStreamWriteValue32 (host memory)",
      [&] { driver(cuStreamWriteValue32(s, b_host, 1, CU_STREAM_WRITE_VALUE_DEFAULT), "write"); }, s);
  enqueue_cost(
      "[enqueue] cuStreamWaitValue32 (met)",
      [&] { driver(cuStreamWaitValue32(s, b_host, 0, CU_STREAM_WAIT_VALUE_GEQ), "wait"); }, s);
  enqueue_cost(
      "[enqueue] cudaMemcpyAsync device to device, 4 KiB",
      [&] { must(cudaMemcpyAsync(bytes, bytes + 8192, 4096, cudaMemcpyDeviceToDevice, s), "copy"); }, s);
  enqueue_cost(
      "[enqueue] reduction kernel, 1024 f32",
      [&] {
        tutti::device::cuda::launch_reduce(numbers, numbers + 2048, numbers + 4096, 1024, tutti::DataType::f32,
                                           tutti::ReduceOp::sum, nan, 1, s);
      },
      s);
  enqueue_cost(
      "[enqueue] cudaLaunchHostFunc", [&] { must(cudaLaunchHostFunc(s, nothing, nullptr), "host func"); }, s);
  // What the device layer asks on the host around each enqueue (which device, what memory).
  std::vector<char> pageable(4096);
  const std::pair<const char*, const void*> pointers[] = {
      {"[query] cudaPointerGetAttributes, device memory", scratch},
      {"[query] cudaPointerGetAttributes, pinned memory", page},
      {"[query] cudaPointerGetAttributes, pageable memory", pageable.data()}};
  for (const auto& [name, pointer] : pointers)
    enqueue_cost(
        name,
        [&, pointer] {
          cudaPointerAttributes attributes{};
          if (cudaPointerGetAttributes(&attributes, pointer) != cudaSuccess) cudaGetLastError();
        },
        s);
  enqueue_cost(
      "[query] cudaSetDevice (already current)", [&] { must(cudaSetDevice(ordinal), "cudaSetDevice"); }, s);
  return status;
}
