// The reduction kernels, on every instruction set this CPU runs, against a scalar reference written
// here from the rules in src/reduce/element_ops.hpp, compared bit for bit: every type x op x count
// x aliasing x alignment, random data with negatives and (for floats) ±0, inf, NaNs with
// payloads, subnormals and values that round in f16/bf16.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <climits>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <ostream>
#include <random>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "core/copy.hpp"
#include "reduce/dispatch.hpp"
#include "reduce/reduce.hpp"
#include "tutti/types.hpp"

// Readable test parameters in gtest's messages (found by argument-dependent lookup).
namespace tutti {
inline void PrintTo(DataType type, std::ostream* os) { *os << to_string(type); }
namespace reduce {
inline void PrintTo(Isa isa, std::ostream* os) { *os << name(isa); }
}  // namespace reduce
}  // namespace tutti

namespace {

using tutti::DataType;
using tutti::ReduceOp;
using tutti::reduce::Isa;
namespace reduce = tutti::reduce;

constexpr Isa all_isas[] = {Isa::generic, Isa::avx2, Isa::avx512};
constexpr DataType all_types[] = {DataType::i8,  DataType::u8,  DataType::i32,  DataType::u32, DataType::i64,
                                  DataType::u64, DataType::f16, DataType::bf16, DataType::f32, DataType::f64};
constexpr ReduceOp all_ops[] = {ReduceOp::sum, ReduceOp::prod, ReduceOp::min, ReduceOp::max, ReduceOp::avg};
constexpr std::size_t counts[] = {0, 1, 2, 3, 7, 15, 16, 17, 31, 33, 63, 64, 65, 127, 129, 1000, 4099};

std::string op_name(ReduceOp op) { return std::string(tutti::to_string(op)); }
std::string type_name(DataType type) { return std::string(tutti::to_string(type)); }

// Calls f.template operator()<T>() with the storage type of `type`.
using StorageTypes = std::tuple<std::int8_t, std::uint8_t, std::int32_t, std::uint32_t, std::int64_t, std::uint64_t,
                                tutti::f16, tutti::bf16, float, double>;  // in DataType's order
template <class F>
void visit(DataType type, F&& f) {
  [&]<std::size_t... I>(std::index_sequence<I...>) {
    ((static_cast<std::size_t>(type) == I ? f.template operator()<std::tuple_element_t<I, StorageTypes>>() : void()),
     ...);
  }
  (std::make_index_sequence<std::tuple_size_v<StorageTypes>>{});
}

template <class T>
constexpr bool is_half = std::is_same_v<T, tutti::f16> || std::is_same_v<T, tutti::bf16>;

template <class T>
std::string hex(T value) {
  unsigned long long bits = 0;
  std::memcpy(&bits, &value, sizeof(T));
  char text[24];
  std::snprintf(text, sizeof text, "0x%0*llx", static_cast<int>(2 * sizeof(T)), bits);
  return text;
}

template <class T>
bool same_bits(T x, T y) {
  return std::memcmp(&x, &y, sizeof(T)) == 0;
}

// ---- the reference: the documented rules, written plainly ----

template <class F>
F quieted(F x) {
  using B = std::conditional_t<sizeof(F) == 4, std::uint32_t, std::uint64_t>;
  const B quiet = B(1) << (std::numeric_limits<F>::digits - 2);
  return std::bit_cast<F>(static_cast<B>(std::bit_cast<B>(x) | quiet));
}

template <class F>
F reference_float(ReduceOp op, F a, F b) {
  if (std::isnan(a)) return quieted(a);
  if (std::isnan(b)) return quieted(b);
  switch (op) {
    case ReduceOp::sum:
    case ReduceOp::avg:
      return a + b;
    case ReduceOp::prod:
      return a * b;
    case ReduceOp::min:
      if (a == b) return std::signbit(a) ? a : b;  // -0 < +0
      return a < b ? a : b;
    case ReduceOp::max:
      if (a == b) return std::signbit(a) ? b : a;
      return a > b ? a : b;
  }
  return a;
}

template <class T>
float to_float(T h) {
  if constexpr (std::is_same_v<T, tutti::f16>)
    return tutti::detail::f16_bits_to_float(h.bits);
  else
    return tutti::detail::bf16_bits_to_float(h.bits);
}
template <class T>
T from_float(float f) {
  T h;
  if constexpr (std::is_same_v<T, tutti::f16>)
    h.bits = tutti::detail::float_to_f16_bits(f);
  else
    h.bits = tutti::detail::float_to_bf16_bits(f);
  return h;
}

template <class T>
T reference(ReduceOp op, T a, T b) {
  if constexpr (is_half<T>) {
    return from_float<T>(reference_float(op, to_float(a), to_float(b)));
  } else if constexpr (std::is_floating_point_v<T>) {
    return reference_float(op, a, b);
  } else {
    using U = std::make_unsigned_t<T>;  // wrap, without signed overflow
    switch (op) {
      case ReduceOp::sum:
      case ReduceOp::avg:
        return static_cast<T>(static_cast<U>(static_cast<U>(a) + static_cast<U>(b)));
      case ReduceOp::prod:
        return static_cast<T>(static_cast<U>(static_cast<U>(a) * static_cast<U>(b)));
      case ReduceOp::min:
        return std::min(a, b);
      case ReduceOp::max:
        return std::max(a, b);
    }
    return a;
  }
}

template <class T>
T reference_divide(T x, int divisor) {
  if constexpr (is_half<T>)
    return from_float<T>(to_float(x) / static_cast<float>(divisor));
  else if constexpr (std::is_floating_point_v<T>)
    return x / static_cast<T>(divisor);
  else if constexpr (std::is_signed_v<T>)
    return static_cast<T>(static_cast<long long>(x) / divisor);
  else
    return static_cast<T>(static_cast<unsigned long long>(x) / static_cast<unsigned long long>(divisor));
}

// ---- data ----

template <class F>
std::vector<F> special_floats() {
  using L = std::numeric_limits<F>;
  using B = std::conditional_t<sizeof(F) == 4, std::uint32_t, std::uint64_t>;
  const B sign = B(1) << (sizeof(F) * 8 - 1);
  const F payload_nan = std::bit_cast<F>(static_cast<B>(std::bit_cast<B>(L::quiet_NaN()) | 0x2a5));
  const F signaling = std::bit_cast<F>(static_cast<B>(std::bit_cast<B>(L::infinity()) | 0x15));
  const F negative_payload_nan = std::bit_cast<F>(static_cast<B>(std::bit_cast<B>(payload_nan) | sign));
  std::vector<F> values = {
      L::infinity(),   -L::infinity(),   L::quiet_NaN(), payload_nan, signaling, negative_payload_nan,
      L::denorm_min(), -L::denorm_min(), L::min(),       -L::min(),   L::max(),  -L::max()};
  values.push_back(L::min() / F(3));  // subnormal
  // 65504 is f16's largest; 65520 rounds to f16 infinity; 3e38 overflows when doubled
  for (const double v : {0.0, -0.0, 1.0, -1.0, 65504.0, 65520.0, -65520.0, 1.0009765625, 3.0e38})
    values.push_back(static_cast<F>(v));
  return values;
}

// Bit patterns of f16 / bf16 worth having: zeros, infinities, NaNs (quiet, signaling, with
// payload, negative), subnormals, the largest finite, and around 1.
template <class T>
std::vector<std::uint16_t> special_halves() {
  if constexpr (std::is_same_v<T, tutti::f16>)
    return {0x0000, 0x8000, 0x7c00, 0xfc00, 0x7e00, 0xfe00, 0x7c01, 0x7d23, 0xfd23, 0x0001,
            0x8001, 0x03ff, 0x0400, 0x7bff, 0xfbff, 0x3c00, 0x3c01, 0xbc00, 0x1400, 0x0200};
  else
    return {0x0000, 0x8000, 0x7f80, 0xff80, 0x7fc0, 0xffc0, 0x7f81, 0x7fa3, 0xffa3, 0x0001,
            0x8001, 0x007f, 0x0080, 0x7f7f, 0xff7f, 0x3f80, 0x3f81, 0xbf80, 0x3400, 0x0040};
}

template <class T>
T random_value(std::mt19937_64& rng) {
  const unsigned kind = static_cast<unsigned>(rng() % 4);
  if constexpr (is_half<T>) {
    T h;
    const auto specials = special_halves<T>();
    if (kind == 0)
      h.bits = specials[rng() % specials.size()];
    else if (kind == 1)
      h.bits = static_cast<std::uint16_t>(rng());  // anything at all
    else                                           // near 1 in magnitude, so that sums carry, cancel and round
      h.bits = static_cast<std::uint16_t>((rng() & 0x80ff) | (std::is_same_v<T, tutti::f16> ? 0x3c00 : 0x3f00));
    return h;
  } else if constexpr (std::is_floating_point_v<T>) {
    using B = std::conditional_t<sizeof(T) == 4, std::uint32_t, std::uint64_t>;
    const auto specials = special_floats<T>();
    if (kind == 0) return specials[rng() % specials.size()];
    if (kind == 1) return std::bit_cast<T>(static_cast<B>(rng()));
    return std::uniform_real_distribution<T>(T(-8), T(8))(rng);
  } else {
    if (kind == 0) {
      const T specials[] = {T(0), T(1), T(-1), std::numeric_limits<T>::min(), std::numeric_limits<T>::max()};
      return specials[rng() % 5];
    }
    return static_cast<T>(rng());
  }
}

template <class T>
std::vector<T> random_values(std::mt19937_64& rng, std::size_t count) {
  std::vector<T> values(count);
  for (auto& v : values) v = random_value<T>(rng);
  return values;
}

// `count` elements starting `offset` elements past a 64-byte boundary, between guard elements
// that must come back untouched.
template <class T>
class Buffer {
 public:
  static constexpr std::size_t guard = 16;
  static constexpr unsigned char poison = 0xa5;

  Buffer(const std::vector<T>& values, std::size_t offset) : count_(values.size()) {
    bytes_.assign((values.size() + 2 * guard + offset) * sizeof(T) + 64, poison);
    const auto base = reinterpret_cast<std::uintptr_t>(bytes_.data());
    first_ = reinterpret_cast<T*>(((base + 63) & ~std::uintptr_t(63)) + (guard + offset) * sizeof(T));
    if (!values.empty()) std::memcpy(first_, values.data(), values.size() * sizeof(T));
  }
  T* data() { return first_; }
  T at(std::size_t i) const { return first_[i]; }
  bool guards_intact() const {
    const auto* low = reinterpret_cast<const unsigned char*>(first_) - guard * sizeof(T);
    const auto* high = reinterpret_cast<const unsigned char*>(first_ + count_);
    return std::all_of(low, low + guard * sizeof(T), [](unsigned char c) { return c == poison; }) &&
           std::all_of(high, high + guard * sizeof(T), [](unsigned char c) { return c == poison; });
  }

 private:
  std::size_t count_;
  std::vector<unsigned char> bytes_;
  T* first_;
};

// ---- the sweep ----

enum class Alias { distinct, dst_is_a, dst_is_b, all_same, a_is_b };
constexpr Alias all_aliases[] = {Alias::distinct, Alias::dst_is_a, Alias::dst_is_b, Alias::all_same, Alias::a_is_b};
const char* alias_name(Alias alias) {
  constexpr const char* names[] = {"distinct", "dst==a", "dst==b", "dst==a==b", "a==b"};
  return names[static_cast<int>(alias)];
}

// One apply on `isa`; an ADD_FAILURE (and false) naming the case and the first wrong elements.
template <class T>
bool check_case(Isa isa, ReduceOp op, std::vector<T> a, std::vector<T> b, Alias alias, std::size_t offset) {
  if (alias == Alias::all_same || alias == Alias::a_is_b) b = a;
  Buffer<T> a_buf(a, offset), b_buf(b, offset), d_buf(std::vector<T>(a.size()), offset);
  std::memset(static_cast<void*>(d_buf.data()), Buffer<T>::poison, a.size() * sizeof(T));
  T* x = a_buf.data();
  T* y = alias == Alias::all_same || alias == Alias::a_is_b ? x : b_buf.data();
  T* dst = alias == Alias::dst_is_a || alias == Alias::all_same ? x : alias == Alias::dst_is_b ? y : d_buf.data();
  reduce::apply_with(isa, op, tutti::data_type_of<T>(), dst, x, y, a.size());
  // Inputs that are not the destination must come back unchanged.
  const auto kept = [&](Buffer<T>& buf, const std::vector<T>& values) {
    return dst == buf.data() || values.empty() ||
           std::memcmp(buf.data(), values.data(), values.size() * sizeof(T)) == 0;
  };
  const bool inputs_kept = kept(a_buf, a) && kept(b_buf, b);

  std::string wrong;
  int shown = 0;
  for (std::size_t i = 0; i < a.size() && shown < 4; ++i) {
    const T expected = reference(op, a[i], b[i]);
    if (same_bits(dst[i], expected)) continue;
    wrong += "\n  [" + std::to_string(i) + "] " + hex(a[i]) + " op " + hex(b[i]) + ": expected " + hex(expected) +
             ", got " + hex(dst[i]);
    ++shown;
  }
  const bool guards = a_buf.guards_intact() && b_buf.guards_intact() && d_buf.guards_intact();
  if (wrong.empty() && guards && inputs_kept) return true;
  ADD_FAILURE() << reduce::name(isa) << " " << op_name(op) << " " << type_name(tutti::data_type_of<T>()) << " count "
                << a.size() << " " << alias_name(alias) << " offset " << offset
                << (guards ? "" : ": wrote outside the buffer") << (inputs_kept ? "" : ": changed an input") << wrong;
  return false;
}

std::string case_name(const ::testing::TestParamInfo<std::tuple<Isa, DataType>>& info) {
  return std::string(reduce::name(std::get<0>(info.param))) + "_" + type_name(std::get<1>(info.param));
}

class ReduceKernels : public ::testing::TestWithParam<std::tuple<Isa, DataType>> {
 protected:
  void SetUp() override {
    if (!reduce::supported(std::get<0>(GetParam())))
      GTEST_SKIP() << reduce::name(std::get<0>(GetParam())) << " kernels cannot run on this CPU or build";
  }
  Isa isa() const { return std::get<0>(GetParam()); }
  DataType type() const { return std::get<1>(GetParam()); }
  std::mt19937_64 rng_{0x7077u + 131u * static_cast<unsigned>(std::get<1>(GetParam()))};
};

TEST_P(ReduceKernels, ApplyMatchesReference) {
  visit(type(), [&]<class T>() {
    int failures = 0;
    for (const ReduceOp op : all_ops) {
      for (const std::size_t count : counts) {
        const auto a = random_values<T>(rng_, count), b = random_values<T>(rng_, count);
        for (const Alias alias : all_aliases)
          for (const std::size_t offset : {0, 1})
            if (!check_case(isa(), op, a, b, alias, offset) && ++failures == 10) return;
      }
    }
  });
}

template <class T>
std::vector<T> specials() {
  if constexpr (is_half<T>) {
    std::vector<T> values;
    for (const std::uint16_t bits : special_halves<T>()) values.emplace_back().bits = bits;
    return values;
  } else if constexpr (std::is_floating_point_v<T>) {
    return special_floats<T>();
  } else {
    return {T(0), T(1), T(-1), T(2), T(-2), std::numeric_limits<T>::min(), std::numeric_limits<T>::max()};
  }
}

// Every special value against every special value, so that no pair is left to chance.
TEST_P(ReduceKernels, SpecialPairs) {
  visit(type(), [&]<class T>() {
    const auto values = specials<T>();
    std::vector<T> a, b;
    for (const T x : values)
      for (const T y : values) a.push_back(x), b.push_back(y);
    for (const ReduceOp op : all_ops) check_case(isa(), op, a, b, Alias::distinct, 0);
  });
}

TEST_P(ReduceKernels, DivideMatchesReference) {
  visit(type(), [&]<class T>() {
    for (const int divisor : {1, 2, 3, 7, 8, 255, 1000, INT_MAX}) {
      for (const std::size_t count : counts) {
        const auto values = random_values<T>(rng_, count);
        Buffer<T> buf(values, count % 2);
        reduce::divide_with(isa(), tutti::data_type_of<T>(), buf.data(), count, divisor);
        for (std::size_t i = 0; i < count; ++i) {
          const T expected = reference_divide(values[i], divisor);
          ASSERT_TRUE(same_bits(buf.at(i), expected))
              << reduce::name(isa()) << " " << type_name(type()) << " count " << count << " [" << i << "] "
              << hex(values[i]) << " / " << divisor << ": expected " << hex(expected) << ", got " << hex(buf.at(i));
        }
        ASSERT_TRUE(buf.guards_intact()) << "divide wrote outside the buffer, count " << count;
      }
    }
  });
}

// A TCP payload lies at any offset of the receive buffer, and a caller's array may sit at an odd
// address: the kernels must give the same bits there (UBSan reports a misaligned typed access).
// 4099 elements cross the 4096-byte blocks misaligned buffers are copied through.
TEST_P(ReduceKernels, MisalignedBuffersGiveTheSameBits) {
  visit(type(), [&]<class T>() {
    const DataType dt = tutti::data_type_of<T>();
    for (const std::size_t count : {std::size_t{1}, std::size_t{17}, std::size_t{1000}, std::size_t{4099}}) {
      const auto a = random_values<T>(rng_, count), b = random_values<T>(rng_, count);
      const std::size_t bytes = count * sizeof(T);
      // Odd addresses: one byte past 64-byte-aligned storage.
      std::vector<unsigned char> storage(3 * bytes + 3 * 64 + 1);
      const auto base = (reinterpret_cast<std::uintptr_t>(storage.data()) + 63) & ~std::uintptr_t(63);
      auto* x = reinterpret_cast<unsigned char*>(base + 1);
      auto* y = x + bytes + 64;
      auto* d = y + bytes + 64;
      for (const ReduceOp op : all_ops) {
        std::vector<T> expected(count);
        reduce::apply_with(isa(), op, dt, expected.data(), a.data(), b.data(), count);
        std::memcpy(x, a.data(), bytes);
        std::memcpy(y, b.data(), bytes);
        reduce::apply_with(isa(), op, dt, d, x, y, count);  // distinct
        reduce::apply_with(isa(), op, dt, x, x, y, count);  // in place
        ASSERT_EQ(std::memcmp(d, expected.data(), bytes), 0) << op_name(op) << " count " << count;
        ASSERT_EQ(std::memcmp(x, expected.data(), bytes), 0) << op_name(op) << " in place, count " << count;
      }
      std::vector<T> expected = a;
      reduce::divide_with(isa(), dt, expected.data(), count, 3);
      std::memcpy(x, a.data(), bytes);
      reduce::divide_with(isa(), dt, x, count, 3);
      ASSERT_EQ(std::memcmp(x, expected.data(), bytes), 0) << "divide, count " << count;
    }
  });
}

INSTANTIATE_TEST_SUITE_P(AllIsasAndTypes, ReduceKernels,
                         ::testing::Combine(::testing::ValuesIn(all_isas), ::testing::ValuesIn(all_types)), case_name);

class HalfKernels : public ReduceKernels {};

// Every 16-bit pattern as `a`, against every pattern (shuffled) and against each special value.
TEST_P(HalfKernels, Exhaustive) {
  visit(type(), [&]<class T>() {
    if constexpr (is_half<T>) {
      std::vector<T> a(65536);
      for (std::size_t i = 0; i < a.size(); ++i) a[i].bits = static_cast<std::uint16_t>(i);
      std::vector<T> shuffled = a;
      std::shuffle(shuffled.begin(), shuffled.end(), rng_);
      for (const ReduceOp op : all_ops) {
        check_case(isa(), op, a, shuffled, Alias::distinct, 0);
        for (const T special : specials<T>()) {
          const std::vector<T> b(a.size(), special);
          check_case(isa(), op, a, b, Alias::distinct, 0);
          check_case(isa(), op, b, a, Alias::distinct, 0);
        }
      }
    }
  });
}

INSTANTIATE_TEST_SUITE_P(AllIsas, HalfKernels,
                         ::testing::Combine(::testing::ValuesIn(all_isas),
                                            ::testing::Values(DataType::f16, DataType::bf16)),
                         case_name);

// ---- the rules, spelled out on named values ----

// Runs `op` on one element pair on every supported ISA and returns the results' bits.
template <class T>
std::vector<T> on_every_isa(ReduceOp op, T a, T b) {
  std::vector<T> results;
  for (const Isa isa : all_isas) {
    if (!reduce::supported(isa)) continue;
    T r{};
    reduce::apply_with(isa, op, tutti::data_type_of<T>(), &r, &a, &b, 1);
    results.push_back(r);
  }
  return results;
}

TEST(ReduceRules, IntegersWrapAndDivideTowardZero) {
  for (const auto r : on_every_isa<std::int8_t>(ReduceOp::sum, 127, 1)) EXPECT_EQ(r, -128);
  for (const auto r : on_every_isa<std::int32_t>(ReduceOp::prod, INT32_MAX, 2)) EXPECT_EQ(r, -2);
  for (const auto r : on_every_isa<std::uint8_t>(ReduceOp::sum, 200, 100)) EXPECT_EQ(r, 44);
  for (const Isa isa : all_isas) {
    if (!reduce::supported(isa)) continue;
    std::vector<std::int8_t> i8 = {-7, 7, -128};
    std::vector<std::int32_t> i32 = {-7, 7, INT32_MIN};
    std::vector<std::int64_t> i64 = {-7, 7, INT64_MIN};
    reduce::divide_with(isa, DataType::i8, i8.data(), 3, 2);
    reduce::divide_with(isa, DataType::i32, i32.data(), 3, 2);
    reduce::divide_with(isa, DataType::i64, i64.data(), 3, 2);
    EXPECT_EQ(i8, (std::vector<std::int8_t>{-3, 3, -64}));
    EXPECT_EQ(i32, (std::vector<std::int32_t>{-3, 3, INT32_MIN / 2}));
    EXPECT_EQ(i64, (std::vector<std::int64_t>{-3, 3, INT64_MIN / 2}));
  }
}

TEST(ReduceRules, MinMaxOrderZerosAndPropagateNaN) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (const auto r : on_every_isa(ReduceOp::min, 0.0f, -0.0f)) EXPECT_TRUE(std::signbit(r));
  for (const auto r : on_every_isa(ReduceOp::min, -0.0f, 0.0f)) EXPECT_TRUE(std::signbit(r));
  for (const auto r : on_every_isa(ReduceOp::max, -0.0f, 0.0f)) EXPECT_FALSE(std::signbit(r));
  for (const auto r : on_every_isa(ReduceOp::max, 0.0f, -0.0f)) EXPECT_FALSE(std::signbit(r));
  for (const auto r : on_every_isa(ReduceOp::min, nan, 1.0f)) EXPECT_TRUE(std::isnan(r));
  for (const auto r : on_every_isa(ReduceOp::min, 1.0f, nan)) EXPECT_TRUE(std::isnan(r));
  for (const auto r : on_every_isa(ReduceOp::max, 1.0, -std::numeric_limits<double>::quiet_NaN()))
    EXPECT_TRUE(std::isnan(r) && std::signbit(r));
}

TEST(ReduceRules, FirstOperandsNaNWinsAndIsQuieted) {
  const float a = std::bit_cast<float>(0x7f800123u);  // signaling, payload 0x123
  const float b = std::bit_cast<float>(0xffc00456u);
  for (const ReduceOp op : all_ops) {
    for (const auto r : on_every_isa(op, a, b)) EXPECT_EQ(std::bit_cast<std::uint32_t>(r), 0x7fc00123u) << op_name(op);
    for (const auto r : on_every_isa(op, b, a)) EXPECT_EQ(std::bit_cast<std::uint32_t>(r), 0xffc00456u) << op_name(op);
  }
}

TEST(ReduceRules, HalvesRoundToNearestEven) {
  tutti::f16 max_half, sixteen, one, tiny;
  max_half.bits = 0x7bff;  // 65504; + 16 = 65520 lies halfway to 65536 (inf) and rounds to even: inf
  sixteen.bits = 0x4c00;
  one.bits = 0x3c00;
  tiny.bits = 0x1000;  // 2^-11: 1 + 2^-11 is halfway between 1 and 1 + 2^-10, rounds to 1
  for (const auto r : on_every_isa(ReduceOp::sum, max_half, sixteen)) EXPECT_EQ(r.bits, 0x7c00);
  for (const auto r : on_every_isa(ReduceOp::sum, one, tiny)) EXPECT_EQ(r.bits, 0x3c00);
  tutti::bf16 b_one, b_tiny;
  b_one.bits = 0x3f80;
  b_tiny.bits = 0x3b80;  // 2^-8: halfway, rounds to even (1)
  for (const auto r : on_every_isa(ReduceOp::sum, b_one, b_tiny)) EXPECT_EQ(r.bits, 0x3f80);
}

TEST(ReduceApi, PublicEntryPointsUseTheActiveIsa) {
  EXPECT_TRUE(reduce::supported(reduce::active_isa()));
  EXPECT_STREQ(reduce::isa(), reduce::name(reduce::active_isa()));
  float a[3] = {1, 2, 3}, b[3] = {10, 20, 30};
  reduce::apply(ReduceOp::avg, DataType::f32, a, a, b, 3);
  reduce::divide(DataType::f32, a, 3, 2);
  EXPECT_EQ(a[0], 5.5f);
  EXPECT_EQ(a[2], 16.5f);
}

// Exits 0 when TUTTI_REDUCE_ISA=`value` makes isa() `expected`, or (expected null) makes it throw
// invalid_argument.
[[noreturn]] void exit_with_forced_isa(const char* value, const char* expected) {
  setenv("TUTTI_REDUCE_ISA", value, 1);
  try {
    const std::string chosen = reduce::isa();
    std::exit(expected != nullptr && chosen == expected ? 0 : 1);
  } catch (const tutti::Error& e) {
    std::exit(expected == nullptr && e.code() == tutti::ErrorCode::invalid_argument ? 0 : 2);
  }
}

// The choice is made once per process, so each case runs in a fresh one (threadsafe style
// re-executes the test binary rather than forking this process, whose choice is already made).
TEST(ReduceApiDeathTest, EnvironmentForcesTheIsa) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(exit_with_forced_isa("generic", "generic"), ::testing::ExitedWithCode(0), "");
  if (reduce::supported(Isa::avx2)) {
    EXPECT_EXIT(exit_with_forced_isa("avx2", "avx2"), ::testing::ExitedWithCode(0), "");
  }
  EXPECT_EXIT(exit_with_forced_isa("sse9", nullptr), ::testing::ExitedWithCode(0), "");
}

TEST(ReduceApi, RejectsBadArguments) {
  float x[4] = {}, y[4] = {};
  const auto invalid = [](auto&& call) {
    try {
      call();
    } catch (const tutti::Error& e) {
      return e.code() == tutti::ErrorCode::invalid_argument;
    }
    return false;
  };
  EXPECT_TRUE(invalid([&] { reduce::apply(static_cast<ReduceOp>(9), DataType::f32, x, x, y, 4); }));
  EXPECT_TRUE(invalid([&] { reduce::apply(ReduceOp::sum, static_cast<DataType>(42), x, x, y, 4); }));
  EXPECT_TRUE(invalid([&] { reduce::apply(ReduceOp::sum, DataType::f32, nullptr, x, y, 4); }));
  EXPECT_TRUE(invalid([&] { reduce::apply(ReduceOp::sum, DataType::f32, x + 1, x, y, 3); }));  // partial overlap
  EXPECT_TRUE(invalid([&] { reduce::divide(DataType::i32, x, 4, 0); }));
  EXPECT_TRUE(invalid([&] { reduce::divide(DataType::i32, x, 4, -2); }));
  EXPECT_NO_THROW(reduce::apply(ReduceOp::sum, DataType::f32, nullptr, nullptr, nullptr, 0));
  EXPECT_NO_THROW(reduce::divide(DataType::f32, nullptr, 0, 3));
  EXPECT_NO_THROW(reduce::apply(ReduceOp::sum, DataType::f32, x, x, x, 4));
}

}  // namespace

// core::copy takes its own loop where memcpy is slow (a destination 1-63 bytes after the source
// modulo a page, 2 KiB and more) and memcpy elsewhere: both give exactly the source's bytes and
// touch nothing around the destination. core::move also copies regions that overlap.
// copy (memcpy or the vector loop by distance), the vector loop itself and the streaming copy
// (an unaligned head, 64-byte blocks, a tail) at every distance that picks a different path.
TEST(Copy, EveryDistanceAndSizeCopiesExactly) {
  using Copier = void (*)(std::byte*, const std::byte*, std::size_t);
  const std::pair<const char*, Copier> copiers[] = {
      {"copy", [](std::byte* d, const std::byte* s, std::size_t n) { tutti::core::copy(d, s, n); }},
      {"copy_vector", tutti::core::copy_vector},
      {"copy_streaming", tutti::core::copy_streaming}};
  constexpr std::size_t page = 4096, guard = 128;
  std::vector<std::byte> source(3 * page + 70000), target(3 * page + 70000 + 2 * guard);
  for (std::size_t i = 0; i < source.size(); ++i) source[i] = static_cast<std::byte>((i * 131 + 7) % 251);
  auto* src_page =
      reinterpret_cast<std::byte*>((reinterpret_cast<std::uintptr_t>(source.data()) + page - 1) / page * page);
  auto* dst_page =
      reinterpret_cast<std::byte*>((reinterpret_cast<std::uintptr_t>(target.data()) + guard + page - 1) / page * page);
  for (const auto& [name, copier] : copiers)
    for (std::size_t distance : {0, 1, 8, 16, 31, 32, 48, 63, 64, 65, 100, 4000, 4080, 4095})
      for (std::size_t bytes : {0, 1, 15, 63, 64, 65, 2047, 2048, 2049, 4096 + 13, 65536, 65536 + 61}) {
        std::fill(target.begin(), target.end(), std::byte{0xEE});
        std::byte* dst = dst_page + distance;
        ASSERT_LE(dst + bytes + guard, target.data() + target.size());
        copier(dst, src_page, bytes);
        ASSERT_EQ(std::memcmp(dst, src_page, bytes), 0)
            << name << ", distance " << distance << ", " << bytes << " bytes";
        for (std::byte* p = dst - guard; p < dst; ++p)
          ASSERT_EQ(*p, std::byte{0xEE}) << name << ", before, distance " << distance;
        for (std::byte* p = dst + bytes; p < dst + bytes + guard; ++p)
          ASSERT_EQ(*p, std::byte{0xEE}) << name << ", after, distance " << distance << ", " << bytes << " bytes";
      }
}

TEST(Copy, MoveCopiesOverlappingRegionsEitherWay) {
  for (std::ptrdiff_t shift : {-4096, -16, -1, 1, 16, 40, 4096}) {
    std::vector<std::byte> buffer(3 * 65536), expected;
    for (std::size_t i = 0; i < buffer.size(); ++i) buffer[i] = static_cast<std::byte>(i % 253);
    expected = buffer;
    const std::size_t from = 65536, bytes = 65536;
    std::memmove(expected.data() + from + shift, expected.data() + from, bytes);
    tutti::core::move(buffer.data() + from + shift, buffer.data() + from, bytes);
    ASSERT_EQ(buffer, expected) << "shift " << shift;
  }
  std::vector<std::byte> a(10000, std::byte{1}), b(10000 + 16, std::byte{2});
  tutti::core::move(b.data() + 16, a.data(), a.size());  // apart: copy()'s path
  EXPECT_TRUE(std::all_of(b.begin() + 16, b.end(), [](std::byte x) { return x == std::byte{1}; }));
  EXPECT_TRUE(std::all_of(b.begin(), b.begin() + 16, [](std::byte x) { return x == std::byte{2}; }));
}
