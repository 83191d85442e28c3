// AVX-512 kernels: the portable loops compiled with -mavx512f -mavx512bw -mavx512vl -mavx512dq
// -mf16c (see CMakeLists.txt on their vector width), bf16 written with 512-bit intrinsics, and f16
// from half_avx2.hpp. reduce.cpp calls this table only on a CPU with all five extensions.
//
// bf16 does not use avx512_bf16's vcvtneps2bf16: it treats subnormal inputs as zero and flushes
// subnormal results, where detail::float_to_bf16_bits (and every other path) keeps them.
#if defined(TUTTI_REDUCE_X86)

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

#include "reduce/half_avx2.hpp"
#include "reduce/kernel_table.hpp"
#include "reduce/portable_loops.hpp"

namespace tutti::reduce {
namespace {

inline __m512i splat(std::uint32_t bits) { return _mm512_set1_epi32(static_cast<int>(bits)); }
inline __m512i as_int(__m512 x) { return _mm512_castps_si512(x); }
inline __m512 as_float(__m512i x) { return _mm512_castsi512_ps(x); }
inline __mmask16 is_nan(__m512 x) { return _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q); }

// element_ops.hpp's rules, sixteen floats at a time.
inline __m512 quiet_where(__mmask16 where, __m512 result, __m512 nan) {
  return as_float(_mm512_mask_or_epi32(as_int(result), where, as_int(nan), splat(0x00400000u)));
}
// For add and mul only `a`'s NaN needs placing: when only `b` is NaN, x86 returns it quieted
// whichever operand order the compiler emits.
inline __m512 propagate_nan_of_a(__m512 a, __m512 result) { return quiet_where(is_nan(a), result, a); }
inline __m512 propagate_nan(__m512 a, __m512 b, __m512 result) {
  return quiet_where(is_nan(a), quiet_where(is_nan(b), result, b), a);
}

struct VecSum {
  __m512 operator()(__m512 a, __m512 b) const { return propagate_nan_of_a(a, _mm512_add_ps(a, b)); }
};
struct VecProd {
  __m512 operator()(__m512 a, __m512 b) const { return propagate_nan_of_a(a, _mm512_mul_ps(a, b)); }
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

// bfloat16, 32 at a time: one __m512i becomes two f32 vectors and back. Widening interleaves each half under a zero
// half (x << 16) within 128-bit lanes, and packus undoes exactly that interleave. Rounding is to nearest even by
// integer add, as detail::float_to_bf16_bits. Its NaN case is not needed: every NaN reaching here is a quieted input or
// the default NaN, whose low 16 bits are zero, so the add rounds it to itself.
struct Bf16x32 {
  static __m512 low(__m512i h) { return as_float(_mm512_unpacklo_epi16(_mm512_setzero_si512(), h)); }
  static __m512 high(__m512i h) { return as_float(_mm512_unpackhi_epi16(_mm512_setzero_si512(), h)); }
  static __m512i round(__m512 x) {
    const __m512i bits = as_int(x);
    const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(bits, 16), splat(1u));
    return _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(bits, splat(0x7fffu)), odd), 16);
  }
  static __m512i narrow(__m512 lo, __m512 hi) { return _mm512_packus_epi32(round(lo), round(hi)); }
};

// d = op(a, b) over 16-bit storage; d may equal a or b (each block is loaded before it is stored).
template <class Codec, class Op>
void half_loop(std::uint16_t* d, const std::uint16_t* a, const std::uint16_t* b, std::size_t n, Op op) {
  const auto block = [op](__m512i x, __m512i y) {
    return Codec::narrow(op(Codec::low(x), Codec::low(y)), op(Codec::high(x), Codec::high(y)));
  };
  std::size_t i = 0;
  for (; i + 32 <= n; i += 32) _mm512_storeu_si512(d + i, block(_mm512_loadu_si512(a + i), _mm512_loadu_si512(b + i)));
  if (i == n) return;
  // The rest, masked: the same vector code, so the same bits.
  const __mmask32 live = static_cast<__mmask32>((std::uint64_t(1) << (n - i)) - 1u);
  _mm512_mask_storeu_epi16(d + i, live,
                           block(_mm512_maskz_loadu_epi16(live, a + i), _mm512_maskz_loadu_epi16(live, b + i)));
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
  avx2::set_half_row<avx2::F16x16>(table, DataType::f16);  // see half_avx2.hpp on why 256-bit
  set_half_row<Bf16x32>(table, DataType::bf16);
  return table;
}

constexpr KernelTable table = make_table();

}  // namespace

const KernelTable& avx512_kernels() { return table; }

}  // namespace tutti::reduce

#endif  // TUTTI_REDUCE_X86
