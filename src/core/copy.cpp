#include "core/copy.hpp"

#include <algorithm>

#if defined(__x86_64__)
#include <emmintrin.h>
#endif

namespace tutti::core {

namespace {

#if defined(__x86_64__)
// Copies whole 64-byte blocks of [src, src + bytes) with `store` (a 16-byte SSE2 store); returns
// how many bytes it copied (the rest, under 64, is the caller's).
template <class Store>
std::size_t copy_blocks(std::byte* dst, const std::byte* src, std::size_t bytes, Store store) {
  std::size_t i = 0;
  for (; i + 64 <= bytes; i += 64) {
    const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 16));
    const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 32));
    const __m128i d = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 48));
    store(reinterpret_cast<__m128i*>(dst + i), a);
    store(reinterpret_cast<__m128i*>(dst + i + 16), b);
    store(reinterpret_cast<__m128i*>(dst + i + 32), c);
    store(reinterpret_cast<__m128i*>(dst + i + 48), d);
  }
  return i;
}
#endif

}  // namespace

void copy_vector(std::byte* dst, const std::byte* src, std::size_t bytes) {
  std::size_t i = 0;
#if defined(__x86_64__)
  i = copy_blocks(dst, src, bytes, [](__m128i* to, __m128i v) { _mm_storeu_si128(to, v); });
#endif
  std::memcpy(dst + i, src + i, bytes - i);  // the tail, under 64 bytes: no rep movsb
}

void copy_streaming(std::byte* dst, const std::byte* src, std::size_t bytes) {
#if defined(__x86_64__)
  const std::size_t head = std::min<std::size_t>(bytes, (16 - reinterpret_cast<std::uintptr_t>(dst) % 16) % 16);
  std::memcpy(dst, src, head);
  dst += head, src += head, bytes -= head;
  const std::size_t i = copy_blocks(dst, src, bytes, [](__m128i* to, __m128i v) { _mm_stream_si128(to, v); });
  std::memcpy(dst + i, src + i, bytes - i);
  _mm_sfence();  // the streamed stores are visible before whatever synchronizes after the copy
#else
  std::memcpy(dst, src, bytes);
#endif
}

}  // namespace tutti::core
