// Pinned host memory for the CUDA device (cuda_device.cpp): page-locked, mapped and portable, in
// power-of-two blocks of 4 KiB and up, kept for reuse once given back. cudaFreeHost waits for every
// stream of the context, held ones included (seen on an H100: with ranks as threads of one process,
// a staging pool that freed a buffer as it grew hung the ranks sharing the GPU), so a block is freed
// only when the device goes. Giving a block back makes no CUDA call: a host function on a stream
// may do it. The device and the host functions of its copies in flight share the object.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <map>
#include <mutex>
#include <unordered_map>

namespace tutti::device::cuda {

class PinnedBlocks {
 public:
  /// A block of at least `bytes` (not zeroed) into `block`; CUDA's error if it refuses. A
  /// `transient` block is one a stream's host function gives back (a copy in flight).
  cudaError_t take(std::size_t bytes, bool transient, void*& block);
  /// Gives back what take returned; false if it did not. After close: the block is forgotten.
  bool give_back(void* block);
  /// At the device's end: frees every block but the transient ones still out, which a held
  /// stream's host function may still use: they stay allocated for the life of the process.
  void close();

 private:
  struct Out {
    std::size_t bytes;
    bool transient;
  };
  std::mutex mutex_;
  std::unordered_map<void*, Out> out_;
  std::multimap<std::size_t, void*> free_;  // by size
  bool closed_ = false;
};

}  // namespace tutti::device::cuda
