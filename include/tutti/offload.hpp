// Out-of-core memory: a pool of device memory held under a byte budget. Blocks that do not fit
// are swapped to pinned host memory by asynchronous copies on a stream of the pool's own (the
// swap stream) and brought back, ahead of use, by prefetch. Training keeps the tensors it saves
// for backward and the optimizer's state here (tutti/torch_offload.hpp), so that a network whose
// working set exceeds the device's memory still trains.
//
// A block is device memory of a fixed size named by a Block handle. Its contents live either on
// the device (resident) or in the block's pinned host copy (swapped out); the pool moves them.
// A block the caller holds (between allocate or acquire and release) stays resident at a fixed
// address; the pool evicts only blocks nobody holds, least recently used first. "Pinned" in the
// out-of-memory message counts the bytes of held blocks, which nothing can evict.
//
// Budget: the pool's device memory never exceeds the budget. A block takes its size rounded up to
// 256 bytes (the device's alignment); that is what counts. An allocate, acquire or prefetch that
// needs room evicts first: it enqueues the copies to host on the swap stream, waits for them (the
// time counted as waited), then frees the device memory. When even evicting every unheld block
// leaves no room, or swapping is off and there is none, it raises Error(system) "out of device
// memory: need X, budget Y, in use Z (P pinned)" (bytes) and changes nothing.
//
// The device comes from TUTTI_DEVICE (`emulated` or `cuda`), else the emulated device, whose
// "device memory" is host memory (so the host may read and write a held block's pointer directly:
// host_addressable()). All calls may come from any thread; they are serialized.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "tutti/gpu.hpp"
#include "tutti/types.hpp"

namespace tutti::offload {

/// Names a block of a Pool. Value 0 is no block.
struct Block {
  std::uint64_t id = 0;
  explicit operator bool() const { return id != 0; }
  friend bool operator==(Block, Block) = default;
};

/// How the caller will use a block it acquires: a block acquired for reading keeps its host copy
/// valid, so evicting it later needs no copy.
enum class Access { read, write };

struct Options {
  /// Whether blocks may leave the device. Off: the budget is a hard limit and an allocation that
  /// does not fit raises the out-of-memory error.
  bool swap = true;
  /// The device; unset: TUTTI_DEVICE, else emulated.
  std::optional<gpu::DeviceKind> device;
  int ordinal = 0;
  /// Longest wait for one swap copy before Error(timeout).
  std::chrono::milliseconds timeout{60000};
};

/// What the pool did so far.
struct Counters {
  std::size_t in_use_bytes = 0;         // device bytes held by blocks now
  std::size_t peak_bytes = 0;           // the most device bytes ever held at once
  std::size_t host_bytes = 0;           // pinned host bytes of swap copies now
  std::uint64_t swapped_out_bytes = 0;  // copied device -> host
  std::uint64_t swapped_in_bytes = 0;   // copied host -> device
  std::uint64_t swap_outs = 0;          // copies device -> host
  std::uint64_t swap_ins = 0;           // copies host -> device
  std::uint64_t acquire_hits = 0;       // acquires that found the block resident or on its way
  std::uint64_t prefetch_hits = 0;      // of those, blocks that prefetch had brought back
  std::chrono::nanoseconds waited{0};   // time callers spent waiting for swap copies
};

namespace detail {
class PoolImpl;
}

/// A device-memory pool under a byte budget (the contract at the top of this file).
class Pool {
 public:
  /// A pool of at most `budget` device bytes. Error(invalid_argument) if budget is 0;
  /// Error(unsupported) for CUDA without a device or a CUDA build; Error(invalid_argument) for an
  /// unknown TUTTI_DEVICE.
  explicit Pool(std::size_t budget, Options options = {});
  /// Waits for the swap stream's copies and frees every block, device and host.
  ~Pool();
  Pool(const Pool&) = delete;
  Pool& operator=(const Pool&) = delete;

  /// A new block of `bytes` (contents undefined), resident and held by the caller (release it).
  /// Evicts as the header says; Error(invalid_argument) for bytes == 0; the out-of-memory
  /// Error(system) when it cannot fit.
  Block allocate(std::size_t bytes);
  /// The block's device pointer, valid until the matching release: makes the block resident
  /// (a block not prefetched is copied in now; one being prefetched is waited for only if its copy
  /// has not finished) and holds it. Holds nest. Access::write drops the host copy (the caller may
  /// change the contents). Error(invalid_argument) for an unknown block; out of memory as allocate.
  void* acquire(Block block, Access access = Access::write);
  /// The device pointer of a block the caller holds. Error(invalid_argument) if it is not held.
  void* data(Block block) const;
  /// Ends one hold (allocate's or acquire's). Error(invalid_argument) if the block is not held.
  void release(Block block);
  /// Starts bringing a swapped-out block back on the swap stream and returns at once (after any
  /// eviction its room needs). True if the block is resident or on its way afterwards; false if it
  /// cannot fit now (held blocks fill the budget): acquire then brings it. (Without swapping every
  /// block is always resident.)
  bool prefetch(Block block);
  /// Starts copying an unheld resident block to host on the swap stream and returns at once; its
  /// device memory stays until room is needed, when it goes without waiting for another copy.
  /// True if a copy was started or the host copy is already current; false if the block is held,
  /// swapped out already, or swapping is off.
  bool swap_out(Block block);
  /// Frees the block on device and host, held or not (after its swap copies finish).
  /// Block{} is a no-op; Error(invalid_argument) for an unknown block.
  void free(Block block);

  /// Whether the block's contents are on the device (or being copied there).
  bool resident(Block block) const;
  /// The block's size as allocated.
  std::size_t size(Block block) const;
  /// What a block of `bytes` counts against the budget: bytes rounded up to 256.
  static std::size_t charge(std::size_t bytes) { return (bytes + 255) / 256 * 256; }
  std::size_t budget() const;
  bool swapping() const;
  /// Whether the host may use a held block's pointer as ordinary memory (the emulated device).
  bool host_addressable() const;
  /// The device's name, e.g. "emulated".
  std::string device_name() const;
  Counters counters() const;

 private:
  std::unique_ptr<detail::PoolImpl> impl_;
};

}  // namespace tutti::offload
