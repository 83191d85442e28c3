// AVX-512 kernels: the portable loops compiled with -mavx512f -mavx512bw -mavx512vl -mavx512dq
// and 512-bit vectors (see CMakeLists.txt), plus f16 and bf16 written with intrinsics. reduce.cpp
// calls this table only on a CPU with all four extensions.
//
// bf16 does not use avx512_bf16's vcvtneps2bf16: it treats subnormal inputs as zero and flushes
// subnormal results, where detail::float_to_bf16_bits (and every other path) keeps them.
#if defined(TUTTI_REDUCE_X86)

// GCC 12's AVX-512 intrinsics start from `__m512i y = y;` (_mm512_undefined_*), which -O2
// reports as maybe-uninitialized (GCC bug 105593, fixed in 13); the value is never read.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop

#include "reduce/kernel_table.hpp"
#include "reduce/portable_loops.hpp"

namespace tutti::reduce {
namespace {

inline __m512i splat(std::uint32_t bits) { return _mm512_set1_epi32(static_cast<int>(bits)); }
inline __m512i as_int(__m512 x) { return _mm512_castps_si512(x); }
inline __m512 as_float(__m512i x) { return _mm512_castsi512_ps(x); }
inline __mmask16 is_nan(__m512 x) { return _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q); }

// element_ops.hpp's rules, sixteen floats at a time.
inline __m512 propagate_nan(__m512 a, __m512 b, __m512 result) {
  const __m512i quiet = splat(0x00400000u);
  __m512i r = _mm512_mask_or_epi32(as_int(result), is_nan(b), as_int(b), quiet);
  r = _mm512_mask_or_epi32(r, is_nan(a), as_int(a), quiet);
  return as_float(r);
}

struct VecSum {
  __m512 operator()(__m512 a, __m512 b) const { return propagate_nan(a, b, _mm512_add_ps(a, b)); }
};
struct VecProd {
  __m512 operator()(__m512 a, __m512 b) const { return propagate_nan(a, b, _mm512_mul_ps(a, b)); }
};
struct VecMin {
  __m512 operator()(__m512 a, __m512 b) const {
    const __m512 low = _mm512_min_ps(a, b);  // ties and NaN give b
    const __mmask16 tie = _mm512_cmp_ps_mask(a, b, _CMP_EQ_OQ);
    return propagate_nan(a, b, as_float(_mm512_mask_or_epi32(as_int(low), tie, as_int(a), as_int(b))));
  }
};
struct VecMax {
  __m512 operator()(__m512 a, __m512 b) const {
    const __m512 high = _mm512_max_ps(a, b);  // ties and NaN give b
    const __mmask16 tie = _mm512_cmp_ps_mask(a, b, _CMP_EQ_OQ);
    return propagate_nan(a, b, as_float(_mm512_mask_and_epi32(as_int(high), tie, as_int(a), as_int(b))));
  }
};
struct VecDivide {
  __m512 divisor;
  __m512 operator()(__m512 a, __m512) const { return _mm512_div_ps(a, divisor); }
};

// IEEE half. vcvtps2ph keeps a NaN's payload where detail::float_to_f16_bits gives sign | 0x7e00,
// so NaNs are first replaced by the f32 NaN that converts to exactly that.
struct F16x16 {
  static __m512 widen(__m256i h) { return _mm512_cvtph_ps(h); }
  static __m256i narrow(__m512 x) {
    const __m512i canonical = _mm512_or_si512(_mm512_and_si512(as_int(x), splat(0x80000000u)), splat(0x7fc00000u));
    x = as_float(_mm512_mask_mov_epi32(as_int(x), is_nan(x), canonical));
    return _mm512_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT);
  }
};

// bfloat16 by integer shifts with round-to-nearest-even, as detail::float_to_bf16_bits.
struct Bf16x16 {
  static __m512 widen(__m256i h) { return as_float(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16)); }
  static __m256i narrow(__m512 x) {
    const __m512i bits = as_int(x);
    const __m512i top = _mm512_srli_epi32(bits, 16);
    const __m512i bias = _mm512_add_epi32(splat(0x7fffu), _mm512_and_si512(top, splat(1u)));
    const __m512i rounded = _mm512_srli_epi32(_mm512_add_epi32(bits, bias), 16);
    const __m512i half = _mm512_mask_or_epi32(rounded, is_nan(x), top, splat(0x40u));
    return _mm512_cvtepi32_epi16(half);
  }
};

inline __m256i load16(const std::uint16_t* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }
inline void store16(std::uint16_t* p, __m256i v) { _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), v); }

// d = op(a, b) over 16-bit storage; d may equal a or b (each block is loaded before it is stored).
template <class Codec, class Op>
void half_loop(std::uint16_t* d, const std::uint16_t* a, const std::uint16_t* b, std::size_t n, Op op) {
  std::size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    const __m512 a0 = Codec::widen(load16(a + i)), b0 = Codec::widen(load16(b + i));
    const __m512 a1 = Codec::widen(load16(a + i + 16)), b1 = Codec::widen(load16(b + i + 16));
    store16(d + i, Codec::narrow(op(a0, b0)));
    store16(d + i + 16, Codec::narrow(op(a1, b1)));
  }
  for (; i < n; i += 16) {  // the rest, masked: the same vector code, so the same bits
    const __mmask16 live = n - i >= 16 ? __mmask16(0xffff) : static_cast<__mmask16>((1u << (n - i)) - 1u);
    const __m512 x = Codec::widen(_mm256_maskz_loadu_epi16(live, a + i));
    const __m512 y = Codec::widen(_mm256_maskz_loadu_epi16(live, b + i));
    _mm256_mask_storeu_epi16(d + i, live, Codec::narrow(op(x, y)));
  }
}

template <class Codec, class Op>
void half_kernel(void* dst, const void* a, const void* b, std::size_t n) {
  half_loop<Codec>(static_cast<std::uint16_t*>(dst), static_cast<const std::uint16_t*>(a),
                   static_cast<const std::uint16_t*>(b), n, Op{});
}

template <class Codec>
void half_divide(void* data, std::size_t n, int divisor) {
  auto* d = static_cast<std::uint16_t*>(data);
  half_loop<Codec>(d, d, d, n, VecDivide{_mm512_set1_ps(static_cast<float>(divisor))});
}

template <class Codec>
constexpr void set_half_row(KernelTable& table, DataType type) {
  set_ops(table, type, &half_kernel<Codec, VecSum>, &half_kernel<Codec, VecProd>, &half_kernel<Codec, VecMin>,
          &half_kernel<Codec, VecMax>);
  table.divide[index_of(type)] = &half_divide<Codec>;
}

constexpr KernelTable make_table() {
  KernelTable table{};
  set_portable_rows(table);
  set_half_row<F16x16>(table, DataType::f16);
  set_half_row<Bf16x16>(table, DataType::bf16);
  return table;
}

constexpr KernelTable table = make_table();

}  // namespace

const KernelTable& avx512_kernels() { return table; }

}  // namespace tutti::reduce

#endif  // TUTTI_REDUCE_X86
