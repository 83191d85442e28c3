// The device interface: memory, in-order streams, events, stream flag operations and reduction
// kernels, as the GPU collectives (host_transfer, ipc, nccl) need them. Two implementations: CUDA
// (device/cuda/, built when CMake finds the toolkit) and the emulated device (emulated.hpp), on
// which CI runs every GPU protocol without a GPU.
//
// Everything enqueued on a Stream runs in the order it was enqueued, after everything enqueued
// before it; enqueueing returns at once (it never waits for the stream). Arguments are checked
// when the work is enqueued: a bad argument raises Error(invalid_argument) from the enqueueing
// call and nothing is enqueued. Every function may be called from any thread.
//
// Flags are how the host and a stream signal each other: a flag is a naturally aligned 32-bit word
// in pinned memory (allocate_pinned: the host and the stream both see it) or in device memory
// (stream to stream). A stream writes one with write_value and waits on one with wait_value; the
// host writes one with set_flag and reads one with load_flag. A host that gives up on an operation
// (a dead peer, a timeout) releases the streams waiting for it by writing a larger value: nothing
// may leave a stream waiting on a flag nobody will write.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "tutti/types.hpp"

namespace tutti::device {

/// An in-order queue of asynchronous work on a device. A handle: copying it does not copy the
/// stream. On CUDA `handle` is the cudaStream_t, so a stream the caller created can be used.
struct Stream {
  void* handle = nullptr;
  friend bool operator==(Stream, Stream) = default;
};

/// A marker in a stream's work: complete once the stream has done everything enqueued before the
/// record. A handle, like Stream. On CUDA `handle` is the cudaEvent_t.
struct Event {
  void* handle = nullptr;
  friend bool operator==(Event, Event) = default;
};

/// Which implementation a Device is: the public gpu::DeviceKind (one enum for both layers).
using Kind = gpu::DeviceKind;

/// Names a shared device allocation to other processes on this host (allocate_shared): on CUDA a
/// cudaIpcMemHandle_t, on the emulated device the owner's pid and memfd.
struct IpcHandle {
  std::byte bytes[64] = {};
};

class Device {
 public:
  virtual ~Device() = default;
  Device() = default;
  Device(const Device&) = delete;
  Device& operator=(const Device&) = delete;

  /// Which implementation this is.
  virtual Kind kind() const = 0;
  /// Names the device for messages, e.g. "emulated" or "cuda:0 (NVIDIA H100)".
  virtual std::string name() const = 0;
  /// The hardware queues this device's streams run on, where other devices of this process share
  /// them: CUDA's context of an ordinal (every rank that is a thread of this process on that GPU
  /// uses it), a strict emulated context. A held wait on one stream there holds the streams that
  /// share its queue, whoever made them. 0: the streams share queues with no other device.
  virtual std::uintptr_t queue_domain() const { return 0; }

  // ---- memory ----

  /// `bytes` of device memory, aligned to 256 bytes, contents undefined. Error(invalid_argument)
  /// if bytes == 0; Error(system) when the device is out of memory.
  virtual void* allocate(std::size_t bytes) = 0;
  /// Frees what allocate returned; nullptr is a no-op. The caller makes sure no stream still uses
  /// it. Error(invalid_argument) for any other pointer.
  virtual void free(void* pointer) = 0;
  /// `bytes` of pinned host memory, zeroed, aligned to 256 bytes, that the host and the device both
  /// read and write directly (on CUDA: page-locked and mapped). Staging buffers and host flags live
  /// here. Errors as allocate.
  virtual void* allocate_pinned(std::size_t bytes) = 0;
  /// Frees what allocate_pinned returned; nullptr is a no-op; Error(invalid_argument) otherwise.
  /// On CUDA the block goes back to a cache of the device's, freed with the device: cudaFreeHost
  /// waits for every stream of the context, held ones included.
  virtual void free_pinned(void* pointer) = 0;
  /// Whether `pointer` lies in device memory (anywhere inside an allocation; on CUDA also managed
  /// memory and peers' memory opened through IPC). Pinned host memory is not device memory.
  virtual bool is_device_pointer(const void* pointer) const = 0;

  // ---- sharing between processes of one host (the ipc backend) ----

  /// Like allocate, and `handle` names the memory to other processes (open_shared). Freed with
  /// free; processes that opened it must close it first.
  virtual void* allocate_shared(std::size_t bytes, IpcHandle& handle) = 0;
  /// Maps the `bytes` a peer's allocate_shared named (this process's own handle works too, at
  /// another address): device memory here until close_shared. Error(system) if it cannot.
  virtual void* open_shared(const IpcHandle& handle, std::size_t bytes) = 0;
  /// Unmaps what open_shared returned; the owner's memory is untouched.
  virtual void close_shared(void* pointer) = 0;
  /// Makes `bytes` of ordinary host memory at `pointer` (say, a shared-memory mapping several
  /// processes see) usable as pinned memory: stream copies and flags. Until unregister_pinned.
  virtual void register_pinned(void* pointer, std::size_t bytes) = 0;
  virtual void unregister_pinned(void* pointer) = 0;

  // ---- streams ----

  /// A new stream. Error(system) if the device cannot make one.
  virtual Stream create_stream() = 0;
  /// Destroys a stream create_stream made, after the work enqueued on it: returns once that work
  /// is done (emulated) or at once with the work still to run (CUDA). Work that waits on a flag or
  /// an event nobody completes is a caller's error: the emulated device then releases those waits
  /// (they count as satisfied, the rest of the work runs in order, so destroy never hangs); CUDA
  /// would leave the work pending for ever, so release every flag first. Error(invalid_argument)
  /// for a stream this device did not create.
  virtual void destroy_stream(Stream stream) = 0;
  /// The streams of this device whose work is not done after `grace` (at a wait for a flag nobody
  /// has written, or behind a failure), said in words; "" if none. Never waits longer than
  /// `grace`. A free waits for every stream of the context on CUDA (cudaFree, cudaFreeHost,
  /// cudaHostUnregister, cudaIpcCloseMemHandle), for ever behind a held one: while this says
  /// something, memory is left to the device's end (~Ipc), and the device's destructor leaves its
  /// memory allocated rather than free it behind them.
  std::string held_streams(std::chrono::milliseconds grace) const;
  /// Waits until everything enqueued on `stream` is done. For tests and tools: the collectives
  /// never call it. Error(timeout) if that takes longer than `timeout`; an error the stream's work
  /// raised is raised here.
  virtual void synchronize(Stream stream, std::chrono::milliseconds timeout) = 0;

  // ---- work on a stream (asynchronous) ----

  /// Copies `bytes` from `src` to `dst`, in any direction between device, pinned and ordinary host
  /// memory. bytes == 0 enqueues nothing. Error(invalid_argument) for a null pointer with bytes > 0
  /// or buffers that overlap (other than dst == src, a no-op). Never waits for the stream:
  /// on CUDA, pageable host memory goes through pinned blocks of the device's (read at the call;
  /// written by a host function when the stream gets there).
  virtual void copy(void* dst, const void* src, std::size_t bytes, Stream stream) = 0;
  /// dst[i] = a[i] op b[i] for i < count, all three in device memory; bit for bit what
  /// reduce::apply computes on the host (f16/bf16 accumulate in f32 and round to nearest even).
  /// ReduceOp::avg reduces as sum: `divide` finishes an average. `dst` may alias `a` or `b`
  /// exactly. count == 0 enqueues nothing. Error(invalid_argument) for a pointer outside device
  /// memory, a partial overlap, or an unknown type or op.
  virtual void reduce(void* dst, const void* a, const void* b, std::size_t count, DataType type, ReduceOp op,
                      Stream stream) = 0;
  /// data[i] /= divisor, as reduce::divide does on the host (integers truncate toward zero).
  /// Error(invalid_argument) if divisor < 1 or data is not device memory (count > 0).
  virtual void divide(void* data, std::size_t count, DataType type, int divisor, Stream stream) = 0;
  /// A stand-in for a training step's compute (benchmarks of overlap, tutti-bench --overlap):
  /// `rounds` times data[i] = fma(data[i], 0.5f, 1.0f) for i < count, f32 in place, each element a
  /// chain of dependent fused multiply-adds; bit for bit what std::fma gives on the host.
  /// count == 0 or rounds == 0 enqueues nothing. Error(invalid_argument) for rounds < 0 or data
  /// not f32-aligned device memory.
  virtual void compute(float* data, std::size_t count, int rounds, Stream stream) = 0;
  /// Once everything enqueued before it is done, the stream stores `value` into `*flag` (with
  /// release order: a host that sees the value sees the stream's earlier writes).
  /// Error(invalid_argument) for a null or misaligned flag.
  virtual void write_value(std::uint32_t* flag, std::uint32_t value, Stream stream) = 0;
  /// The stream waits until (std::int32_t)(*flag - value) >= 0, i.e. *flag >= value with 32-bit
  /// wrap-around (cuStreamWaitValue32's GEQ); the host call returns at once. Work enqueued after it
  /// runs once the flag reaches the value. Errors as write_value.
  virtual void wait_value(const std::uint32_t* flag, std::uint32_t value, Stream stream) = 0;

  // ---- flags, from the host ----

  /// Stores `value` into `*flag` from the host (release order) and wakes streams waiting on it.
  /// Error(invalid_argument) for a null or misaligned flag.
  virtual void set_flag(std::uint32_t* flag, std::uint32_t value) = 0;
  /// The flag's current value, as the host sees it (acquire order).
  static std::uint32_t load_flag(const std::uint32_t* flag) {
    return std::atomic_ref<std::uint32_t>(*const_cast<std::uint32_t*>(flag)).load(std::memory_order_acquire);
  }
  /// Whether flag value `value` satisfies wait_value(flag, n): value >= n with 32-bit wrap-around.
  static bool reached(std::uint32_t value, std::uint32_t n) { return static_cast<std::int32_t>(value - n) >= 0; }

  // ---- events ----

  /// A new event, complete until first recorded. Error(system) if the device cannot make one.
  virtual Event create_event() = 0;
  /// Destroys an event create_event made; streams that wait on it still see it complete.
  /// Error(invalid_argument) for an event this device did not create.
  virtual void destroy_event(Event event) = 0;
  /// Marks the work enqueued on `stream` so far: the event completes once that work is done.
  /// Recording again moves the mark (query and wait_event see the latest record).
  virtual void record(Event event, Stream stream) = 0;
  /// Whether the event's latest record is complete; never blocks.
  virtual bool query(Event event) = 0;
  /// Work enqueued on `stream` after this call waits until the event's latest record (as of this
  /// call) is complete; the host call returns at once.
  virtual void wait_event(Stream stream, Event event) = 0;

 protected:
  /// held_streams without waiting: the streams whose work is not done now, in words; "" if none
  /// (the default: a device whose frees never wait for its streams).
  virtual std::string held_streams_now() const { return ""; }
};

/// A device of the given kind: the emulated device, or CUDA device `ordinal`.
/// Error(unsupported) if Tutti was built without CUDA or no CUDA device is present.
std::unique_ptr<Device> make_device(Kind kind, int ordinal = 0);

/// The kind TUTTI_DEVICE names (`emulated` or `cuda`; unset: `fallback`).
/// Error(invalid_argument) naming the variable for any other value.
Kind kind_from_env(Kind fallback);

/// make_device(kind_from_env(fallback), ordinal).
std::unique_ptr<Device> open_device(Kind fallback, int ordinal = 0);

std::string_view to_string(Kind kind);

/// Whether this build of Tutti has the CUDA device.
bool built_with_cuda();

}  // namespace tutti::device
