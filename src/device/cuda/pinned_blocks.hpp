// Pinned host memory for the CUDA device (cuda_device.cpp): page-locked, mapped and portable, in
// power-of-two blocks of 4 KiB and up, kept for reuse once given back. cudaFreeHost waits for every
// stream of the context, held ones included (seen on an H100: with ranks as threads of one process,
// a staging pool that freed a buffer as it grew hung the ranks sharing the GPU), so a block is freed
// only when the device goes. Giving a block back makes no CUDA call: a host function on a stream
// may do it. The device and the host functions of its copies in flight share the object.
// No lock is held across the allocator's calls: a stream's host function gives a block back (it
// takes the lock) while cudaFreeHost in close() may be waiting for that very stream.
// No CUDA header here: the allocator comes in as two functions (cudaHostAlloc and cudaFreeHost on
// the CUDA device; tests/device/device_pinned_blocks_test.cpp passes its own).
#pragma once

#include <cstddef>
#include <functional>
#include <map>
#include <mutex>
#include <unordered_map>

namespace tutti::device::cuda {

class PinnedBlocks {
 public:
  /// Makes a block of `bytes` into `block`: 0, or the allocator's error code (CUDA's).
  using Allocate = std::function<int(void** block, std::size_t bytes)>;
  /// Frees a block Allocate made.
  using Release = std::function<void(void* block)>;
  PinnedBlocks(Allocate allocate, Release release);

  /// A block of at least `bytes` (not zeroed) into `block`; 0, or the allocator's error if it
  /// refuses. A `transient` block is one a stream's host function gives back (a copy in flight).
  int take(std::size_t bytes, bool transient, void*& block);
  /// Gives back what take returned; false if it did not. After close: the block is forgotten.
  bool give_back(void* block);
  /// At the device's end: frees every block but the transient ones still out, which a held
  /// stream's host function may still use: they stay allocated for the life of the process. The
  /// frees run without the lock (a host function may give a block back meanwhile).
  void close();
  /// At the device's end while one of its streams is still held: as close, but frees nothing
  /// (each cudaFreeHost would wait for that stream): every block stays allocated for the life of
  /// the process.
  void abandon();

 private:
  struct Out {
    std::size_t bytes;
    bool transient;
  };
  Allocate allocate_;
  Release release_;
  std::mutex mutex_;
  std::unordered_map<void*, Out> out_;
  std::multimap<std::size_t, void*> free_;  // by size
  bool closed_ = false;
};

}  // namespace tutti::device::cuda
