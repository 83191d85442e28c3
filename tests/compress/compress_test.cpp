// The codecs of the compress layer, in process: fp16/bf16 against known bit patterns, QSGD's
// unbiasedness and variance bound (statistically, with fixed seeds), top-k, error feedback, and
// PowerSGD's reconstruction and error feedback.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include "compress_data.hpp"
#include "threads.hpp"
#include "tutti/compress.hpp"

namespace tc = tutti::compress;
using tutti::testing::random_vector;

namespace {

float from_bits(std::uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

std::uint16_t fp16_of(float f) {
  std::uint16_t h = 0;
  tc::encode_fp16(&f, &h, 1);
  return h;
}
std::uint16_t bf16_of(float f) {
  std::uint16_t h = 0;
  tc::encode_bf16(&f, &h, 1);
  return h;
}

}  // namespace

TEST(Fp16, KnownBitPatterns) {
  EXPECT_EQ(fp16_of(1.0f), 0x3c00);
  EXPECT_EQ(fp16_of(-2.0f), 0xc000);
  EXPECT_EQ(fp16_of(0.1f), 0x2e66);
  EXPECT_EQ(fp16_of(65504.0f), 0x7bff);
  EXPECT_EQ(fp16_of(65520.0f), 0x7c00);                    // halfway to the next binade: rounds to inf
  EXPECT_EQ(fp16_of(1.0f + 0x1p-11f), 0x3c00);             // a tie goes to the even 1.0
  EXPECT_EQ(fp16_of(1.0f + 3 * 0x1p-11f), 0x3c02);         // a tie goes to the even 1 + 2^-9
  EXPECT_EQ(fp16_of(1.0f + 0x1p-11f + 0x1p-20f), 0x3c01);  // above the tie
  EXPECT_EQ(fp16_of(0x1p-24f), 0x0001);                    // the smallest subnormal
  EXPECT_EQ(fp16_of(0x1p-26f), 0x0000);                    // below half of it
  EXPECT_EQ(fp16_of(-0.0f), 0x8000);
  EXPECT_EQ(fp16_of(INFINITY), 0x7c00);
  EXPECT_EQ(fp16_of(NAN) & 0x7e00, 0x7e00);
}

TEST(Bf16, KnownBitPatterns) {
  EXPECT_EQ(bf16_of(1.0f), 0x3f80);
  EXPECT_EQ(bf16_of(from_bits(0x3f808000u)), 0x3f80);  // a tie goes to the even 0x3f80
  EXPECT_EQ(bf16_of(from_bits(0x3f818000u)), 0x3f82);  // a tie goes to the even 0x3f82
  EXPECT_EQ(bf16_of(from_bits(0x3f808001u)), 0x3f81);  // above the tie
  EXPECT_EQ(bf16_of(3.14159265f), 0x4049);
  EXPECT_EQ(bf16_of(-INFINITY), 0xff80);
  EXPECT_EQ(bf16_of(from_bits(0x7f7fffffu)), 0x7f80);  // the largest f32 rounds to inf
  EXPECT_EQ(bf16_of(NAN) & 0x7fc0, 0x7fc0);
}

// Every 16-bit pattern but the NaNs decodes to an f32 that encodes back to the same bits.
static void expect_round_trips(void (*decode)(const std::uint16_t*, float*, std::size_t),
                               void (*encode)(const float*, std::uint16_t*, std::size_t), std::uint32_t exponent,
                               const char* what) {
  std::vector<std::uint16_t> bits(1 << 16), back(1 << 16);
  std::iota(bits.begin(), bits.end(), std::uint16_t{0});
  std::vector<float> wide(bits.size());
  decode(bits.data(), wide.data(), bits.size());
  encode(wide.data(), back.data(), bits.size());
  const std::uint32_t mantissa = ~exponent & 0x7fffu;
  for (std::uint32_t b = 0; b < bits.size(); ++b) {
    const bool nan = (b & exponent) == exponent && (b & mantissa) != 0;
    if (!nan) {
      ASSERT_EQ(back[b], b) << what << " " << std::hex << b;
    }
  }
}

TEST(HalfCodecs, EveryNumberRoundTrips) {
  expect_round_trips(tc::decode_fp16, tc::encode_fp16, 0x7c00, "fp16");
  expect_round_trips(tc::decode_bf16, tc::encode_bf16, 0x7f80, "bf16");
  std::uint16_t one[2] = {0x3c00, 0x0001};
  float wide[2];
  tc::decode_fp16(one, wide, 2);
  EXPECT_EQ(wide[0], 1.0f);
  EXPECT_EQ(wide[1], 0x1p-24f);
  one[0] = 0x3f80;
  tc::decode_bf16(one, wide, 1);
  EXPECT_EQ(wide[0], 1.0f);
}

TEST(Qsgd, SizesLevelsAndBadOptions) {
  EXPECT_EQ(tc::qsgd_levels(8), 127);
  EXPECT_EQ(tc::qsgd_levels(4), 7);
  EXPECT_EQ(tc::qsgd_encoded_bytes(300, {8, 128}), 3 * 4 + 300u);
  EXPECT_EQ(tc::qsgd_encoded_bytes(301, {4, 128}), 3 * 4 + 151u);
  EXPECT_EQ(tc::qsgd_encoded_bytes(0, {4, 128}), 0u);
  for (const int bits : {0, 2, 5, 16}) {
    try {
      tc::qsgd_encoded_bytes(10, {bits, 128});
      ADD_FAILURE() << "bits " << bits << " accepted";
    } catch (const tutti::Error& e) {
      EXPECT_EQ(e.code(), tutti::ErrorCode::invalid_argument);
    }
  }
  EXPECT_THROW(tc::qsgd_encoded_bytes(10, {8, 0}), tutti::Error);
  EXPECT_THROW(tc::qsgd_encode(nullptr, 3, {8, 4}, {}, nullptr), tutti::Error);
}

// A count whose encoding takes more than size_t counts is refused, not wrapped around into a small
// size (a caller would allocate that, and qsgd_encode write past it).
TEST(Qsgd, ACountWhoseSizeWrapsAroundIsRefused) {
  const std::size_t huge = std::numeric_limits<std::size_t>::max() / 4;
  try {
    tc::qsgd_encoded_bytes(huge, {8, 512});
    ADD_FAILURE() << "count " << huge << " accepted";
  } catch (const tutti::Error& e) {
    EXPECT_EQ(e.code(), tutti::ErrorCode::invalid_argument);
    EXPECT_NE(std::string(e.what()).find(std::to_string(huge)), std::string::npos) << e.what();
  }
}

TEST(Qsgd, ExactLevelsDecodeExactly) {
  // One nonzero element per bucket sits at the top level s, which is never rounded: it decodes
  // to itself. Zero buckets decode to zeros.
  for (const int bits : {4, 8}) {
    const tc::QsgdOptions options{bits, 4};
    const std::vector<float> v = {0, -2.5f, 0, 0, 0, 0, 0, 0, 7, 0, 0, 0, 0, 0, 1e-3f};
    std::vector<std::byte> code(tc::qsgd_encoded_bytes(v.size(), options));
    std::vector<float> out(v.size(), 99.0f);
    for (std::uint64_t seed = 0; seed < 20; ++seed) {
      tc::qsgd_encode(v.data(), v.size(), options, {seed, 1, 2, 3}, code.data());
      tc::qsgd_decode(code.data(), v.size(), options, out.data());
      EXPECT_EQ(out, v) << "bits " << bits << " seed " << seed;
    }
  }
}

TEST(Qsgd, ReproducibleFromTheKey) {
  const auto v = random_vector(1000, 1);
  const tc::QsgdOptions options{4, 256};
  std::vector<std::byte> a(tc::qsgd_encoded_bytes(v.size(), options)), b(a.size()), c(a.size());
  tc::qsgd_encode(v.data(), v.size(), options, {7, 1, 5, 9}, a.data());
  tc::qsgd_encode(v.data(), v.size(), options, {7, 1, 5, 9}, b.data());
  EXPECT_EQ(a, b);
  for (const tc::RandomKey other :
       {tc::RandomKey{8, 1, 5, 9}, tc::RandomKey{7, 2, 5, 9}, tc::RandomKey{7, 1, 6, 9}, tc::RandomKey{7, 1, 5, 10}}) {
    tc::qsgd_encode(v.data(), v.size(), options, other, c.data());
    EXPECT_NE(a, c);
  }
  EXPECT_EQ(tc::uniform({1, 2, 3, 4}, 5), tc::uniform({1, 2, 3, 4}, 5));
}

// Over many keys: each element's mean is within 5 standard errors of the input (the standard
// error from the exact variance of its two-level rounding), every bucket's mean squared error is
// within 10% of its exact value, and that is below the paper's bound min(n/s², √n/s)·‖v‖².
TEST(Qsgd, UnbiasedWithinTheVarianceBound) {
  constexpr int kKeys = 4000;
  const std::size_t bucket = 128, n = 300;  // two full buckets and a partial one
  for (const int bits : {4, 8}) {
    const tc::QsgdOptions options{bits, bucket};
    const double s = tc::qsgd_levels(bits);
    const auto v = random_vector(n, 2 + static_cast<unsigned>(bits));
    std::vector<double> mean(n, 0.0), exact_var(n, 0.0);
    const std::size_t nb = (n + bucket - 1) / bucket;
    std::vector<double> sq_error(nb, 0.0), norm2(nb, 0.0);
    for (std::size_t i = 0; i < n; ++i) norm2[i / bucket] += static_cast<double>(v[i]) * v[i];
    for (std::size_t i = 0; i < n; ++i) {
      const double norm = static_cast<float>(std::sqrt(norm2[i / bucket]));
      const double r = std::fabs(v[i]) / norm * s, f = r - std::floor(r);
      exact_var[i] = (norm / s) * (norm / s) * f * (1 - f);
    }
    std::vector<std::byte> code(tc::qsgd_encoded_bytes(n, options));
    std::vector<float> out(n);
    for (int k = 0; k < kKeys; ++k) {
      tc::qsgd_encode(v.data(), n, options, {42, 0, static_cast<std::uint64_t>(k), 0}, code.data());
      tc::qsgd_decode(code.data(), n, options, out.data());
      for (std::size_t i = 0; i < n; ++i) {
        mean[i] += out[i];
        sq_error[i / bucket] += (out[i] - static_cast<double>(v[i])) * (out[i] - static_cast<double>(v[i]));
      }
    }
    for (std::size_t i = 0; i < n; ++i) {
      mean[i] /= kKeys;
      const double se = std::sqrt(exact_var[i] / kKeys);
      EXPECT_LE(std::fabs(mean[i] - v[i]), 5 * se + 1e-6 * std::fabs(v[i])) << "bits " << bits << " element " << i;
    }
    for (std::size_t b = 0; b < nb; ++b) {
      const double m = static_cast<double>(std::min(bucket, n - b * bucket));
      double exact = 0;
      for (std::size_t i = b * bucket; i < std::min(n, (b + 1) * bucket); ++i) exact += exact_var[i];
      const double measured = sq_error[b] / kKeys;
      EXPECT_NEAR(measured, exact, 0.1 * exact) << "bits " << bits << " bucket " << b;
      EXPECT_LE(measured, std::min(m / (s * s), std::sqrt(m) / s) * norm2[b]) << "bits " << bits << " bucket " << b;
    }
  }
}

TEST(TopK, LargestMagnitudesTiesByIndex) {
  const std::vector<float> v = {1, -3, 3, 2, -2, 0.5f, -0.0f};
  std::vector<std::uint32_t> idx(7, 99);
  std::vector<float> val(7, 99);
  tc::top_k(v.data(), v.size(), 3, idx.data(), val.data());
  EXPECT_EQ(std::vector<std::uint32_t>(idx.begin(), idx.begin() + 3), (std::vector<std::uint32_t>{1, 2, 3}));
  EXPECT_EQ(std::vector<float>(val.begin(), val.begin() + 3), (std::vector<float>{-3, 3, 2}));
  EXPECT_EQ(idx[3], 99u);  // nothing past k written
  tc::top_k(v.data(), v.size(), 7, idx.data(), val.data());
  EXPECT_EQ(idx, (std::vector<std::uint32_t>{0, 1, 2, 3, 4, 5, 6}));
  tc::top_k(v.data(), v.size(), 0, nullptr, nullptr);
  EXPECT_THROW(tc::top_k(v.data(), v.size(), 8, idx.data(), val.data()), tutti::Error);
  EXPECT_THROW(tc::top_k(v.data(), v.size(), 1, nullptr, val.data()), tutti::Error);
  // Indices only (values null): the same choice.
  std::vector<std::uint32_t> only(2, 99);
  tc::top_k(v.data(), v.size(), 2, only.data(), nullptr);
  EXPECT_EQ(only, (std::vector<std::uint32_t>{1, 2}));
  const std::vector<float> nan = {1, NAN, 5};
  tc::top_k(nan.data(), 3, 1, idx.data(), val.data());
  EXPECT_EQ(idx[0], 1u);
}

TEST(TopK, MatchesAFullSort) {
  std::mt19937 gen(3);
  std::uniform_int_distribution<int> small(-20, 20);  // many ties
  std::vector<float> v(5003);
  for (auto& x : v) x = static_cast<float>(small(gen));
  for (const std::size_t k : {1u, 17u, 2500u, 5003u}) {
    std::vector<std::uint32_t> order(v.size());
    std::iota(order.begin(), order.end(), 0u);
    std::stable_sort(order.begin(), order.end(),
                     [&](std::uint32_t a, std::uint32_t b) { return std::fabs(v[a]) > std::fabs(v[b]); });
    order.resize(k);
    std::sort(order.begin(), order.end());
    std::vector<std::uint32_t> idx(k);
    std::vector<float> val(k);
    tc::top_k(v.data(), v.size(), k, idx.data(), val.data());
    ASSERT_EQ(idx, order) << "k " << k;
    for (std::size_t j = 0; j < k; ++j) ASSERT_EQ(val[j], v[idx[j]]);
  }
}

TEST(ErrorFeedback, KeepsWhatWasNotSent) {
  tc::ErrorFeedback ef;
  std::vector<float> g = {1, 2, 3};
  ef.add_residual("w", g.data(), 3);  // zero residual at first
  EXPECT_EQ(g, (std::vector<float>{1, 2, 3}));
  const std::vector<float> sent = {1, 0, 2};
  ef.set_residual("w", g.data(), sent.data(), 3);
  EXPECT_EQ(std::vector<float>(ef.residual("w").begin(), ef.residual("w").end()), (std::vector<float>{0, 2, 1}));
  std::vector<float> next = {10, 10, 10};
  ef.add_residual("w", next.data(), 3);
  EXPECT_EQ(next, (std::vector<float>{10, 12, 11}));
  EXPECT_TRUE(ef.residual("other").empty());
  EXPECT_THROW(ef.add_residual("w", next.data(), 2), tutti::Error);
}
