// AVX2 kernels: the portable loops compiled with -mavx2 -mf16c (see CMakeLists.txt), plus f16 and
// bf16 written with intrinsics, since no compiler vectorizes the conversions. reduce.cpp calls
// this table only on a CPU with AVX2 and F16C.
#if defined(TUTTI_REDUCE_X86)

#include <immintrin.h>

#include "reduce/kernel_table.hpp"
#include "reduce/portable_loops.hpp"

namespace tutti::reduce {
namespace {

inline __m256 splat_bits(std::uint32_t bits) { return _mm256_castsi256_ps(_mm256_set1_epi32(static_cast<int>(bits))); }
inline __m256 is_nan(__m256 x) { return _mm256_cmp_ps(x, x, _CMP_UNORD_Q); }

// element_ops.hpp's rules, eight floats at a time.
inline __m256 propagate_nan(__m256 a, __m256 b, __m256 result) {
  const __m256 quiet = splat_bits(0x00400000u);
  result = _mm256_blendv_ps(result, _mm256_or_ps(b, quiet), is_nan(b));
  return _mm256_blendv_ps(result, _mm256_or_ps(a, quiet), is_nan(a));
}

struct VecSum {
  __m256 operator()(__m256 a, __m256 b) const { return propagate_nan(a, b, _mm256_add_ps(a, b)); }
};
struct VecProd {
  __m256 operator()(__m256 a, __m256 b) const { return propagate_nan(a, b, _mm256_mul_ps(a, b)); }
};
struct VecMin {
  __m256 operator()(__m256 a, __m256 b) const {
    const __m256 low = _mm256_min_ps(a, b);  // ties and NaN give b
    const __m256 tie = _mm256_cmp_ps(a, b, _CMP_EQ_OQ);
    return propagate_nan(a, b, _mm256_blendv_ps(low, _mm256_or_ps(a, b), tie));
  }
};
struct VecMax {
  __m256 operator()(__m256 a, __m256 b) const {
    const __m256 high = _mm256_max_ps(a, b);  // ties and NaN give b
    const __m256 tie = _mm256_cmp_ps(a, b, _CMP_EQ_OQ);
    return propagate_nan(a, b, _mm256_blendv_ps(high, _mm256_and_ps(a, b), tie));
  }
};
struct VecDivide {
  __m256 divisor;
  __m256 operator()(__m256 a, __m256) const { return _mm256_div_ps(a, divisor); }
};

// IEEE half via F16C. vcvtps2ph keeps a NaN's payload where detail::float_to_f16_bits gives
// sign | 0x7e00, so NaNs are first replaced by the f32 NaN that converts to exactly that.
struct F16x8 {
  static __m256 load(const std::uint16_t* p) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  static void store(std::uint16_t* p, __m256 x) {
    const __m256 canonical = _mm256_or_ps(_mm256_and_ps(x, splat_bits(0x80000000u)), splat_bits(0x7fc00000u));
    x = _mm256_blendv_ps(x, canonical, is_nan(x));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT));
  }
};

// bfloat16 by integer shifts with round-to-nearest-even, as detail::float_to_bf16_bits.
struct Bf16x8 {
  static __m256 load(const std::uint16_t* p) {
    const __m256i wide = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16));
  }
  static void store(std::uint16_t* p, __m256 x) {
    const __m256i bits = _mm256_castps_si256(x);
    const __m256i top = _mm256_srli_epi32(bits, 16);
    const __m256i bias = _mm256_add_epi32(_mm256_set1_epi32(0x7fff), _mm256_and_si256(top, _mm256_set1_epi32(1)));
    const __m256i rounded = _mm256_srli_epi32(_mm256_add_epi32(bits, bias), 16);
    const __m256i nan = _mm256_or_si256(top, _mm256_set1_epi32(0x40));
    const __m256i half = _mm256_blendv_epi8(rounded, nan, _mm256_castps_si256(is_nan(x)));
    // packus works within 128-bit lanes: gather the two lanes' results into the low half.
    const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(half, half), 0x08);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm256_castsi256_si128(packed));
  }
};

// d = op(a, b) over 16-bit storage; d may equal a or b (each block is loaded before it is stored).
template <class Codec, class Op>
void half_loop(std::uint16_t* d, const std::uint16_t* a, const std::uint16_t* b, std::size_t n, Op op) {
  std::size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256 a0 = Codec::load(a + i), b0 = Codec::load(b + i);
    const __m256 a1 = Codec::load(a + i + 8), b1 = Codec::load(b + i + 8);
    Codec::store(d + i, op(a0, b0));
    Codec::store(d + i + 8, op(a1, b1));
  }
  for (; i + 8 <= n; i += 8) Codec::store(d + i, op(Codec::load(a + i), Codec::load(b + i)));
  if (i == n) return;
  // The last few elements go through zero-padded copies and the same vector code, so that they
  // get exactly the same bits as the others.
  std::uint16_t x[8] = {}, y[8] = {}, r[8];
  for (std::size_t j = 0; j < n - i; ++j) x[j] = a[i + j], y[j] = b[i + j];
  Codec::store(r, op(Codec::load(x), Codec::load(y)));
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

constexpr KernelTable make_table() {
  KernelTable table{};
  set_portable_rows(table);
  set_half_row<F16x8>(table, DataType::f16);
  set_half_row<Bf16x8>(table, DataType::bf16);
  return table;
}

constexpr KernelTable table = make_table();

}  // namespace

const KernelTable& avx2_kernels() { return table; }

}  // namespace tutti::reduce

#endif  // TUTTI_REDUCE_X86
