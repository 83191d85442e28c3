// The emulated device: the device interface on the host, so that every GPU protocol runs in CI
// without a GPU. Device memory is host memory tagged as device (a registry of allocations, so
// that is_device_pointer and the argument checks work as on CUDA); each stream is an in-order
// worker thread (emulated_stream.hpp); copies and reductions run on the worker, the reductions
// through the host kernels (reduce::apply, reduce::divide), so results are bit for bit the host's.
// wait_value sleeps on the flag (a futex, woken by set_flag, checked at least every millisecond),
// never spinning. Destroying a stream runs its queued work with every wait released.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>

#include "device/device.hpp"
#include "device/emulated_stream.hpp"

namespace tutti::device {

class EmulatedDevice final : public Device {
 public:
  EmulatedDevice() = default;
  /// Destroys the streams still open (as destroy_stream) and frees the memory still allocated.
  ~EmulatedDevice() override;

  Kind kind() const override { return Kind::emulated; }
  std::string name() const override { return "emulated"; }

  void* allocate(std::size_t bytes) override;
  void free(void* pointer) override;
  void* allocate_pinned(std::size_t bytes) override;
  void free_pinned(void* pointer) override;
  bool is_device_pointer(const void* pointer) const override;

  /// Shared memory is core's (detail::SharedRegion, a memfd); the handle names the owner's pid and
  /// the memfd's descriptor and inode, which a peer (of the same user) opens through /proc
  /// (core::open_peer_region, read-write), checking the inode and size.
  void* allocate_shared(std::size_t bytes, IpcHandle& handle) override;
  void* open_shared(const IpcHandle& handle, std::size_t bytes) override;
  void close_shared(void* pointer) override;
  /// Host memory already serves as pinned memory here: nothing to do.
  void register_pinned(void*, std::size_t) override {}
  void unregister_pinned(void*) override {}

  Stream create_stream() override;
  void destroy_stream(Stream stream) override;
  void synchronize(Stream stream, std::chrono::milliseconds timeout) override;

  void copy(void* dst, const void* src, std::size_t bytes, Stream stream) override;
  void reduce(void* dst, const void* a, const void* b, std::size_t count, DataType type, ReduceOp op,
              Stream stream) override;
  void divide(void* data, std::size_t count, DataType type, int divisor, Stream stream) override;
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

 private:
  enum class Memory { device, pinned, adopted, opened };
  struct Allocation {
    std::size_t bytes;
    Memory memory;
    // Shared and opened memory (a tutti::detail::SharedRegion, a core::PeerRegion): unmapped when
    // dropped, not freed.
    std::shared_ptr<void> mapping = nullptr;
  };
  /// Releases an allocation's memory (free, or drops its mapping).
  static void release(std::uintptr_t first, const Allocation& allocation);

  void* allocate_as(std::size_t bytes, Memory memory, const char* function);
  void free_as(void* pointer, Memory memory, const char* function);
  /// Error(invalid_argument) unless [p, p + bytes) lies inside one device allocation (adopted too).
  void check_device_range(const void* p, std::size_t bytes, const char* what, const char* function) const;
  std::shared_ptr<detail::StreamWorker> worker(Stream stream, const char* function) const;
  std::shared_ptr<detail::EventState> event_state(Event event, const char* function) const;

  mutable std::mutex mutex_;
  std::map<std::uintptr_t, Allocation> allocations_;  // by first address
  std::map<void*, std::shared_ptr<detail::StreamWorker>> streams_;
  std::map<void*, std::shared_ptr<detail::EventState>> events_;
};

}  // namespace tutti::device
