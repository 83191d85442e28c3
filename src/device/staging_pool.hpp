// Pinned staging buffers that streams give back by themselves: the staging of the gpu layer's
// host_transfer backend and of the engine's device tensors on a stream. Each buffer is a header of
// 64-byte lines of flag words, then the data (256-byte aligned). A use of a buffer has a ticket
// (the user's own counter, increasing); the stream that uses it ends the use by writing the ticket
// into line 0, the buffer's `released` word (release()). A buffer is free once that word reached
// its latest ticket, so the host never waits for a stream to reuse one. A use that was half
// enqueued (its stream may never release it) is retired: never reused, never freed here. Buffers
// still in use when the pool goes stay allocated; the device frees them when it goes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "device/device.hpp"

namespace tutti::device {

class StagingPool {
 public:
  struct Buffer {
    std::byte* memory = nullptr;        // the header, then the data
    std::size_t capacity = 0;           // data bytes
    std::size_t header_bytes = 0;       //
    std::optional<std::uint32_t> last;  // the ticket of its latest use
    bool retired = false;
    /// Called (then cleared) when the buffer's latest use is over on the host side: the buffer is
    /// taken for another use, or freed.
    std::function<void()> on_drop;
    /// The first word of header line `i` (line 0: `released`).
    std::uint32_t* line(std::size_t i) const { return reinterpret_cast<std::uint32_t*>(memory + 64 * i); }
    std::byte* data() const { return memory + header_bytes; }
  };
  struct Taken {
    Buffer* buffer = nullptr;
    bool chained = false;                   // the stream waits for the buffer's latest use to be released
    std::optional<std::uint32_t> previous;  // the ticket of the use before (for cancel)
  };

  /// Buffers with `header_lines` lines of flags (line 0 is the pool's) before their data.
  /// `max_buffers`: how many buffers take() allocates before it chains (0: no limit).
  StagingPool(Device& device, std::size_t header_lines, std::size_t max_buffers = 0);
  /// Frees the free buffers (see the top of this file for the others).
  ~StagingPool();
  StagingPool(const StagingPool&) = delete;
  StagingPool& operator=(const StagingPool&) = delete;

  /// A buffer of at least `bytes` for use `ticket`: the smallest free one that fits; else a new
  /// one while the pool has fewer than max_buffers; else, if `may_chain`, the least recently used
  /// one that fits, which `stream` then waits for (released) before its next work: the host never
  /// waits, and a burst of uses does not allocate without bound; else a new one past the cap
  /// (replacing a free one too small, if any). A buffer not chained has `released` just below
  /// `ticket` (so also after the counter wraps). Error from the device if it cannot allocate.
  Taken take(std::size_t bytes, std::uint32_t ticket, Stream stream, bool may_chain = false);
  /// The use take() began was not enqueued at all (the stream refused its first work): the buffer
  /// is as it was before (a chained stream's wait, if enqueued, is for the use before: harmless).
  void cancel(const Taken& taken);
  /// Enqueues the end of `buffer`'s latest use on `stream`: released = its ticket.
  void release(Buffer& buffer, Stream stream);
  /// `buffer`'s latest use was half enqueued: its stream may never release it.
  static void retire(Buffer& buffer);
  bool is_free(const Buffer& buffer) const;
  /// Every buffer, for a user's own teardown.
  const std::vector<std::unique_ptr<Buffer>>& buffers() const { return buffers_; }

 private:
  static void drop(Buffer& buffer);

  Device& device_;
  const std::size_t header_bytes_;
  const std::size_t max_buffers_;
  std::vector<std::unique_ptr<Buffer>> buffers_;
};

}  // namespace tutti::device
