// Copying bulk data between buffers: memcpy, less a trap of some x86-64 CPUs.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace tutti::core {

/// Copies `bytes` from `src` to `dst` (which do not overlap) in a plain vector loop.
void copy_vector(std::byte* dst, const std::byte* src, std::size_t bytes);

/// Copies `bytes` from `src` to `dst` (which do not overlap) with non-temporal stores (SSE2,
/// every x86-64; memcpy elsewhere): for results written once and not read again soon, which
/// then spare the cache and the read-for-ownership of every destination line. The stores are
/// fenced before it returns.
void copy_streaming(std::byte* dst, const std::byte* src, std::size_t bytes);

/// memcpy, except where it is slow: with glibc before 2.39 on CPUs with fast short `rep movsb`
/// (AMD Zen among them), a copy of 4 KiB to about 1 MiB whose destination lies 1-63 bytes after
/// its source modulo a 4 KiB page runs 20-40 times slower than the same copy aligned (measured
/// here: 64 KiB in 31 us against 1.6 us). malloc's large blocks (std::vector, new[]) start 16
/// bytes into a page and the shared-memory segment's slots at page starts, so copies from the
/// segment into user buffers hit exactly that; those go through copy_vector (1.8 us).
inline void copy(void* dst, const void* src, std::size_t bytes) {
#if defined(__x86_64__)
  const std::uintptr_t distance =
      (reinterpret_cast<std::uintptr_t>(dst) - reinterpret_cast<std::uintptr_t>(src)) & std::uintptr_t{4095};
  if (bytes >= 2048 && distance != 0 && distance < 64)
    return copy_vector(static_cast<std::byte*>(dst), static_cast<const std::byte*>(src), bytes);
#endif
  std::memcpy(dst, src, bytes);
}

/// copy() for regions that may overlap (memmove's contract).
inline void move(void* dst, const void* src, std::size_t bytes) {
  const auto d = reinterpret_cast<std::uintptr_t>(dst), s = reinterpret_cast<std::uintptr_t>(src);
  if (d + bytes <= s || s + bytes <= d) return copy(dst, src, bytes);
  std::memmove(dst, src, bytes);
}

}  // namespace tutti::core
