// What every reduction means, one element at a time. The portable loops (portable_loops.hpp) are
// these functions auto-vectorized; the hand-written AVX2 / AVX-512 half-precision kernels restate
// them with intrinsics and must agree bit for bit (tests/reduce/reduce_test.cpp compares every path).
//
// Integers: sum and prod wrap (computed in the unsigned type: no signed-overflow UB).
// Floating point (f16 and bf16 are computed in f32, then rounded to nearest even):
// - NaN: if `a` is NaN the result is `a` quieted, else if `b` is NaN it is `b` quieted; an invalid
//   operation on numbers (inf - inf, 0 * inf) gives the CPU's default NaN. x86 already propagates
//   the first operand's NaN, but a compiler may swap the operands of `a + b`; stating the rule
//   makes the bits independent of code generation. f16/bf16 then round NaN as tutti::detail does
//   (f16: sign | 0x7e00; bf16: the top half | 0x40).
// - min/max are IEEE 754-2019 minimum/maximum: a NaN operand gives NaN and -0 < +0. Unlike
//   std::min, the result (up to the NaN payload) does not depend on which rank's value is `a`,
//   so ranks that reduce in different orders agree.
//
// Everything here has internal linkage on purpose: each kernel file compiles it with different
// -m flags, and an inline function with external linkage would be emitted by all of them and
// merged by the linker into one copy, possibly the AVX-512 one, then called on any CPU.
// For the same reason this code calls __builtin_bit_cast rather than std::bit_cast.
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>

namespace tutti::reduce {
namespace {

template <class F>
struct FloatBits;
template <>
struct FloatBits<float> {
  using Bits = std::uint32_t;
  static constexpr Bits sign = 0x80000000u, exponent = 0x7f800000u, quiet = 0x00400000u;
};
template <>
struct FloatBits<double> {
  using Bits = std::uint64_t;
  static constexpr Bits sign = 0x8000000000000000u, exponent = 0x7ff0000000000000u, quiet = 0x0008000000000000u;
};

template <class F>
using Bits = typename FloatBits<F>::Bits;

template <class F>
inline Bits<F> bits_of(F x) {
  return __builtin_bit_cast(Bits<F>, x);
}
template <class F>
inline F float_of(Bits<F> x) {
  return __builtin_bit_cast(F, x);
}

// Selections are bit masks, not branches or `?:` on a computed float: GCC -O2 does not if-convert
// a select whose arm it could sink (an add that may trap), and then does not vectorize the loop.
template <class F>
inline Bits<F> mask_of(bool condition) {
  return Bits<F>(0) - Bits<F>(condition);
}
// Compared as signed integers (both sides are below the sign bit): SSE2 and AVX2 have no
// unsigned compare.
template <class F>
inline Bits<F> nan_mask(F x) {
  using Signed = std::make_signed_t<Bits<F>>;
  return mask_of<F>(static_cast<Signed>(bits_of(x) & ~FloatBits<F>::sign) >
                    static_cast<Signed>(FloatBits<F>::exponent));
}
template <class F>
inline F select(Bits<F> mask, F yes, F no) {
  return float_of<F>((bits_of(yes) & mask) | (bits_of(no) & ~mask));
}
template <class F>
inline F quiet(F x) {
  return float_of<F>(bits_of(x) | FloatBits<F>::quiet);
}
// `result` of a op b, with the NaN rule above applied.
template <class F>
inline F propagate_nan(F a, F b, F result) {
  result = select(nan_mask(b), quiet(b), result);
  return select(nan_mask(a), quiet(a), result);
}

template <class T>
inline constexpr bool is_float_v = std::is_floating_point_v<T>;

template <class T>
inline T wrapping_add(T a, T b) {
  using U = std::make_unsigned_t<T>;
  return static_cast<T>(static_cast<U>(static_cast<U>(a) + static_cast<U>(b)));
}
template <class T>
inline T wrapping_mul(T a, T b) {
  using U = std::make_unsigned_t<T>;
  return static_cast<T>(static_cast<U>(static_cast<U>(a) * static_cast<U>(b)));
}

struct SumOp {
  template <class T>
  T operator()(T a, T b) const {
    if constexpr (is_float_v<T>)
      return propagate_nan(a, b, a + b);
    else
      return wrapping_add(a, b);
  }
};

struct ProdOp {
  template <class T>
  T operator()(T a, T b) const {
    if constexpr (is_float_v<T>)
      return propagate_nan(a, b, a * b);
    else
      return wrapping_mul(a, b);
  }
};

struct MinOp {
  template <class T>
  T operator()(T a, T b) const {
    if constexpr (is_float_v<T>) {
      T low = a < b ? a : b;  // ties and NaN give b, as x86 minps(a, b) does
      low = select(mask_of<T>(a == b), float_of<T>(bits_of(a) | bits_of(b)), low);  // -0 beats +0
      return propagate_nan(a, b, low);
    } else {
      return a < b ? a : b;
    }
  }
};

struct MaxOp {
  template <class T>
  T operator()(T a, T b) const {
    if constexpr (is_float_v<T>) {
      T high = a > b ? a : b;  // ties and NaN give b, as x86 maxps(a, b) does
      high = select(mask_of<T>(a == b), float_of<T>(bits_of(a) & bits_of(b)), high);  // +0 beats -0
      return propagate_nan(a, b, high);
    } else {
      return a > b ? a : b;
    }
  }
};

// x / divisor (divisor >= 1). 8- and 32-bit integers divide in double, which vectorizes where
// integer division does not, and is exact: |x| < 2^32, so a quotient that is not an integer lies
// at least 1/|x| >= 2^-32 (relative) from the next integer, far more than double's 2^-53 rounding,
// and truncation gives x / divisor exactly. 64-bit integers use the integer division.
template <class T>
struct DivideBy {
  static constexpr bool in_double = !is_float_v<T> && sizeof(T) < 8;
  // Wide enough for any int divisor, and for the truncated quotient of a u32.
  using Divisor = std::conditional_t<in_double, double, T>;
  using Quotient = std::conditional_t<std::is_same_v<T, std::uint32_t>, std::int64_t, std::int32_t>;
  Divisor divisor;
  T operator()(T x) const {
    if constexpr (in_double)
      return static_cast<T>(static_cast<Quotient>(static_cast<double>(x) / divisor));
    else
      return x / divisor;
  }
};

// bfloat16 <-> f32, bit for bit as tutti::detail::bf16_bits_to_float / float_to_bf16_bits, but
// branch-free so that the loops around it vectorize.
struct Bf16Codec {
  static float decode(std::uint16_t h) { return __builtin_bit_cast(float, static_cast<std::uint32_t>(h) << 16); }
  static std::uint16_t encode(float f) {
    const std::uint32_t x = __builtin_bit_cast(std::uint32_t, f);
    const std::uint32_t rounded = (x + 0x7fffu + ((x >> 16) & 1u)) >> 16;
    const std::uint32_t nan = (x >> 16) | 0x40u;
    const std::uint32_t is_nan = nan_mask(f);
    return static_cast<std::uint16_t>((nan & is_nan) | (rounded & ~is_nan));
  }
};

// IEEE half <-> f32, bit for bit as tutti::detail::f16_bits_to_float / float_to_f16_bits
// (checked over all 2^16 and 2^32 inputs), but branch-free so that the loops around it vectorize.
// Like every f32 op here, it assumes the default rounding mode.
struct F16Codec {
  static std::uint32_t mask(bool condition) { return mask_of<float>(condition); }
  static float decode(std::uint16_t h) {
    const std::uint32_t magnitude = h & 0x7fffu, sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
    const std::uint32_t normal = (magnitude << 13) + 0x38000000u;   // exponent rebiased from 15 to 127
    const std::uint32_t special = (magnitude << 13) | 0x7f800000u;  // inf and NaN keep their payload
    // subnormal: magnitude x 2^-24, exact in f32
    const std::uint32_t subnormal = bits_of(static_cast<float>(static_cast<std::int32_t>(magnitude)) * 0x1p-24f);
    const std::uint32_t is_special = mask(magnitude >= 0x7c00u), is_subnormal = mask(magnitude < 0x400u);
    return float_of<float>(sign | (special & is_special) | (subnormal & is_subnormal) |
                           (normal & ~is_special & ~is_subnormal));
  }
  static std::uint16_t encode(float f) {
    const std::uint32_t x = bits_of(f), sign = (x >> 16) & 0x8000u, abs = x & 0x7fffffffu;
    const std::uint32_t special = 0x7c00u | (mask(abs > 0x7f800000u) & 0x200u);            // inf, or NaN quieted
    const std::uint32_t normal = (abs - 0x38000000u + 0xfffu + ((abs >> 13) & 1u)) >> 13;  // nearest even
    // Below 2^-14, adding 0.5 rounds abs to a multiple of 2^-24, to nearest even, into the low bits.
    const std::uint32_t subnormal = bits_of(float_of<float>(abs) + 0.5f) - 0x3f000000u;
    const std::uint32_t is_special = mask(abs >= 0x7f800000u), is_overflow = mask(abs >= 0x477ff000u);
    const std::uint32_t is_subnormal = mask(abs < 0x38800000u);
    std::uint32_t half = (normal & ~is_subnormal) | (subnormal & is_subnormal);
    half = (half & ~is_overflow) | (0x7c00u & is_overflow);
    half = (half & ~is_special) | (special & is_special);
    return static_cast<std::uint16_t>(sign | half);
  }
};

// A float op applied to 16-bit storage through `Codec`.
template <class Codec, class Op>
struct OnHalves {
  std::uint16_t operator()(std::uint16_t a, std::uint16_t b) const {
    return Codec::encode(Op{}(Codec::decode(a), Codec::decode(b)));
  }
};

template <class Codec>
struct DivideHalves {
  float divisor;
  std::uint16_t operator()(std::uint16_t x) const { return Codec::encode(Codec::decode(x) / divisor); }
};

}  // namespace
}  // namespace tutti::reduce
