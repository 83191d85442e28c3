// The emulated device: the device interface on the host, so that every GPU protocol runs in CI
// without a GPU. Device memory is host memory tagged as device (a registry of allocations, so
// that is_device_pointer and the argument checks work as on CUDA); each stream is an in-order
// worker thread (emulated_stream.hpp); copies and reductions run on the worker, the reductions
// through the host kernels (reduce::apply, reduce::divide), so results are bit for bit the host's.
// wait_value sleeps on the flag (a futex, woken by set_flag, checked at least every millisecond),
// never spinning. Destroying a stream runs its queued work with every wait released.
//
// The strict mode (TUTTI_EMULATED_STRICT=1 for make_device, or EmulatedDevice(true)) models what
// a CUDA context does where it bites instead (emulated_context.hpp): every device of one ordinal
// in the process shares one context whose few hardware queues run the streams' work, implicit
// waits that name the call that would hang, quarantined freed memory, sticky faults, and
// destroyed streams that keep their held waits pending. It mirrors what the CUDA device
// (cuda/cuda_device.cpp) does with each call: allocate and free use a pool stream of the
// device's own (cudaMallocAsync / cudaFreeAsync: no wait, the pool stream carries no work; the
// stream takes a hardware queue, as on CUDA); free of allocate_shared memory (cudaFree),
// unregister_pinned (cudaHostUnregister), close_shared of a peer's memory
// (cudaIpcCloseMemHandle) and destroying the device (cudaFreeHost of its pinned blocks) wait for
// every stream of the context; free_pinned returns the block to a cache (no wait). A copy from
// pageable host memory (neither this device's nor registered) reads it at the call, and one to
// it is written by a host function on the context's host-function thread, chunk by chunk, as
// the CUDA device's pinned bounce blocks do.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "device/device.hpp"
#include "device/emulated_context.hpp"
#include "device/emulated_stream.hpp"

namespace tutti::device {

class EmulatedDevice final : public Device {
 public:
  EmulatedDevice() = default;
  /// `strict`: the strict mode, on the process's context of device `ordinal` (shared with every
  /// other strict EmulatedDevice of that ordinal). make_device reads TUTTI_EMULATED_STRICT.
  explicit EmulatedDevice(bool strict, int ordinal = 0);
  /// Strict, with these settings where this creates the context of `ordinal` (tests).
  EmulatedDevice(const detail::StrictSettings& settings, int ordinal);
  /// Destroys the streams still open (as destroy_stream) and frees the memory still allocated.
  /// Strict: the streams' work stays queued (held waits reported), the memory goes to the
  /// quarantine, and the device-wide wait of cudaFreeHost is modelled (a hang is reported); but
  /// if one of its own streams is held, the memory stays allocated and live until the context
  /// ends, as ~CudaDevice leaves it rather than free it behind that stream.
  ~EmulatedDevice() override;

  Kind kind() const override { return Kind::emulated; }
  std::string name() const override { return context_ ? "emulated (strict)" : "emulated"; }
  std::uintptr_t queue_domain() const override { return reinterpret_cast<std::uintptr_t>(context_.get()); }
  bool strict() const { return context_ != nullptr; }
  /// The strict context (nullptr when not strict): its reports, for tests and tools.
  const detail::EmulatedContext* context() const { return context_.get(); }

  void* allocate(std::size_t bytes) override;
  void free(void* pointer) override;
  void* allocate_pinned(std::size_t bytes) override;
  void free_pinned(void* pointer) override;
  bool is_device_pointer(const void* pointer) const override;

  /// Shared memory is core's (core::SharedRegion, a memfd); the handle names the owner's pid and
  /// the memfd's descriptor and inode, which a peer (of the same user) opens through /proc
  /// (core::open_peer_region, read-write), checking the inode and size.
  void* allocate_shared(std::size_t bytes, IpcHandle& handle) override;
  void* open_shared(const IpcHandle& handle, std::size_t bytes) override;
  void close_shared(void* pointer) override;
  /// Host memory already serves as pinned memory here: only noted, for the strict mode's copies
  /// (strict: unregister_pinned waits for every stream of the context, as cudaHostUnregister).
  void register_pinned(void* pointer, std::size_t bytes) override;
  void unregister_pinned(void* pointer) override;

  Stream create_stream() override;
  void destroy_stream(Stream stream) override;
  void synchronize(Stream stream, std::chrono::milliseconds timeout) override;

  void copy(void* dst, const void* src, std::size_t bytes, Stream stream) override;
  void reduce(void* dst, const void* a, const void* b, std::size_t count, DataType type, ReduceOp op,
              Stream stream) override;
  void divide(void* data, std::size_t count, DataType type, int divisor, Stream stream) override;
  void compute(float* data, std::size_t count, int rounds, Stream stream) override;
  void write_value(std::uint32_t* flag, std::uint32_t value, Stream stream) override;
  void wait_value(const std::uint32_t* flag, std::uint32_t value, Stream stream) override;
  void set_flag(std::uint32_t* flag, std::uint32_t value) override;

  Event create_event() override;
  void destroy_event(Event event) override;
  void record(Event event, Stream stream) override;
  bool query(Event event) override;
  void wait_event(Stream stream, Event event) override;

  /// Makes [pointer, pointer + bytes), memory that this device did not allocate (a peer's buffer
  /// mapped from shared memory), count as device memory until `forget`; it is never freed here.
  /// Error(invalid_argument) for a null pointer, bytes == 0, or a range that overlaps one known.
  void adopt(void* pointer, std::size_t bytes);
  /// Ends what adopt began; Error(invalid_argument) for a pointer adopt did not get.
  void forget(void* pointer);

 protected:
  /// Strict mode: the streams held at (or with a queued) wait_value whose flag is not written.
  /// Otherwise "": destroying a stream releases its waits.
  std::string held_streams_now() const override;

 private:
  enum class Memory { device, pinned, adopted, opened };
  struct Allocation {
    std::size_t bytes;
    Memory memory;
    // Shared and opened memory (a tutti::core::SharedRegion, a core::PeerRegion): unmapped when
    // dropped, not freed.
    std::shared_ptr<void> mapping = nullptr;
    bool peer = false;  // opened: another process's memory (CUDA maps it; its own it does not)
  };
  /// Releases an allocation's memory (free, or drops its mapping).
  static void release(std::uintptr_t first, const Allocation& allocation);

  void* allocate_as(std::size_t bytes, Memory memory, const char* function);
  void free_as(void* pointer, Memory memory, const char* function);
  /// Error(invalid_argument) unless [p, p + bytes) lies inside one device allocation (adopted too).
  void check_device_range(const void* p, std::size_t bytes, const char* what, const char* function) const;
  std::shared_ptr<detail::EmulatedStream> worker(Stream stream, const char* function) const;
  // Strict: raises the context's sticky error; no-op otherwise.
  void raise_if_faulted(const char* function) const;
  // Strict: the task, after a check that none of `ranges` is quarantined (freed) memory.
  struct Range {
    const void* p;
    std::size_t bytes;
    const char* what;
  };
  std::function<void()> checked_task(const char* function, std::vector<Range> ranges, std::function<void()> task) const;
  // Strict: the CUDA device's pool stream, made at the first allocate: it takes its place in the
  // round-robin of hardware queues, as on CUDA.
  void make_pool_stream();
  // Strict: the quarantine takes what free, free_pinned, close_shared or the destructor let go.
  void quarantine(std::uintptr_t first, Allocation allocation, const char* function);
  std::shared_ptr<detail::EventState> event_state(Event event, const char* function) const;
  // Whether `p` is pageable host memory: not this device's, not registered.
  bool pageable(const void* p) const;
  // Strict: a copy from or to pageable memory, as the CUDA device makes it.
  void copy_pageable(void* dst, const void* src, std::size_t bytes, detail::StrictStream& stream, bool from_pageable,
                     bool to_pageable);

  std::shared_ptr<detail::EmulatedContext> context_;  // strict mode only
  mutable std::mutex mutex_;
  std::shared_ptr<detail::StrictStream> pool_stream_;
  std::map<std::uintptr_t, Allocation> allocations_;  // by first address
  std::map<std::uintptr_t, std::size_t> registered_;  // register_pinned's ranges, by first address
  std::map<void*, std::shared_ptr<detail::EmulatedStream>> streams_;
  std::map<void*, std::shared_ptr<detail::EventState>> events_;
};

}  // namespace tutti::device
