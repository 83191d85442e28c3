// The pinned staging pool (staging_pool.hpp).
#include "device/staging_pool.hpp"

#include <algorithm>
#include <utility>

namespace tutti::device {

namespace {

constexpr std::size_t data_alignment = 256;

}  // namespace

StagingPool::StagingPool(Device& device, std::size_t header_lines, std::size_t max_buffers)
    : device_(device),
      header_bytes_((std::max<std::size_t>(header_lines, 1) * 64 + data_alignment - 1) / data_alignment *
                    data_alignment),
      max_buffers_(max_buffers) {}

StagingPool::~StagingPool() {
  for (auto& b : buffers_) {
    if (!is_free(*b)) continue;  // a stream may still use it
    drop(*b);
    device_.free_pinned(b->memory);
  }
}

bool StagingPool::is_free(const Buffer& b) const {
  return !b.retired && (!b.last || Device::reached(Device::load_flag(b.line(0)), *b.last));
}

void StagingPool::drop(Buffer& b) {
  if (b.on_drop) std::exchange(b.on_drop, nullptr)();
}

StagingPool::Taken StagingPool::take(std::size_t bytes, std::uint32_t ticket, Stream stream, bool may_chain) {
  Buffer* best = nullptr;    // the smallest free one that fits
  Buffer* small = nullptr;   // a free one too small
  Buffer* oldest = nullptr;  // the least recently used one that fits (retired ones never)
  for (auto& b : buffers_) {
    if (b->retired) continue;
    if (b->last && b->capacity >= bytes && (oldest == nullptr || *b->last - *oldest->last > (1u << 31)))
      oldest = b.get();
    if (!is_free(*b)) continue;
    if (b->capacity >= bytes && (best == nullptr || b->capacity < best->capacity)) best = b.get();
    if (b->capacity < bytes) small = b.get();
  }
  Taken taken{best, false, std::nullopt};
  if (best == nullptr && may_chain && max_buffers_ > 0 && buffers_.size() >= max_buffers_ && oldest != nullptr) {
    device_.wait_value(oldest->line(0), *oldest->last, stream);  // the stream, not the host, waits
    taken = {oldest, true, std::nullopt};
  }
  if (taken.buffer == nullptr) {
    const std::size_t capacity = std::max<std::size_t>(bytes, 4096);
    auto* memory = static_cast<std::byte*>(device_.allocate_pinned(header_bytes_ + capacity));
    if (small != nullptr) {
      drop(*small);
      device_.free_pinned(small->memory);
    } else {
      buffers_.push_back(std::make_unique<Buffer>());
      small = buffers_.back().get();
    }
    *small = Buffer{memory, capacity, header_bytes_, std::nullopt, false, nullptr};
    taken.buffer = small;
  }
  Buffer& b = *taken.buffer;
  drop(b);
  taken.previous = b.last;
  if (!taken.chained) device_.set_flag(b.line(0), ticket - 1);
  b.last = ticket;
  return taken;
}

void StagingPool::cancel(const Taken& taken) {
  Buffer& b = *taken.buffer;
  if (taken.chained)
    b.last = taken.previous;
  else
    device_.set_flag(b.line(0), *b.last);  // released: free again
}

void StagingPool::release(Buffer& b, Stream stream) { device_.write_value(b.line(0), *b.last, stream); }

void StagingPool::retire(Buffer& b) {
  b.retired = true;
  drop(b);
}

}  // namespace tutti::device
