// The memory a device made or mapped itself, by address range: device memory (its allocations,
// what it opened by IPC handle) and pinned host memory (its pinned blocks, what it registered),
// with the address streams use for it. The CUDA device answers its own questions from here rather
// than ask CUDA (cudaPointerGetAttributes, once per flag, copy and kernel argument, was most of a
// collective's host enqueue time on an H200): what a stream operation addresses, whether a copy
// touches pageable memory, whether a buffer is device memory. Anything not found here (a caller's
// buffer) is still asked of CUDA. Ranges are added where the memory is made and removed before it
// is freed; one added over a stale range replaces it. Thread-safe; no CUDA header.
#pragma once

#include <cstddef>
#include <cstdint>
#include <iterator>
#include <map>
#include <mutex>
#include <optional>

namespace tutti::device {

class MemoryRanges {
 public:
  enum class Kind { device, pinned };
  struct Found {
    Kind kind;
    std::uintptr_t device_address;  // of the address looked up, as streams address it
  };

  /// Records [pointer, pointer + bytes) as `kind`, streams addressing it from `device_address`.
  /// A range overlapping it (memory freed behind this object's back) is dropped first.
  void add(const void* pointer, std::size_t bytes, Kind kind, const void* device_address) {
    const auto begin = address(pointer), end = begin + bytes;
    if (bytes == 0) return;
    std::lock_guard lock(mutex_);
    auto it = ranges_.lower_bound(begin);
    if (it != ranges_.begin() && std::prev(it)->second.end > begin) --it;
    while (it != ranges_.end() && it->first < end) it = ranges_.erase(it);
    ranges_.emplace(begin, Range{end, kind, address(device_address)});
  }
  /// Forgets the range that starts at `pointer`, if any.
  void remove(const void* pointer) {
    std::lock_guard lock(mutex_);
    ranges_.erase(address(pointer));
  }
  /// What `pointer` lies in, if this object knows.
  std::optional<Found> find(const void* pointer) const {
    const auto at = address(pointer);
    std::lock_guard lock(mutex_);
    auto it = ranges_.upper_bound(at);
    if (it == ranges_.begin()) return std::nullopt;
    --it;
    if (at >= it->second.end) return std::nullopt;
    return Found{it->second.kind, it->second.device_base + (at - it->first)};
  }
  void clear() {
    std::lock_guard lock(mutex_);
    ranges_.clear();
  }

 private:
  struct Range {
    std::uintptr_t end;
    Kind kind;
    std::uintptr_t device_base;
  };
  static std::uintptr_t address(const void* p) { return reinterpret_cast<std::uintptr_t>(p); }
  mutable std::mutex mutex_;
  std::map<std::uintptr_t, Range> ranges_;  // by start
};

}  // namespace tutti::device
