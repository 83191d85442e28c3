#include "bootstrap/ghash.hpp"

#include <cstring>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define TUTTI_GHASH_X86 1
// GCC 12's AVX-512 intrinsics start from `__m512i y = y;` (_mm512_undefined_*), which -O2
// reports as maybe-uninitialized (GCC bug 105593, fixed in 13); the value is never read.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif
#endif

namespace tutti::bootstrap::ghash {

#if defined(TUTTI_GHASH_X86)

// Only these functions use the instructions; the rest of the library is built for the baseline,
// and available() keeps them from running elsewhere.
#define TUTTI_GHASH_TARGET __attribute__((target("pclmul,ssse3,sse4.1,avx512f,avx512bw,avx512vl,vpclmulqdq")))

namespace {

// The field, bit-reflected: a block's 16 bytes reversed make a 128-bit integer whose bit 127 is
// the coefficient of x^0 and bit 0 that of x^127. The product of two such integers by carry-less
// multiplication is 255 bits whose bit k is the coefficient of x^(254-k); read as 256 bits (bit k
// the coefficient of x^(255-k)) it is the product times x. Keys are therefore kept times x^-1,
// and the 256-bit product of a value and a key is the field product unreduced. x^-1 is
// x^127 + x^6 + x + 1 (x^128 = x^7 + x^2 + x + 1): bits 0, 121, 126 and 127.

TUTTI_GHASH_TARGET inline __m128i byte_reversal() {
  return _mm_set_epi8(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
}

TUTTI_GHASH_TARGET inline __m128i polynomial() {
  return _mm_set_epi64x(static_cast<long long>(0xc200000000000000ULL), 1);
}

// The 256-bit product as its low, middle (shifted by 64 bits) and high 128-bit parts, reduced:
// the lowest 64 bits (x^192..x^255) fold into the middle, where x^128 = x^7 + x^2 + x + 1 puts
// them once unshifted (the halves swapped) and once times x, x^2 and x^7 (one multiplication by
// the top word of x^-1's pattern), and the middle's low 64 bits fold into the high part the same
// way.
TUTTI_GHASH_TARGET inline __m128i reduce(__m128i lo, __m128i mi, __m128i hi) {
  const __m128i p = polynomial();
  mi = _mm_xor_si128(mi, _mm_xor_si128(_mm_shuffle_epi32(lo, 0x4e), _mm_clmulepi64_si128(lo, p, 0x10)));
  return _mm_xor_si128(hi, _mm_xor_si128(_mm_shuffle_epi32(mi, 0x4e), _mm_clmulepi64_si128(mi, p, 0x10)));
}

// a * b, where b is kept times x^-1.
TUTTI_GHASH_TARGET inline __m128i multiply(__m128i a, __m128i b) {
  const __m128i lo = _mm_clmulepi64_si128(a, b, 0x00);
  const __m128i hi = _mm_clmulepi64_si128(a, b, 0x11);
  const __m128i mi = _mm_xor_si128(_mm_clmulepi64_si128(a, b, 0x01), _mm_clmulepi64_si128(a, b, 0x10));
  return reduce(lo, mi, hi);
}

// a times x^-1: one bit towards x^0 (a left shift of the reflected integer); x^0 becomes x^-1.
TUTTI_GHASH_TARGET inline __m128i times_x_inverse(__m128i a) {
  const auto lo = static_cast<std::uint64_t>(_mm_cvtsi128_si64(a));
  const auto hi = static_cast<std::uint64_t>(_mm_extract_epi64(a, 1));
  const __m128i shifted =
      _mm_set_epi64x(static_cast<long long>((hi << 1) | (lo >> 63)), static_cast<long long>(lo << 1));
  return (hi >> 63) != 0 ? _mm_xor_si128(shifted, polynomial()) : shifted;
}

TUTTI_GHASH_TARGET inline __m128i load_reflected(const std::uint8_t* p) {
  return _mm_shuffle_epi8(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)), byte_reversal());
}

TUTTI_GHASH_TARGET inline __m128i fold_lanes(__m512i v) {
  const __m256i half = _mm256_xor_si256(_mm512_castsi512_si256(v), _mm512_extracti64x4_epi64(v, 1));
  return _mm_xor_si128(_mm256_castsi256_si128(half), _mm256_extracti128_si256(half, 1));
}

}  // namespace

bool available() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("pclmul") && __builtin_cpu_supports("ssse3") && __builtin_cpu_supports("sse4.1") &&
         __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("vpclmulqdq");
}

TUTTI_GHASH_TARGET void prepare(Key& key, const std::uint8_t h[block]) {
  const __m128i h1 = load_reflected(h);
  const __m128i h1_key = times_x_inverse(h1);
  __m128i power = h1;
  for (std::size_t k = 1; k <= powers; ++k) {  // power[i] holds H^(32 - i): the first block meets H^32
    const __m128i entry = times_x_inverse(power);
    _mm_store_si128(reinterpret_cast<__m128i*>(key.power[powers - k]), entry);
    _mm_store_si128(reinterpret_cast<__m128i*>(key.halves[powers - k]),
                    _mm_xor_si128(entry, _mm_shuffle_epi32(entry, 0x4e)));
    power = multiply(power, h1_key);
  }
}

namespace {

// Four blocks times four keys, added to the unreduced sums: low and high products, and
// Karatsuba's (d_lo + d_hi)(k_lo + k_hi), from which the middle is the sum less low and high.
TUTTI_GHASH_TARGET inline void accumulate(__m512i d, const __m512i& k, const __m512i& halves, __m512i& lo, __m512i& mid,
                                          __m512i& hi) {
  const __m512i d_halves = _mm512_xor_si512(d, _mm512_shuffle_epi32(d, _MM_PERM_BADC));
  lo = _mm512_xor_si512(lo, _mm512_clmulepi64_epi128(d, k, 0x00));
  hi = _mm512_xor_si512(hi, _mm512_clmulepi64_epi128(d, k, 0x11));
  mid = _mm512_xor_si512(mid, _mm512_clmulepi64_epi128(d_halves, halves, 0x00));
}

TUTTI_GHASH_TARGET inline __m128i reduce_sums(__m512i lo, __m512i mid, __m512i hi) {
  mid = _mm512_ternarylogic_epi64(mid, lo, hi, 0x96);
  return reduce(fold_lanes(lo), fold_lanes(mid), fold_lanes(hi));
}

}  // namespace

TUTTI_GHASH_TARGET void absorb(const Key& key, State& state, const std::uint8_t* data, std::size_t blocks) {
  constexpr std::size_t vectors = powers / 4;
  __m128i y = _mm_load_si128(reinterpret_cast<const __m128i*>(state.y));
  const __m512i reversal = _mm512_set4_epi64(0x0001020304050607, 0x08090a0b0c0d0e0f, 0x0001020304050607,
                                             0x08090a0b0c0d0e0f);  // byte_reversal() in each lane
  const auto* table = reinterpret_cast<const __m512i*>(key.power);
  const auto* halves = reinterpret_cast<const __m512i*>(key.halves);
  // Y' = (Y + X1) H^32 + X2 H^31 + ... + X32 H: 32 products summed unreduced, one reduction.
  for (; blocks >= powers; blocks -= powers, data += powers * block) {
    __m512i lo = _mm512_setzero_si512(), mid = lo, hi = lo;
    for (std::size_t j = 0; j < vectors; ++j) {
      __m512i d = _mm512_shuffle_epi8(_mm512_loadu_si512(data + 64 * j), reversal);
      if (j == 0) d = _mm512_xor_si512(d, _mm512_zextsi128_si512(y));
      accumulate(d, _mm512_load_si512(table + j), _mm512_load_si512(halves + j), lo, mid, hi);
    }
    y = reduce_sums(lo, mid, hi);
  }
  // Then four at a time against H^4 .. H^1, the table's last vector.
  for (; blocks >= 4; blocks -= 4, data += 4 * block) {
    __m512i lo = _mm512_setzero_si512(), mid = lo, hi = lo;
    const __m512i d =
        _mm512_xor_si512(_mm512_shuffle_epi8(_mm512_loadu_si512(data), reversal), _mm512_zextsi128_si512(y));
    accumulate(d, _mm512_load_si512(table + vectors - 1), _mm512_load_si512(halves + vectors - 1), lo, mid, hi);
    y = reduce_sums(lo, mid, hi);
  }
  const __m128i h1_key = _mm_load_si128(reinterpret_cast<const __m128i*>(key.power[powers - 1]));
  for (; blocks > 0; --blocks, data += block) y = multiply(_mm_xor_si128(y, load_reflected(data)), h1_key);
  _mm_store_si128(reinterpret_cast<__m128i*>(state.y), y);
}

TUTTI_GHASH_TARGET void output(const State& state, std::uint8_t out[block]) {
  const __m128i y = _mm_load_si128(reinterpret_cast<const __m128i*>(state.y));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(out), _mm_shuffle_epi8(y, byte_reversal()));
}

#else

bool available() { return false; }
void prepare(Key&, const std::uint8_t*) {}
void absorb(const Key&, State&, const std::uint8_t*, std::size_t) {}
void output(const State&, std::uint8_t*) {}

#endif

}  // namespace tutti::bootstrap::ghash
