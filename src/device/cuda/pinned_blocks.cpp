#include "device/cuda/pinned_blocks.hpp"

#include <algorithm>
#include <bit>
#include <limits>
#include <utility>
#include <vector>

namespace tutti::device::cuda {

PinnedBlocks::PinnedBlocks(Allocate allocate, Release release)
    : allocate_(std::move(allocate)), release_(std::move(release)) {}

int PinnedBlocks::take(std::size_t bytes, bool transient, void*& block) {
  block = nullptr;
  // Past half the address space no power of two fits: the allocator refuses the size as asked.
  if (bytes > std::numeric_limits<std::size_t>::max() / 2) return allocate_(&block, bytes);
  const std::size_t size = std::bit_ceil(std::max<std::size_t>(bytes, 4096));
  {
    std::lock_guard lock(mutex_);
    if (auto cached = free_.find(size); cached != free_.end()) {
      block = cached->second;
      free_.erase(cached);
    }
  }
  if (block == nullptr)
    if (const int status = allocate_(&block, size); status != 0) {
      block = nullptr;
      return status;
    }
  std::lock_guard lock(mutex_);
  out_.emplace(block, Out{size, transient});
  return 0;
}

bool PinnedBlocks::give_back(void* block) {
  std::lock_guard lock(mutex_);
  const auto it = out_.find(block);
  if (it == out_.end()) return false;
  if (!closed_) free_.emplace(it->second.bytes, block);
  out_.erase(it);
  return true;
}

void PinnedBlocks::abandon() {
  std::lock_guard lock(mutex_);
  closed_ = true;
  free_.clear();
  out_.clear();
}

void PinnedBlocks::close() {
  std::vector<void*> blocks;
  {
    std::lock_guard lock(mutex_);
    closed_ = true;
    for (const auto& entry : free_) blocks.push_back(entry.second);
    free_.clear();
    std::erase_if(out_, [&](const auto& entry) {
      if (entry.second.transient) return false;
      blocks.push_back(entry.first);
      return true;
    });
  }
  // Without the lock: cudaFreeHost waits for every stream of the context, and a stream's host
  // function (a copy's bounce block given back) needs the lock to let its stream go on.
  for (void* block : blocks) release_(block);
}

}  // namespace tutti::device::cuda
