// f16 and bf16 kernels with AVX2 + F16C intrinsics (no compiler vectorizes the conversions),
// for kernels_avx2.cpp and, f16 only, kernels_avx512.cpp. Internal linkage, in namespace avx2, for
// the reason given in element_ops.hpp; include only from files built with at least -mavx2 -mf16c.
#pragma once

#include <immintrin.h>

#include <cstddef>
#include <cstdint>

#include "reduce/kernel_table.hpp"
#include "reduce/portable_loops.hpp"

namespace tutti::reduce {
namespace {
namespace avx2 {

inline __m256 splat_bits(std::uint32_t bits) { return _mm256_castsi256_ps(_mm256_set1_epi32(static_cast<int>(bits))); }

// Lane masks: AVX-512VL's mask registers where the including file has them (one op fewer per
// select than blendv, which GCC otherwise turns into a compare and a masked op), else vectors.
#if defined(__AVX512VL__)
using Mask = __mmask8;
inline Mask is_nan(__m256 x) { return _mm256_cmp_ps_mask(x, x, _CMP_UNORD_Q); }
inline Mask is_equal(__m256 a, __m256 b) { return _mm256_cmp_ps_mask(a, b, _CMP_EQ_OQ); }
inline __m256 select(Mask where, __m256 yes, __m256 no) { return _mm256_mask_mov_ps(no, where, yes); }
#else
using Mask = __m256;
inline Mask is_nan(__m256 x) { return _mm256_cmp_ps(x, x, _CMP_UNORD_Q); }
inline Mask is_equal(__m256 a, __m256 b) { return _mm256_cmp_ps(a, b, _CMP_EQ_OQ); }
inline __m256 select(Mask where, __m256 yes, __m256 no) { return _mm256_blendv_ps(no, yes, where); }
#endif

// element_ops.hpp's rules, eight floats at a time.
inline __m256 quiet_where(Mask where, __m256 result, __m256 nan) {
  return select(where, _mm256_or_ps(nan, splat_bits(0x00400000u)), result);
}
// For add and mul only `a`'s NaN needs placing: when only `b` is NaN, x86 returns it quieted
// whichever operand order the compiler emits.
inline __m256 propagate_nan_of_a(__m256 a, __m256 result) { return quiet_where(is_nan(a), result, a); }
inline __m256 propagate_nan(__m256 a, __m256 b, __m256 result) {
  return quiet_where(is_nan(a), quiet_where(is_nan(b), result, b), a);
}

struct VecSum {
  __m256 operator()(__m256 a, __m256 b) const { return propagate_nan_of_a(a, _mm256_add_ps(a, b)); }
};
struct VecProd {
  __m256 operator()(__m256 a, __m256 b) const { return propagate_nan_of_a(a, _mm256_mul_ps(a, b)); }
};
struct VecMin {
  __m256 operator()(__m256 a, __m256 b) const {
    const __m256 low = _mm256_min_ps(a, b);                                       // ties and NaN give b
    return propagate_nan(a, b, select(is_equal(a, b), _mm256_or_ps(a, b), low));  // -0 beats +0
  }
};
struct VecMax {
  __m256 operator()(__m256 a, __m256 b) const {
    const __m256 high = _mm256_max_ps(a, b);                                        // ties and NaN give b
    return propagate_nan(a, b, select(is_equal(a, b), _mm256_and_ps(a, b), high));  // +0 beats -0
  }
};
struct VecDivide {
  __m256 divisor;
  __m256 operator()(__m256 a, __m256) const { return _mm256_div_ps(a, divisor); }
};

// A codec loads 16 halves from memory as two f32 vectors, `lo` and `hi`, and stores them back;
// the order of elements inside the vectors is the codec's business.

// IEEE half via F16C, eight at a time straight from and to memory: on Zen 4 this beat both one
// 256-bit load split in two and 512-bit conversions (60 against 37 and 48 GB/s, f16 sum in L1),
// which is why the AVX-512 table uses it too. vcvtps2ph keeps a NaN's payload where
// detail::float_to_f16_bits gives sign | 0x7e00, so NaNs are first replaced by the f32 NaN
// that converts to exactly that.
struct F16x16 {
  static __m256 load8(const std::uint16_t* p) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  static void store8(std::uint16_t* p, __m256 x) {
    const __m256 canonical = _mm256_or_ps(_mm256_and_ps(x, splat_bits(0x80000000u)), splat_bits(0x7fc00000u));
    x = select(is_nan(x), canonical, x);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT));
  }
  static void load(const std::uint16_t* p, __m256& lo, __m256& hi) { lo = load8(p), hi = load8(p + 8); }
  static void store(std::uint16_t* p, __m256 lo, __m256 hi) { store8(p, lo), store8(p + 8, hi); }
};

// bfloat16: widening interleaves each half under a zero half (x << 16) within 128-bit lanes, and
// packus undoes exactly that interleave. Rounding is to nearest even by integer add, as
// detail::float_to_bf16_bits. Its NaN case is not needed: every NaN reaching here is a quieted
// input or the default NaN, whose low 16 bits are zero, so the add rounds it to itself.
struct Bf16x16 {
  static void load(const std::uint16_t* p, __m256& lo, __m256& hi) {
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    lo = _mm256_castsi256_ps(_mm256_unpacklo_epi16(_mm256_setzero_si256(), h));
    hi = _mm256_castsi256_ps(_mm256_unpackhi_epi16(_mm256_setzero_si256(), h));
  }
  static __m256i round(__m256 x) {
    const __m256i bits = _mm256_castps_si256(x);
    const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1));
    return _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(bits, _mm256_set1_epi32(0x7fff)), odd), 16);
  }
  static void store(std::uint16_t* p, __m256 lo, __m256 hi) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm256_packus_epi32(round(lo), round(hi)));
  }
};

// d = op(a, b) over 16-bit storage; d may equal a or b (each block is loaded before it is stored).
template <class Codec, class Op>
void half_loop(std::uint16_t* d, const std::uint16_t* a, const std::uint16_t* b, std::size_t n, Op op) {
  const auto block = [op](std::uint16_t* out, const std::uint16_t* x, const std::uint16_t* y) {
    __m256 x_lo, x_hi, y_lo, y_hi;
    Codec::load(x, x_lo, x_hi);
    Codec::load(y, y_lo, y_hi);
    Codec::store(out, op(x_lo, y_lo), op(x_hi, y_hi));
  };
  std::size_t i = 0;
  for (; i + 16 <= n; i += 16) block(d + i, a + i, b + i);
  if (i == n) return;
  // The rest goes through zero-padded copies and the same vector code, so it gets the same bits.
  std::uint16_t x[16] = {}, y[16] = {}, r[16];
  for (std::size_t j = 0; j < n - i; ++j) x[j] = a[i + j], y[j] = b[i + j];
  block(r, x, y);
  for (std::size_t j = 0; j < n - i; ++j) d[i + j] = r[j];
}

template <class Codec, class Op>
void half_kernel(void* dst, const void* a, const void* b, std::size_t n) {
  half_loop<Codec>(static_cast<std::uint16_t*>(dst), static_cast<const std::uint16_t*>(a),
                   static_cast<const std::uint16_t*>(b), n, Op{});
}

template <class Codec>
void half_divide(void* data, std::size_t n, int divisor) {
  auto* d = static_cast<std::uint16_t*>(data);
  half_loop<Codec>(d, d, d, n, VecDivide{_mm256_set1_ps(static_cast<float>(divisor))});
}

template <class Codec>
constexpr void set_half_row(KernelTable& table, DataType type) {
  set_ops(table, type, &half_kernel<Codec, VecSum>, &half_kernel<Codec, VecProd>, &half_kernel<Codec, VecMin>,
          &half_kernel<Codec, VecMax>);
  table.divide[index_of(type)] = &half_divide<Codec>;
}

}  // namespace avx2
}  // namespace
}  // namespace tutti::reduce
