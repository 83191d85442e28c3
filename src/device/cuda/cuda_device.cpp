#include "device/cuda/cuda_device.hpp"

#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_set>
#include <utility>
#include <vector>

#include "core/log.hpp"
#include "device/checks.hpp"
#include "device/cuda/implicit_sync.hpp"
#include "device/cuda/kernels.hpp"
#include "device/cuda/pinned_blocks.hpp"
#include "device/cuda/runtime.hpp"
#include "device/memory_ranges.hpp"

namespace tutti::device::cuda {
namespace {

// How long a device's destruction waits for its streams to finish their work before it takes one
// for held (at a wait_value nobody will satisfy) and leaves its memory allocated rather than free
// it behind that stream; the strict emulated device's hold limit alike.
constexpr std::chrono::milliseconds held_stream_grace{2000};

[[noreturn]] void invalid(const char* function, const std::string& what) {
  throw Error(ErrorCode::invalid_argument, std::string("tutti::device::") + function + " (cuda): " + what);
}

class CudaDevice final : public Device {
 public:
  explicit CudaDevice(int ordinal) : ordinal_(ordinal) {
    // A stream held at a wait_value also holds the streams that share its hardware queue, and a
    // process of ranks as threads (or the library's own streams beside the caller's) can have more
    // streams than the default 8 queues: ask for the most (32), unless the caller chose, before
    // the first CUDA call of the process creates the context (later, it has no effect).
    static std::once_flag connections;
    std::call_once(connections, [] { setenv("CUDA_DEVICE_MAX_CONNECTIONS", "32", 0); });
    int count = 0;
    const cudaError_t status = cudaGetDeviceCount(&count);
    if (status != cudaSuccess || count == 0) {
      cudaGetLastError();
      throw Error(ErrorCode::unsupported, std::string("tutti::device: no CUDA device (") +
                                              (status == cudaSuccess ? "none found" : cudaGetErrorString(status)) +
                                              ")");
    }
    if (ordinal >= count)
      invalid("make_device", "device " + std::to_string(ordinal) + " asked, " + std::to_string(count) + " present");
    select();
    cudaDeviceProp properties{};
    check(cudaGetDeviceProperties(&properties, ordinal), "make_device");
    name_ = "cuda:" + std::to_string(ordinal) + " (" + properties.name + ")";
    max_blocks_ = properties.multiProcessorCount * 8;
    // Now, not at a first launch inside a collective, where loading could wait behind a held stream.
    check(load_kernels(), "make_device: loading the reduction kernels");
    write_value32_ = driver_entry<WriteValue32>("cuStreamWriteValue32");
    wait_value32_ = driver_entry<WaitValue32>("cuStreamWaitValue32");
  }

  ~CudaDevice() override {
    select();
    const std::string held = held_streams(held_stream_grace);
    for (void* s : streams_) cudaStreamDestroy(static_cast<cudaStream_t>(s));
    for (void* e : events_) cudaEventDestroy(static_cast<cudaEvent_t>(e));
    if (!held.empty()) {
      // Every call below may wait for every stream of the context (implicit_sync.hpp), the held
      // one included, for ever if nothing releases it: what the device made stays allocated and
      // mapped for the life of the process instead (the held stream may still touch it).
      core::log(core::LogLevel::warn, -1,
                "tutti::device: " + name_ + " destroyed while " + held + " after " +
                    std::to_string(held_stream_grace.count()) + " ms" +
                    ": its memory is left allocated, not freed behind them (a free would wait for them)");
      if (pool_stream_) cudaStreamDestroy(pool_stream_);
      pinned_->abandon();
      return;
    }
    for (void* p : opened_) implicit_sync::ipc_close(p);
    for (void* p : registered_) implicit_sync::host_unregister(p);
    for (void* p : device_memory_) {
      local_shared().erase(p);
      release(p, false);
    }
    if (pool_stream_) cudaStreamDestroy(pool_stream_);
    pinned_->close();
  }

  // cudaStreamQuery, which never waits.
  std::string held_streams_now() const override {
    std::lock_guard lock(mutex_);
    std::size_t busy = 0;
    for (void* s : streams_)
      if (cudaStreamQuery(static_cast<cudaStream_t>(s)) == cudaErrorNotReady) ++busy;
    cudaGetLastError();  // cudaErrorNotReady is no failure
    if (busy == 0) return "";
    return std::to_string(busy) + " of its " + std::to_string(streams_.size()) + " streams still had work queued";
  }

  Kind kind() const override { return Kind::cuda; }
  std::string name() const override { return name_; }
  std::uintptr_t queue_domain() const override { return static_cast<std::uintptr_t>(ordinal_) + 1; }

  // Device memory comes from the stream-ordered pool, allocated and freed on a stream of the
  // device's own: cudaMalloc may, and cudaFree does, wait for every stream of the context, and a
  // stream held at a wait_value for a flag that another thread of this process sets (a rank that
  // is a thread, its progress thread) then never finishes, so a free on one rank's thread hung
  // the ranks sharing the GPU. Memory shared by IPC (allocate_shared) keeps cudaMalloc, which
  // IPC handles require, and is freed when the device is destroyed or by free() like the rest.
  void* allocate(std::size_t bytes) override { return allocate_device(bytes, true); }
  void* allocate_device(std::size_t bytes, bool pooled) {
    if (bytes == 0) invalid("allocate", "0 bytes requested");
    select();
    void* p = nullptr;
    cudaStream_t s = pooled ? pool_stream() : nullptr;
    if (s) {
      check(cudaMallocAsync(&p, bytes, s), "allocate");
      check(implicit_sync::stream_synchronize(s), "allocate");  // usable on every stream from here
      remember(pooled_, p);
    } else {
      check(implicit_sync::malloc_device(&p, bytes), "allocate");
    }
    remember(device_memory_, p);
    known_->add(p, bytes, MemoryRanges::Kind::device, p);
    return p;
  }
  void free(void* pointer) override {
    if (pointer == nullptr) return;
    forget(device_memory_, pointer, "free", "allocate");
    local_shared().erase(pointer);
    select();
    release(pointer);
  }
  void* allocate_shared(std::size_t bytes, IpcHandle& handle) override {
    void* p = allocate_device(bytes, false);
    cudaIpcMemHandle_t ipc{};
    static_assert(sizeof(ipc) <= sizeof(handle.bytes));
    try {
      check(cudaIpcGetMemHandle(&ipc, p), "allocate_shared");
    } catch (...) {
      free(p);
      throw;
    }
    handle = {};
    std::memcpy(handle.bytes, &ipc, sizeof(ipc));
    std::lock_guard lock(local_shared().mutex);
    local_shared().made.emplace_back(handle, p);
    return p;
  }
  void* open_shared(const IpcHandle& handle, std::size_t bytes) override {
    if (bytes == 0) invalid("open_shared", "0 bytes");
    if (void* mine = local_shared().find(handle)) {
      remember(opened_local_, mine);
      return mine;
    }
    select();
    cudaIpcMemHandle_t ipc{};
    std::memcpy(&ipc, handle.bytes, sizeof(ipc));
    void* p = nullptr;
    check(cudaIpcOpenMemHandle(&p, ipc, cudaIpcMemLazyEnablePeerAccess), "open_shared");
    remember(opened_, p);
    known_->add(p, bytes, MemoryRanges::Kind::device, p);
    return p;
  }
  void close_shared(void* pointer) override {
    if (pointer == nullptr) return;
    {
      std::lock_guard lock(mutex_);
      if (opened_local_.erase(pointer) > 0) return;
    }
    forget(opened_, pointer, "close_shared", "open_shared");
    known_->remove(pointer);
    select();
    check(implicit_sync::ipc_close(pointer), "close_shared");
  }
  void register_pinned(void* pointer, std::size_t bytes) override {
    if (pointer == nullptr || bytes == 0) invalid("register_pinned", "a null pointer or 0 bytes");
    select();
    check(cudaHostRegister(pointer, bytes, cudaHostRegisterPortable | cudaHostRegisterMapped), "register_pinned");
    remember(registered_, pointer);
    remember_pinned(*known_, pointer, bytes);
  }
  void unregister_pinned(void* pointer) override {
    forget(registered_, pointer, "unregister_pinned", "register_pinned");
    known_->remove(pointer);
    check(implicit_sync::host_unregister(pointer), "unregister_pinned");
  }
  // Pinned memory comes in blocks that free_pinned keeps for reuse (pinned_blocks.hpp).
  void* allocate_pinned(std::size_t bytes) override {
    if (bytes == 0) invalid("allocate_pinned", "0 bytes requested");
    select();
    void* p = nullptr;
    check(static_cast<cudaError_t>(pinned_->take(bytes, false, p)), "allocate_pinned");
    std::memset(p, 0, bytes);
    return p;
  }
  void free_pinned(void* pointer) override {
    if (pointer != nullptr && !pinned_->give_back(pointer))
      invalid("free_pinned", "not something this device's allocate_pinned returned");
  }
  bool is_device_pointer(const void* pointer) const override {
    if (pointer == nullptr) return false;
    if (const auto found = known_->find(pointer)) return found->kind == MemoryRanges::Kind::device;
    // On a thread that has not used this device yet, no context is current, and the query then
    // knows no allocation (seen on an H100: device memory reported as unregistered host memory).
    select();
    cudaPointerAttributes attributes{};
    if (cudaPointerGetAttributes(&attributes, pointer) != cudaSuccess) {
      cudaGetLastError();
      return false;
    }
    return attributes.type == cudaMemoryTypeDevice || attributes.type == cudaMemoryTypeManaged;
  }

  Stream create_stream() override {
    select();
    cudaStream_t stream = nullptr;
    check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "create_stream");
    remember(streams_, stream);
    return Stream{stream};
  }
  void destroy_stream(Stream stream) override {
    forget(streams_, stream.handle, "destroy_stream", "create_stream");
    check(cudaStreamDestroy(native(stream)), "destroy_stream");
  }
  void synchronize(Stream stream, std::chrono::milliseconds timeout) override {
    // Polls rather than cudaStreamSynchronize, which has no deadline.
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    for (auto pause = std::chrono::microseconds(20);; pause = std::min(2 * pause, std::chrono::microseconds(1000))) {
      const cudaError_t status = cudaStreamQuery(native(stream));
      if (status == cudaSuccess) return;
      if (status != cudaErrorNotReady) check(status, "synchronize");
      if (std::chrono::steady_clock::now() >= deadline)
        throw Error(ErrorCode::timeout, "tutti::device::synchronize (cuda): the stream's work was not done after " +
                                            std::to_string(timeout.count()) + " ms");
      std::this_thread::sleep_for(pause);
    }
  }

  // A copy from or to pageable host memory goes through pinned bounce blocks of the device's own:
  // from it, the host fills the block at the call; to it, a host function on the stream empties
  // the block once the stream is there. The call returns at once, as every other copy does.
  // cudaMemcpyAsync with pageable memory waits on the host (to it: for the stream to reach the
  // copy), and while one thread waits so, other threads' cudaHostAlloc and cudaMalloc wait too
  // (seen on an H100): ranks that were threads sharing a GPU hung so. Blocks are reused once
  // their stream has passed them (pinned_blocks.hpp).
  void copy(void* dst, const void* src, std::size_t bytes, Stream stream) override {
    detail::check_copy(dst, src, bytes);
    if (bytes == 0 || dst == src) return;
    select();
    const bool from_pageable = pageable(src), to_pageable = pageable(dst);
    if (!from_pageable && !to_pageable) {
      check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, native(stream)), "copy");
      return;
    }
    for (std::size_t offset = 0; offset < bytes; offset += bounce_bytes) {
      const std::size_t n = std::min(bounce_bytes, bytes - offset);
      void* block = nullptr;
      check(static_cast<cudaError_t>(pinned_->take(bounce_bytes, true, block)), "copy");
      auto* b = new Bounce{pinned_, static_cast<std::byte*>(block)};
      auto* out = static_cast<std::byte*>(dst) + offset;
      const auto* in = static_cast<const std::byte*>(src) + offset;
      cudaError_t status = cudaSuccess;
      bool enqueued = false;  // the stream may still touch the block
      if (from_pageable) {
        std::memcpy(b->memory, in, n);
      } else {
        status = cudaMemcpyAsync(b->memory, in, n, cudaMemcpyDefault, native(stream));
        enqueued = status == cudaSuccess;
      }
      if (to_pageable) {
        b->out = out;
        b->bytes = n;
      } else if (status == cudaSuccess) {
        status = cudaMemcpyAsync(out, b->memory, n, cudaMemcpyDefault, native(stream));
        enqueued = enqueued || status == cudaSuccess;
      }
      if (status == cudaSuccess) status = cudaLaunchHostFunc(native(stream), &CudaDevice::bounce_done, b);
      if (status != cudaSuccess) {
        b->out = nullptr;
        if (enqueued)
          delete b;  // its block stays out: the stream may still copy through it
        else
          bounce_done(b);
        check(status, "copy");
      }
    }
  }
  void reduce(void* dst, const void* a, const void* b, std::size_t count, DataType type, ReduceOp op,
              Stream stream) override {
    const std::size_t bytes = detail::checked_bytes(type, &op, count, "reduce");
    if (count == 0) return;
    const std::pair<const void*, const char*> buffers[] = {{dst, "dst"}, {a, "a"}, {b, "b"}};
    for (const auto& [p, what] : buffers) {
      detail::check_element_pointer(p, type, what, "reduce");
      if (!is_device_pointer(p)) invalid("reduce", std::string(what) + " is not device memory");
    }
    detail::check_overlap(dst, a, bytes, "a", "reduce");
    detail::check_overlap(dst, b, bytes, "b", "reduce");
    select();
    check(launch_reduce(dst, a, b, count, type, op, nan_, max_blocks_, native(stream)), "reduce");
  }
  void divide(void* data, std::size_t count, DataType type, int divisor, Stream stream) override {
    detail::checked_bytes(type, nullptr, count, "divide");
    if (divisor < 1) invalid("divide", "divisor must be at least 1, got " + std::to_string(divisor));
    if (count == 0) return;
    detail::check_element_pointer(data, type, "data", "divide");
    if (!is_device_pointer(data)) invalid("divide", "data is not device memory");
    select();
    check(launch_divide(data, count, type, divisor, max_blocks_, native(stream)), "divide");
  }
  void compute(float* data, std::size_t count, int rounds, Stream stream) override {
    if (rounds < 0) invalid("compute", "rounds must not be negative, got " + std::to_string(rounds));
    detail::checked_bytes(DataType::f32, nullptr, count, "compute");
    if (count == 0 || rounds == 0) return;
    detail::check_element_pointer(data, DataType::f32, "data", "compute");
    if (!is_device_pointer(data)) invalid("compute", "data is not device memory");
    select();
    check(launch_compute(data, count, rounds, max_blocks_, native(stream)), "compute");
  }
  void write_value(std::uint32_t* flag, std::uint32_t value, Stream stream) override {
    detail::check_flag(flag, "write_value");
    const CUdeviceptr address = device_address(flag, "write_value");
    select();
    check(write_value32_(static_cast<CUstream>(stream.handle), address, value, CU_STREAM_WRITE_VALUE_DEFAULT),
          "write_value");
  }
  void wait_value(const std::uint32_t* flag, std::uint32_t value, Stream stream) override {
    detail::check_flag(flag, "wait_value");
    const CUdeviceptr address = device_address(flag, "wait_value");
    select();
    check(wait_value32_(static_cast<CUstream>(stream.handle), address, value, CU_STREAM_WAIT_VALUE_GEQ), "wait_value");
  }
  void set_flag(std::uint32_t* flag, std::uint32_t value) override {
    detail::check_flag(flag, "set_flag");
    std::atomic_ref<std::uint32_t>(*flag).store(value, std::memory_order_release);
  }

  Event create_event() override {
    select();
    cudaEvent_t event = nullptr;
    check(cudaEventCreateWithFlags(&event, cudaEventDisableTiming), "create_event");
    remember(events_, event);
    return Event{event};
  }
  void destroy_event(Event event) override {
    forget(events_, event.handle, "destroy_event", "create_event");
    check(cudaEventDestroy(native(event)), "destroy_event");
  }
  void record(Event event, Stream stream) override {
    select();
    check(cudaEventRecord(native(event), native(stream)), "record");
  }
  bool query(Event event) override {
    const cudaError_t status = cudaEventQuery(native(event));
    if (status == cudaErrorNotReady) return false;
    check(status, "query");
    return true;
  }
  void wait_event(Stream stream, Event event) override {
    select();
    check(cudaStreamWaitEvent(native(stream), native(event), 0), "wait_event");
  }

 private:
  // A pinned block of a copy from or to pageable memory; `out` and `bytes`: where its host
  // function copies it to (pageable memory), if anywhere. It holds the blocks: a held stream's
  // host function may run after the device is gone.
  struct Bounce {
    std::shared_ptr<PinnedBlocks> blocks;
    std::byte* memory = nullptr;
    std::byte* out = nullptr;
    std::size_t bytes = 0;
  };
  static constexpr std::size_t bounce_bytes = detail::pageable_chunk_bytes;

  bool pageable(const void* pointer) const {
    if (known_->find(pointer)) return false;
    cudaPointerAttributes attributes{};
    if (cudaPointerGetAttributes(&attributes, pointer) != cudaSuccess) {
      cudaGetLastError();
      return true;
    }
    return attributes.type == cudaMemoryTypeUnregistered;
  }
  // Runs on the stream once the block's copies are done (a host function: no CUDA calls), or
  // on the caller where the stream refused the work.
  static void CUDART_CB bounce_done(void* data) {
    auto* b = static_cast<Bounce*>(data);
    if (b->out != nullptr) std::memcpy(b->out, b->memory, b->bytes);
    b->blocks->give_back(b->memory);
    delete b;
  }

  // Pinned memory's range, with the address streams use for it (where CUDA gives none, it stays
  // unknown here and is asked of CUDA).
  static void remember_pinned(MemoryRanges& known, void* p, std::size_t bytes) {
    void* mapped = nullptr;
    if (cudaHostGetDevicePointer(&mapped, p, 0) == cudaSuccess)
      known.add(p, bytes, MemoryRanges::Kind::pinned, mapped);
    else
      cudaGetLastError();
  }

  // The calling thread's current device becomes this one (cheap when it already is).
  void select() const { check(cudaSetDevice(ordinal_), "cudaSetDevice"); }

  // The stream device memory is allocated and freed on, or null where the device has no
  // stream-ordered pool (then cudaMalloc and cudaFree).
  cudaStream_t pool_stream() {
    std::call_once(pool_once_, [&] {
      int supported = 0;
      if (cudaDeviceGetAttribute(&supported, cudaDevAttrMemoryPoolsSupported, ordinal_) != cudaSuccess ||
          supported == 0) {
        cudaGetLastError();
        return;
      }
      check(cudaStreamCreateWithFlags(&pool_stream_, cudaStreamNonBlocking), "allocate");
    });
    return pool_stream_;
  }
  void release(void* p, bool checked = true) {
    known_->remove(p);
    bool pooled = false;
    {
      std::lock_guard lock(mutex_);
      pooled = pooled_.erase(p) > 0;
    }
    const cudaError_t status = pooled ? cudaFreeAsync(p, pool_stream_) : implicit_sync::free_device(p);
    if (checked) check(status, "free");
    if (pooled && checked) check(implicit_sync::stream_synchronize(pool_stream_), "free");
  }

  void remember(std::unordered_set<void*>& set, void* p) {
    std::lock_guard lock(mutex_);
    set.insert(p);
  }
  void forget(std::unordered_set<void*>& set, void* p, const char* function, const char* maker) {
    std::lock_guard lock(mutex_);
    if (set.erase(p) == 0) invalid(function, std::string("not something this device's ") + maker + " returned");
  }

  // What a stream memory operation addresses: pinned host memory through its device mapping,
  // device memory as it is. Ordinary host memory is out of the device's reach.
  CUdeviceptr device_address(const void* flag, const char* function) const {
    if (const auto found = known_->find(flag)) return static_cast<CUdeviceptr>(found->device_address);
    select();  // the query needs this device's context current (is_device_pointer)
    cudaPointerAttributes attributes{};
    if (cudaPointerGetAttributes(&attributes, flag) != cudaSuccess) cudaGetLastError();
    if (attributes.type == cudaMemoryTypeHost && attributes.devicePointer != nullptr)
      return reinterpret_cast<CUdeviceptr>(attributes.devicePointer);
    if (attributes.type == cudaMemoryTypeDevice || attributes.type == cudaMemoryTypeManaged)
      return reinterpret_cast<CUdeviceptr>(flag);
    invalid(function, "the flag is neither pinned nor device memory");
  }

  int ordinal_;
  std::string name_;
  int max_blocks_ = 1;
  kernels::DefaultNan nan_ = host_default_nan();
  WriteValue32 write_value32_ = nullptr;
  WaitValue32 wait_value32_ = nullptr;
  mutable std::mutex mutex_;
  std::unordered_set<void*> streams_, events_, device_memory_;
  // What this device made or mapped: pointer questions about it asked of CUDA no more.
  std::shared_ptr<MemoryRanges> known_ = std::make_shared<MemoryRanges>();
  std::shared_ptr<PinnedBlocks> pinned_ = std::make_shared<PinnedBlocks>(  // allocate_pinned's and copy's
      [known = known_](void** block, std::size_t bytes) {
        const cudaError_t status = implicit_sync::host_alloc(block, bytes, cudaHostAllocMapped | cudaHostAllocPortable);
        if (status == cudaSuccess) remember_pinned(*known, *block, bytes);
        return static_cast<int>(status);
      },
      [known = known_](void* block) {
        known->remove(block);
        implicit_sync::free_host(block);
      });
  std::unordered_set<void*> pooled_;  // device memory from the stream-ordered pool
  std::once_flag pool_once_;
  cudaStream_t pool_stream_ = nullptr;
  std::unordered_set<void*> opened_, opened_local_, registered_;  // open_shared, register_pinned
};

}  // namespace

std::unique_ptr<Device> make_cuda_device(int ordinal) { return std::make_unique<CudaDevice>(ordinal); }

}  // namespace tutti::device::cuda
