#include "core/copy.hpp"

#if defined(__x86_64__)
#include <emmintrin.h>
#endif

namespace tutti::core {

void copy_vector(std::byte* dst, const std::byte* src, std::size_t bytes) {
  std::size_t i = 0;
#if defined(__x86_64__)
  for (; i + 64 <= bytes; i += 64) {
    const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 16));
    const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 32));
    const __m128i d = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 48));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i), a);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i + 16), b);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i + 32), c);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i + 48), d);
  }
#endif
  std::memcpy(dst + i, src + i, bytes - i);  // the tail, under 64 bytes: no rep movsb
}

}  // namespace tutti::core
