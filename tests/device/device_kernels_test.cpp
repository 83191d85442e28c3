// The CUDA kernels' element rules (src/device/cuda/elementwise.hpp) compiled for the host and
// compared bit for bit with the host kernels (reduce::apply, reduce::divide): every type x op,
// random bit patterns with NaNs (payloads, signaling, negative), infinities, -0 and subnormals.
// This checks what the GPU computes per element on a machine without a GPU; device_gpu_test checks
// the kernels themselves on one.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "device/cuda/elementwise.hpp"
#include "reduce/reduce.hpp"

namespace {

using tutti::DataType;
using tutti::ReduceOp;
namespace kernels = tutti::device::kernels;

kernels::DefaultNan host_default_nan() {
  const float f[2] = {std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity()};
  const double d[2] = {std::numeric_limits<double>::infinity(), -std::numeric_limits<double>::infinity()};
  float fr = 0;
  double dr = 0;
  tutti::reduce::apply(ReduceOp::sum, DataType::f32, &fr, &f[0], &f[1], 1);
  tutti::reduce::apply(ReduceOp::sum, DataType::f64, &dr, &d[0], &d[1], 1);
  return {kernels::bits_as<std::uint32_t>(fr), kernels::bits_as<std::uint64_t>(dr)};
}

// Random bits, one element in four a special value of its kind.
template <class T>
std::vector<T> values(std::size_t n, std::mt19937_64& rng) {
  static constexpr std::uint16_t f16_specials[] = {0x0000, 0x8000, 0x7c00, 0xfc00, 0x7e00, 0xfe00, 0x7c01, 0x7d23,
                                                   0x0001, 0x8001, 0x03ff, 0x0400, 0x7bff, 0x3c00, 0x3c01, 0x0200};
  static constexpr std::uint16_t bf16_specials[] = {0x0000, 0x8000, 0x7f80, 0xff80, 0x7fc0, 0xffc0, 0x7f81, 0x7fa3,
                                                    0x0001, 0x8001, 0x007f, 0x0080, 0x7f7f, 0x3f80, 0x3f81, 0x0040};
  static constexpr std::uint32_t f32_specials[] = {0x00000000, 0x80000000, 0x7f800000, 0xff800000, 0x7fc00000,
                                                   0x7f8002a5, 0xffc002a5, 0x7f800015, 0x00000001, 0x007fffff,
                                                   0x00800000, 0x7f7fffff, 0x3f800000, 0x477ff000, 0x33000000};
  static constexpr std::uint64_t f64_specials[] = {0,
                                                   0x8000000000000000,
                                                   0x7ff0000000000000,
                                                   0xfff0000000000000,
                                                   0x7ff8000000000000,
                                                   0x7ff00000000002a5,
                                                   0xfff80000000002a5,
                                                   1,
                                                   0x000fffffffffffff,
                                                   0x7fefffffffffffff,
                                                   0x3ff0000000000000};
  std::vector<T> v(n);
  for (auto& x : v) {
    std::uint64_t bits = rng();
    if (rng() % 4 == 0) {
      if constexpr (std::is_same_v<T, kernels::F16>) bits = f16_specials[rng() % std::size(f16_specials)];
      if constexpr (std::is_same_v<T, kernels::Bf16>) bits = bf16_specials[rng() % std::size(bf16_specials)];
      if constexpr (std::is_same_v<T, float>) bits = f32_specials[rng() % std::size(f32_specials)];
      if constexpr (std::is_same_v<T, double>) bits = f64_specials[rng() % std::size(f64_specials)];
    }
    std::memcpy(&x, &bits, sizeof(T));
  }
  return v;
}

template <class T>
void check_type(DataType type) {
  std::mt19937_64 rng(static_cast<unsigned>(type) + 1);
  const kernels::DefaultNan nan = host_default_nan();
  const std::size_t n = 20000;
  const auto a = values<T>(n, rng), b = values<T>(n, rng);
  std::vector<T> host(n), device(n);
  const auto compare = [&](const std::string& what) {
    for (std::size_t i = 0; i < n; ++i)
      ASSERT_EQ(std::memcmp(&host[i], &device[i], sizeof(T)), 0)
          << tutti::to_string(type) << " " << what << ", element " << i;
  };
  const auto run = [&]<kernels::Op op>(ReduceOp reduce_op) {
    tutti::reduce::apply(reduce_op, type, host.data(), a.data(), b.data(), n);
    for (std::size_t i = 0; i < n; ++i) device[i] = kernels::combine<op>(a[i], b[i], nan);
    compare(std::string(tutti::to_string(reduce_op)));
  };
  run.template operator()<kernels::Op::sum>(ReduceOp::sum);
  run.template operator()<kernels::Op::prod>(ReduceOp::prod);
  run.template operator()<kernels::Op::min>(ReduceOp::min);
  run.template operator()<kernels::Op::max>(ReduceOp::max);
  for (const int divisor : {1, 2, 3, 7, 1000}) {
    host = a;
    tutti::reduce::divide(type, host.data(), n, divisor);
    for (std::size_t i = 0; i < n; ++i) device[i] = kernels::divide(a[i], divisor);
    compare("divide by " + std::to_string(divisor));
  }
}

TEST(CudaElementRules, MatchTheHostKernelsBitForBit) {
  check_type<std::int8_t>(DataType::i8);
  check_type<std::uint8_t>(DataType::u8);
  check_type<std::int32_t>(DataType::i32);
  check_type<std::uint32_t>(DataType::u32);
  check_type<std::int64_t>(DataType::i64);
  check_type<std::uint64_t>(DataType::u64);
  check_type<kernels::F16>(DataType::f16);
  check_type<kernels::Bf16>(DataType::bf16);
  check_type<float>(DataType::f32);
  check_type<double>(DataType::f64);
}

TEST(CudaElementRules, F16AndBf16CodecsMatchTheHostOnEveryHalf) {
  for (std::uint32_t bits = 0; bits < 0x10000; ++bits) {
    const kernels::F16 h{static_cast<std::uint16_t>(bits)};
    const kernels::Bf16 g{static_cast<std::uint16_t>(bits)};
    const float fh = kernels::decode(h), fg = kernels::decode(g);
    ASSERT_EQ(kernels::bits_as<std::uint32_t>(fh),
              kernels::bits_as<std::uint32_t>(tutti::detail::f16_bits_to_float(h.bits)))
        << bits;
    ASSERT_EQ(kernels::bits_as<std::uint32_t>(fg),
              kernels::bits_as<std::uint32_t>(tutti::detail::bf16_bits_to_float(g.bits)))
        << bits;
    // Encoding every f32 whose top half is `bits`, with a few low halves (ties, above, below).
    for (const std::uint32_t low : {0x0000u, 0x0001u, 0x0fffu, 0x1000u, 0x1001u, 0x7fffu, 0x8000u, 0x8001u, 0xffffu}) {
      const float f = kernels::bits_as<float>((bits << 16) | low);
      ASSERT_EQ(kernels::encode_f16(f).bits, tutti::detail::float_to_f16_bits(f)) << std::hex << ((bits << 16) | low);
      ASSERT_EQ(kernels::encode_bf16(f).bits, tutti::detail::float_to_bf16_bits(f)) << std::hex << ((bits << 16) | low);
    }
  }
}

}  // namespace
