#include "device/cuda/pinned_blocks.hpp"

#include <algorithm>
#include <bit>
#include <limits>

namespace tutti::device::cuda {

cudaError_t PinnedBlocks::take(std::size_t bytes, bool transient, void*& block) {
  block = nullptr;
  if (bytes > std::numeric_limits<std::size_t>::max() / 2) return cudaErrorMemoryAllocation;
  const std::size_t size = std::bit_ceil(std::max<std::size_t>(bytes, 4096));
  {
    std::lock_guard lock(mutex_);
    if (auto cached = free_.find(size); cached != free_.end()) {
      block = cached->second;
      free_.erase(cached);
    }
  }
  if (block == nullptr)
    if (const cudaError_t status = cudaHostAlloc(&block, size, cudaHostAllocMapped | cudaHostAllocPortable);
        status != cudaSuccess)
      return status;
  std::lock_guard lock(mutex_);
  out_.emplace(block, Out{size, transient});
  return cudaSuccess;
}

bool PinnedBlocks::give_back(void* block) {
  std::lock_guard lock(mutex_);
  const auto it = out_.find(block);
  if (it == out_.end()) return false;
  if (!closed_) free_.emplace(it->second.bytes, block);
  out_.erase(it);
  return true;
}

void PinnedBlocks::close() {
  std::lock_guard lock(mutex_);
  closed_ = true;
  for (const auto& [size, block] : free_) cudaFreeHost(block);
  free_.clear();
  std::erase_if(out_, [](const auto& entry) {
    if (entry.second.transient) return false;
    cudaFreeHost(entry.first);
    return true;
  });
}

}  // namespace tutti::device::cuda
