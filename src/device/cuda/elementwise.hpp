// What the CUDA reduction kernels compute, one element at a time: the rules of the host kernels
// (src/reduce/element_ops.hpp), restated so that nvcc can compile them for the device, bit for bit
// the same. This header is plain C++ outside nvcc, so that device_kernels_test checks these very
// functions against reduce::apply on the host, NaNs, infinities, -0 and subnormals included.
//
// - Integers: sum and prod wrap (computed in the unsigned type), min and max.
// - f32/f64: a NaN operand gives that NaN quieted (`a`'s first); an invalid operation on numbers
//   (inf - inf, 0 * inf) gives the host CPU's default NaN, which the caller passes in (a GPU's own
//   default NaN has other bits). min/max are IEEE 754-2019 minimum/maximum (-0 < +0).
// - f16/bf16: decoded to f32, combined as f32, encoded rounding to nearest even (NaN: f16
//   sign | 0x7e00, bf16 the top half | 0x40).
// - divide: floats x / divisor (a NaN stays itself, quieted), integers truncate toward zero.
#pragma once

#include <cstdint>
#include <cstring>
#include <type_traits>

#if defined(__CUDACC__)
#define TUTTI_HD __host__ __device__ __forceinline__
#else
#define TUTTI_HD inline
#endif

namespace tutti::device::kernels {

/// The host's default NaN (what an invalid operation on two numbers gives on the host).
struct DefaultNan {
  std::uint32_t f32;
  std::uint64_t f64;
};

/// Storage of the 16-bit float types (one struct each, so that the combine overloads differ).
struct F16 {
  std::uint16_t bits;
};
struct Bf16 {
  std::uint16_t bits;
};

enum class Op { sum, prod, min, max };

template <class To, class From>
TUTTI_HD To bits_as(From x) {
  static_assert(sizeof(To) == sizeof(From));
  To y;
  memcpy(&y, &x, sizeof y);
  return y;
}

template <class F>
using BitsOf = std::conditional_t<sizeof(F) == 4, std::uint32_t, std::uint64_t>;

template <class F>
TUTTI_HD bool is_nan(F x) {
  using B = BitsOf<F>;
  constexpr B sign = B(1) << (sizeof(F) * 8 - 1);
  constexpr B exponent = sizeof(F) == 4 ? B(0x7f800000u) : B(0x7ff0000000000000u);
  return (bits_as<B>(x) & ~sign) > exponent;
}

template <class F>
TUTTI_HD F quiet(F x) {
  using B = BitsOf<F>;
  constexpr B quiet_bit = sizeof(F) == 4 ? B(0x00400000u) : B(0x0008000000000000u);
  return bits_as<F>(static_cast<B>(bits_as<B>(x) | quiet_bit));
}

template <class F>
TUTTI_HD F default_nan(const DefaultNan& nan) {
  if constexpr (sizeof(F) == 4)
    return bits_as<F>(nan.f32);
  else
    return bits_as<F>(nan.f64);
}

// `result` of a op b with the NaN rules applied.
template <class F>
TUTTI_HD F finish(F a, F b, F result, const DefaultNan& nan) {
  if (is_nan(a)) return quiet(a);
  if (is_nan(b)) return quiet(b);
  if (is_nan(result)) return default_nan<F>(nan);
  return result;
}

template <Op op, class F>
TUTTI_HD F combine_float(F a, F b, const DefaultNan& nan) {
  using B = BitsOf<F>;
  F r;
  if constexpr (op == Op::sum) {
    r = a + b;
  } else if constexpr (op == Op::prod) {
    r = a * b;
  } else if constexpr (op == Op::min) {
    r = a < b ? a : b;
    if (a == b) r = bits_as<F>(static_cast<B>(bits_as<B>(a) | bits_as<B>(b)));  // -0 beats +0
  } else {
    r = a > b ? a : b;
    if (a == b) r = bits_as<F>(static_cast<B>(bits_as<B>(a) & bits_as<B>(b)));  // +0 beats -0
  }
  return finish(a, b, r, nan);
}

// bfloat16 <-> f32 (as element_ops.hpp's Bf16Codec).
TUTTI_HD float decode(Bf16 h) { return bits_as<float>(static_cast<std::uint32_t>(h.bits) << 16); }
TUTTI_HD Bf16 encode_bf16(float f) {
  const std::uint32_t x = bits_as<std::uint32_t>(f);
  if (is_nan(f)) return Bf16{static_cast<std::uint16_t>((x >> 16) | 0x40u)};
  return Bf16{static_cast<std::uint16_t>((x + 0x7fffu + ((x >> 16) & 1u)) >> 16)};
}

// IEEE half <-> f32 (as element_ops.hpp's F16Codec).
TUTTI_HD float decode(F16 h) {
  const std::uint32_t magnitude = h.bits & 0x7fffu, sign = static_cast<std::uint32_t>(h.bits & 0x8000u) << 16;
  if (magnitude >= 0x7c00u) return bits_as<float>(sign | (magnitude << 13) | 0x7f800000u);  // inf, NaN
  if (magnitude < 0x400u)  // subnormal: magnitude x 2^-24, exact in f32
    return bits_as<float>(sign |
                          bits_as<std::uint32_t>(static_cast<float>(static_cast<std::int32_t>(magnitude)) * 0x1p-24f));
  return bits_as<float>(sign | ((magnitude << 13) + 0x38000000u));
}
TUTTI_HD F16 encode_f16(float f) {
  const std::uint32_t x = bits_as<std::uint32_t>(f), sign = (x >> 16) & 0x8000u, abs = x & 0x7fffffffu;
  std::uint32_t half;
  if (abs >= 0x7f800000u)
    half = 0x7c00u | (abs > 0x7f800000u ? 0x200u : 0u);  // inf, or NaN quieted
  else if (abs >= 0x477ff000u)
    half = 0x7c00u;            // rounds to infinity
  else if (abs < 0x38800000u)  // adding 0.5 rounds to a multiple of 2^-24, to nearest even
    half = bits_as<std::uint32_t>(bits_as<float>(abs) + 0.5f) - 0x3f000000u;
  else
    half = (abs - 0x38000000u + 0xfffu + ((abs >> 13) & 1u)) >> 13;
  return F16{static_cast<std::uint16_t>(sign | half)};
}
TUTTI_HD F16 encode(float f, F16) { return encode_f16(f); }
TUTTI_HD Bf16 encode(float f, Bf16) { return encode_bf16(f); }

/// a op b for one element of any type.
template <Op op, class T>
TUTTI_HD T combine(T a, T b, const DefaultNan& nan) {
  if constexpr (std::is_same_v<T, F16> || std::is_same_v<T, Bf16>) {
    return encode(combine_float<op>(decode(a), decode(b), nan), T{});
  } else if constexpr (std::is_floating_point_v<T>) {
    return combine_float<op>(a, b, nan);
  } else {
    using U = std::make_unsigned_t<T>;
    if constexpr (op == Op::sum)
      return static_cast<T>(static_cast<U>(static_cast<U>(a) + static_cast<U>(b)));
    else if constexpr (op == Op::prod)
      return static_cast<T>(static_cast<U>(static_cast<U>(a) * static_cast<U>(b)));
    else if constexpr (op == Op::min)
      return a < b ? a : b;
    else
      return a > b ? a : b;
  }
}

/// x / divisor (divisor >= 1) for one element of any type.
template <class T>
TUTTI_HD T divide(T x, int divisor) {
  if constexpr (std::is_same_v<T, F16> || std::is_same_v<T, Bf16>) {
    const float f = decode(x);
    return encode(is_nan(f) ? quiet(f) : f / static_cast<float>(divisor), T{});
  } else if constexpr (std::is_floating_point_v<T>) {
    return is_nan(x) ? quiet(x) : x / static_cast<T>(divisor);
  } else if constexpr (sizeof(T) < 8) {
    return static_cast<T>(static_cast<std::int64_t>(x) / divisor);
  } else {
    return x / static_cast<T>(divisor);
  }
}

}  // namespace tutti::device::kernels
