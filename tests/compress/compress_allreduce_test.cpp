// The compressed collectives with ranks as threads (local_group): fp16/bf16 and QSGD allreduce,
// PowerSGD, and the GradientCompressor. Every rank's result is compared bit for bit with every
// other rank's and with a reference, and the lossy ones with the exact sum within their bound.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <mutex>
#include <random>
#include <vector>

#include "compress_data.hpp"
#include "threads.hpp"
#include "tutti/compress.hpp"

namespace tc = tutti::compress;
using tutti::testing::on_threads;
using tutti::testing::random_vector;
using tutti::testing::same_bits;

namespace {

const std::vector<std::size_t>& counts_for(int p) {
  static std::vector<std::vector<std::size_t>> all(9);
  auto& c = all[static_cast<std::size_t>(p)];
  if (c.empty()) c = {0, 1, static_cast<std::size_t>(p) + 1, 10007};
  return c;
}

// Runs fn(comm, rank) -> result on p ranks; returns every rank's result.
template <class Fn>
std::vector<std::vector<float>> run(int p, Fn fn) {
  auto comms = tutti::local_group(p);
  std::vector<std::vector<float>> results(static_cast<std::size_t>(p));
  const auto failures = on_threads(p, [&](int r) { results[static_cast<std::size_t>(r)] = fn(comms[r], r); });
  EXPECT_EQ(failures, "");
  return results;
}

}  // namespace

// Integer data whose sums are exact in 16 bits: the result is the exact sum, on every rank.
TEST(HalfAllreduce, ExactOnIntegers) {
  for (const auto wire : {tc::Wire::fp16, tc::Wire::bf16})
    for (int p = 1; p <= 8; ++p)
      for (const std::size_t n : counts_for(p)) {
        auto input = [](int r, std::size_t i) {
          return static_cast<float>(static_cast<int>((i * 7 + r * 3) % 17) - 8);
        };
        const auto results = run(p, [&](tutti::Communicator& comm, int r) {
          std::vector<float> send(n), recv(n, NAN);
          for (std::size_t i = 0; i < n; ++i) send[i] = input(r, i);
          tc::allreduce(comm, send.data(), recv.data(), n, wire, tutti::ReduceOp::sum);
          return recv;
        });
        for (int r = 0; r < p; ++r)
          for (std::size_t i = 0; i < n; ++i) {
            float exact = 0;
            for (int q = 0; q < p; ++q) exact += input(q, i);
            ASSERT_EQ(results[static_cast<std::size_t>(r)][i], exact) << "p " << p << " n " << n << " rank " << r;
          }
      }
}

// Random data, in place, avg: identical bits on every rank, within the rounding bound of the
// exact average (each of the p roundings of a partial sum and of the inputs: (p+1)·u·Σ|x|), and at
// p <= 2 equal bit for bit to the reference computed the same way.
TEST(HalfAllreduce, RandomDataIdenticalAndWithinBound) {
  for (const auto wire : {tc::Wire::fp16, tc::Wire::bf16})
    for (int p = 1; p <= 8; ++p)
      for (const std::size_t n : counts_for(p)) {
        const double u = wire == tc::Wire::fp16 ? 0x1p-11 : 0x1p-8;
        const auto results = run(p, [&](tutti::Communicator& comm, int r) {
          auto data = random_vector(n, static_cast<unsigned>(r + 10));
          tc::allreduce(comm, data.data(), data.data(), n, wire, tutti::ReduceOp::avg);
          return data;
        });
        for (int r = 1; r < p; ++r) ASSERT_TRUE(same_bits(results[0], results[static_cast<std::size_t>(r)]));
        std::vector<std::vector<float>> inputs;
        for (int r = 0; r < p; ++r) inputs.push_back(random_vector(n, static_cast<unsigned>(r + 10)));
        for (std::size_t i = 0; i < n; ++i) {
          double exact = 0, abs = 0;
          for (const auto& in : inputs) exact += in[i], abs += std::fabs(in[i]);
          ASSERT_NEAR(results[0][i], exact / p, (p + 1) * u * abs / p + 1e-30) << "p " << p << " i " << i;
        }
        if (p > 2) continue;
        // At p <= 2 the order of the 16-bit sums cannot differ: the result is exactly
        // decode(encode(decode(encode(a)) + decode(encode(b)))) / p.
        std::vector<float> reference(n, 0.0f);
        for (const auto& in : inputs) {
          std::vector<std::uint16_t> h(n);
          std::vector<float> back(n);
          (wire == tc::Wire::fp16 ? tc::encode_fp16 : tc::encode_bf16)(in.data(), h.data(), n);
          (wire == tc::Wire::fp16 ? tc::decode_fp16 : tc::decode_bf16)(h.data(), back.data(), n);
          for (std::size_t i = 0; i < n; ++i) reference[i] += back[i];
        }
        std::vector<std::uint16_t> h(n);
        (wire == tc::Wire::fp16 ? tc::encode_fp16 : tc::encode_bf16)(reference.data(), h.data(), n);
        (wire == tc::Wire::fp16 ? tc::decode_fp16 : tc::decode_bf16)(h.data(), reference.data(), n);
        for (auto& x : reference) x /= static_cast<float>(p);
        ASSERT_TRUE(same_bits(results[0], reference)) << "p " << p << " n " << n;
      }
}

// QSGD allreduce: identical on every rank, equal bit for bit to encoding each rank's input with
// its own key and summing the decoded vectors in rank order, and each element within Σ‖v_r‖/s
// of the exact sum (a rounding moves an element by at most one level).
TEST(QsgdAllreduce, IdenticalEqualToTheReferenceAndWithinBound) {
  for (const int bits : {4, 8})
    for (int p = 1; p <= 8; ++p)
      for (const std::size_t n : counts_for(p)) {
        const tc::QsgdOptions options{bits, 64};
        const tc::RandomKey key{11, 0, 3, 5};
        std::vector<std::vector<float>> sent(static_cast<std::size_t>(p));
        const auto results = run(p, [&](tutti::Communicator& comm, int r) {
          const auto in = random_vector(n, static_cast<unsigned>(100 + r));
          std::vector<float> out(n, NAN), mine(n, NAN);
          tc::qsgd_allreduce(comm, in.data(), out.data(), n, options, key, tutti::ReduceOp::sum, mine.data());
          sent[static_cast<std::size_t>(r)] = mine;
          return out;
        });
        std::vector<float> reference(n, 0.0f), exact(n, 0.0f), slack(n, 0.0f);
        const double s = tc::qsgd_levels(bits);
        for (int r = 0; r < p; ++r) {
          const auto in = random_vector(n, static_cast<unsigned>(100 + r));
          std::vector<std::byte> code(tc::qsgd_encoded_bytes(n, options));
          tc::RandomKey k = key;
          k.rank = static_cast<std::uint32_t>(r);
          tc::qsgd_encode(in.data(), n, options, k, code.data());
          std::vector<float> decoded(n);
          tc::qsgd_decode(code.data(), n, options, decoded.data());
          ASSERT_TRUE(same_bits(decoded, sent[static_cast<std::size_t>(r)])) << "sent, rank " << r;
          for (std::size_t i = 0; i < n; ++i) reference[i] = r == 0 ? decoded[i] : reference[i] + decoded[i];
          for (std::size_t b = 0; b * 64 < n; ++b) {
            double norm = 0;
            for (std::size_t i = b * 64; i < std::min(n, (b + 1) * 64); ++i) norm += static_cast<double>(in[i]) * in[i];
            for (std::size_t i = b * 64; i < std::min(n, (b + 1) * 64); ++i) {
              slack[i] += static_cast<float>(std::sqrt(norm) / s);
              exact[i] += in[i];
            }
          }
        }
        for (int r = 0; r < p; ++r)
          ASSERT_TRUE(same_bits(results[static_cast<std::size_t>(r)], reference))
              << "p " << p << " n " << n << " rank " << r;
        for (std::size_t i = 0; i < n; ++i)
          ASSERT_NEAR(reference[i], exact[i], slack[i] * 1.001 + 1e-5) << "p " << p << " i " << i;
      }
}

// Top-k allreduce: every rank gets, at the union of the ranks' top k, the sum of every rank's
// input there, and 0 elsewhere (integer data with many ties, so the sums are exact and the
// tie-breaks matter), for k from one element to all of them; `sent` is the rank's input at the
// union, and the return value the union's size.
TEST(TopKAllreduce, SumOverTheUnionOfTheRanksTopK) {
  auto input = [](int r, std::size_t i) { return static_cast<float>(static_cast<int>((i * 13 + r * 5) % 23) - 11); };
  for (int p = 1; p <= 8; ++p)
    for (const std::size_t n : counts_for(p))
      for (const std::size_t k : {std::min<std::size_t>(n, 1), n / 3, n}) {
        std::vector<std::vector<float>> sent(static_cast<std::size_t>(p));
        std::vector<std::size_t> united(static_cast<std::size_t>(p));
        const auto results = run(p, [&](tutti::Communicator& comm, int r) {
          std::vector<float> data(n), mine(n, NAN);
          for (std::size_t i = 0; i < n; ++i) data[i] = input(r, i);
          united[static_cast<std::size_t>(r)] =
              tc::top_k_allreduce(comm, data.data(), data.data(), n, k, tutti::ReduceOp::sum, mine.data());
          sent[static_cast<std::size_t>(r)] = mine;
          return data;
        });
        std::vector<bool> chosen(n, false);
        for (int r = 0; r < p; ++r) {
          std::vector<float> in(n);
          for (std::size_t i = 0; i < n; ++i) in[i] = input(r, i);
          std::vector<std::uint32_t> idx(k);
          std::vector<float> val(k);
          tc::top_k(in.data(), n, k, idx.data(), val.data());
          for (const auto i : idx) chosen[i] = true;
        }
        const auto size = static_cast<std::size_t>(std::count(chosen.begin(), chosen.end(), true));
        ASSERT_GE(size, k);
        std::vector<float> reference(n, 0.0f);
        for (int r = 0; r < p; ++r) {
          std::vector<float> expected(n, 0.0f);
          for (std::size_t i = 0; i < n; ++i)
            if (chosen[i]) expected[i] = input(r, i), reference[i] += input(r, i);
          ASSERT_EQ(sent[static_cast<std::size_t>(r)], expected) << "p " << p << " n " << n << " k " << k;
          ASSERT_EQ(united[static_cast<std::size_t>(r)], size) << "p " << p << " n " << n << " k " << k;
        }
        for (int r = 0; r < p; ++r)
          ASSERT_EQ(results[static_cast<std::size_t>(r)], reference) << "p " << p << " n " << n << " k " << k;
      }
}

TEST(CompressedAllreduce, RefusesBadInputBeforeWriting) {
  const auto failures = on_threads(1, [](int) {
    auto comm = tutti::local_group(1)[0];
    std::vector<float> v(4, 1.0f);
    for (const auto op : {tutti::ReduceOp::max, tutti::ReduceOp::prod}) {
      EXPECT_THROW(tc::allreduce(comm, v.data(), v.data(), 4, tc::Wire::fp16, op), tutti::Error);
      EXPECT_THROW(tc::qsgd_allreduce(comm, v.data(), v.data(), 4, {8, 4}, {}, op), tutti::Error);
    }
    EXPECT_THROW(tc::allreduce(comm, nullptr, v.data(), 4, tc::Wire::bf16, tutti::ReduceOp::sum), tutti::Error);
    EXPECT_THROW(tc::qsgd_allreduce(comm, v.data(), v.data(), 4, {5, 4}, {}, tutti::ReduceOp::sum), tutti::Error);
    EXPECT_THROW(tc::top_k_allreduce(comm, v.data(), v.data(), 4, 5, tutti::ReduceOp::sum), tutti::Error);
    EXPECT_THROW(tc::top_k_allreduce(comm, v.data(), v.data(), 4, 2, tutti::ReduceOp::min), tutti::Error);
    EXPECT_EQ(v, std::vector<float>(4, 1.0f));
  });
  EXPECT_EQ(failures, "");
}

// Shapes whose element count wraps around size_t are refused, naming the tensor, before anything
// is sized by the wrapped count.
TEST(PowerSgd, AShapeWhoseSizeWrapsAroundIsRefused) {
  const auto failures = on_threads(1, [](int) {
    auto comm = tutti::local_group(1)[0];
    std::vector<float> grad(8, 1.0f);
    const std::size_t rows = std::size_t{1} << 62;  // rows x 8 elements: 2^65, 0 once wrapped
    tc::PowerSgd power(1, 1);
    try {
      power.allreduce(comm, "w", grad.data(), rows, 8);
      ADD_FAILURE() << "PowerSgd accepted " << rows << "x8";
    } catch (const tutti::Error& e) {
      EXPECT_EQ(e.code(), tutti::ErrorCode::invalid_argument);
      EXPECT_NE(std::string(e.what()).find(std::to_string(rows)), std::string::npos) << e.what();
    }
    const std::vector<std::int64_t> shape = {std::int64_t{1} << 40, std::int64_t{1} << 40};
    for (const char* text : {"fp16", "powersgd:1"}) {
      tc::GradientCompressor compressor(tc::Compression::parse(text), 1);
      try {
        compressor.average(comm, "w", grad.data(), shape);
        ADD_FAILURE() << text << " accepted a shape of 2^80 elements";
      } catch (const tutti::Error& e) {
        EXPECT_EQ(e.code(), tutti::ErrorCode::invalid_argument);
        EXPECT_NE(std::string(e.what()).find("'w'"), std::string::npos) << e.what();
      }
    }
  });
  EXPECT_EQ(failures, "");
}

TEST(PowerSgd, OrthogonalizeGivesOrthonormalColumns) {
  auto m = random_vector(50 * 4, 7);
  tc::orthogonalize(m.data(), 50, 4);
  for (int a = 0; a < 4; ++a)
    for (int b = 0; b < 4; ++b) {
      double dot = 0;
      for (int i = 0; i < 50; ++i) dot += static_cast<double>(m[i * 4 + a]) * m[i * 4 + b];
      EXPECT_NEAR(dot, a == b ? 1.0 : 0.0, 1e-5);
    }
}

// A matrix of rank r (the same on every rank, so the average is itself) comes back from one step
// of rank-r PowerSGD within float tolerance, identical on every rank, with a residual near zero.
TEST(PowerSgd, ReconstructsAMatrixOfItsRank) {
  const std::size_t rows = 40, cols = 30;
  for (const int r : {1, 2, 4})
    for (const int p : {1, 3}) {
      const auto a = random_vector(rows * r, 20), b = random_vector(cols * r, 21);
      std::vector<float> m(rows * cols, 0.0f);
      for (std::size_t i = 0; i < rows; ++i)
        for (std::size_t k = 0; k < cols; ++k)
          for (int j = 0; j < r; ++j) m[i * cols + k] += a[i * r + j] * b[k * r + j];
      std::vector<float> residual_max(static_cast<std::size_t>(p));
      const auto results = run(p, [&](tutti::Communicator& comm, int rank) {
        tc::PowerSgd power(r, 5);
        auto grad = m;
        power.allreduce(comm, "w", grad.data(), rows, cols);
        float worst = 0;
        for (const float x : power.residual("w")) worst = std::max(worst, std::fabs(x));
        residual_max[static_cast<std::size_t>(rank)] = worst;
        return grad;
      });
      for (int q = 1; q < p; ++q) ASSERT_TRUE(same_bits(results[0], results[static_cast<std::size_t>(q)]));
      for (std::size_t i = 0; i < m.size(); ++i) ASSERT_NEAR(results[0][i], m[i], 1e-4 * (1 + std::fabs(m[i]))) << i;
      for (const float w : residual_max) EXPECT_LT(w, 1e-3);
    }
}

// Error feedback: over T steps, what PowerSGD delivered plus the ranks' mean final residual is the
// mean over ranks of every gradient (nothing is lost, only delayed). Vectors go uncompressed.
TEST(PowerSgd, ErrorFeedbackAddsUpToTheTrueSum) {
  const int p = 3, steps = 6;
  const std::size_t rows = 24, cols = 16;
  std::vector<std::vector<double>> delivered(p, std::vector<double>(rows * cols, 0.0));
  std::vector<std::vector<float>> residual(p);
  std::vector<float> bias_out;
  std::mutex mutex;
  run(p, [&](tutti::Communicator& comm, int rank) {
    tc::PowerSgd power(2, 9);
    for (int t = 0; t < steps; ++t) {
      auto g = random_vector(rows * cols, static_cast<unsigned>(1000 + 10 * t + rank));
      power.allreduce(comm, "w", g.data(), rows, cols);
      for (std::size_t i = 0; i < g.size(); ++i) delivered[static_cast<std::size_t>(rank)][i] += g[i];
      std::vector<float> bias = {static_cast<float>(rank), 1, 2};
      power.allreduce(comm, "b", bias.data(), 1, 3);
      if (rank == 0 && t == 0) {
        std::lock_guard lock(mutex);
        bias_out = bias;
      }
    }
    auto res = power.residual("w");
    residual[static_cast<std::size_t>(rank)].assign(res.begin(), res.end());
    EXPECT_TRUE(power.residual("b").empty());
    return std::vector<float>{};
  });
  EXPECT_EQ(bias_out, (std::vector<float>{1, 1, 2}));  // (0 + 1 + 2) / 3: exact, uncompressed
  for (std::size_t i = 0; i < rows * cols; ++i) {
    double truth = 0, left = 0;
    for (int rank = 0; rank < p; ++rank) {
      for (int t = 0; t < steps; ++t)
        truth += random_vector(rows * cols, static_cast<unsigned>(1000 + 10 * t + rank))[i];
      left += residual[static_cast<std::size_t>(rank)][i];
    }
    for (int rank = 1; rank < p; ++rank) ASSERT_EQ(delivered[rank][i], delivered[0][i]);
    ASSERT_NEAR(delivered[0][i] + left / p, truth / p, 1e-4) << i;
  }
}

TEST(Compression, ParsesAndPrints) {
  for (const char* text :
       {"none", "fp16", "bf16", "qsgd:4", "qsgd:8", "powersgd:2", "topk:0.01", "topk:1", "topk:0.01:40"})
    EXPECT_EQ(tc::Compression::parse(text).to_string(), text);
  EXPECT_EQ(tc::Compression::parse("powersgd:4").rank, 4);
  EXPECT_EQ(tc::Compression::parse("topk:0.25").ratio, 0.25);
  EXPECT_EQ(tc::Compression::parse("topk:0.25").warmup, 0);
  EXPECT_EQ(tc::Compression::parse("topk:0.25:7").warmup, 7);
  EXPECT_EQ(tc::Compression::parse("topk:0.25:0").to_string(), "topk:0.25");
  for (const char* bad : {"", "fp32", "fp16:1", "qsgd", "qsgd:3", "qsgd:x", "powersgd:0", "topk:0", "topk:1.5",
                          "topk:", "none:1", "topk:0.1:", "topk:0.1:-1", "topk:0.1:x", "topk:0.1:2:3"}) {
    try {
      tc::Compression::parse(bad);
      ADD_FAILURE() << "'" << bad << "' accepted";
    } catch (const tutti::Error& e) {
      EXPECT_EQ(e.code(), tutti::ErrorCode::invalid_argument);
      EXPECT_NE(std::string(e.what()).find(bad), std::string::npos) << e.what();
    }
  }
}

// The training-side compressor: every kind gives identical bits on every rank over several steps
// (QSGD and top-k with error feedback); top-k's error feedback delivers, over steps, everything.
TEST(GradientCompressor, IdenticalOnEveryRank) {
  for (const char* text : {"fp16", "bf16", "qsgd:4", "qsgd:8", "powersgd:2", "topk:0.1"})
    for (const int p : {2, 3}) {
      const auto results = run(p, [&](tutti::Communicator& comm, int rank) {
        tc::GradientCompressor compressor(tc::Compression::parse(text), 17);
        std::vector<float> all;
        for (int step = 0; step < 3; ++step) {
          auto w = random_vector(20 * 12, static_cast<unsigned>(rank * 100 + step));
          auto b = random_vector(20, static_cast<unsigned>(rank * 100 + step + 50));
          const std::vector<std::int64_t> ws = {20, 3, 4}, bs = {20};
          compressor.average(comm, "w", w.data(), ws);
          compressor.average(comm, "b", b.data(), bs);
          compressor.next_step();
          all.insert(all.end(), w.begin(), w.end());
          all.insert(all.end(), b.begin(), b.end());
        }
        return all;
      });
      for (int r = 1; r < p; ++r) EXPECT_TRUE(same_bits(results[0], results[static_cast<std::size_t>(r)])) << text;
    }
  EXPECT_THROW(tc::GradientCompressor(tc::Compression{}, 1), tutti::Error);
}

// What each compressor reports it sent for a 20x3x4 matrix (240 elements) and a 20-vector.
TEST(GradientCompressor, ReportsTheBytesItSent) {
  struct Case {
    const char* text;
    std::size_t matrix, vector;
  };
  for (const Case c : {Case{"fp16", 480, 40}, Case{"bf16", 480, 40},
                       Case{"qsgd:8", 4 + 240, 4 + 20},               // one bucket of 512: its norm, a byte each
                       Case{"qsgd:4", 8 * 4 + 120, 4 + 10},           // buckets of 32: 8 norms, a nibble each
                       Case{"topk:0.1", 24 * 9, 2 * 9},               // ceil(0.1 n) u32 and u8, then the union's f32
                       Case{"powersgd:2", (20 + 12) * 2 * 4, 80}}) {  // P and Q; the vector whole
    const auto failures = on_threads(1, [&](int) {
      auto comm = tutti::local_group(1)[0];
      tc::GradientCompressor compressor(tc::Compression::parse(c.text), 1);
      auto w = random_vector(240, 1), b = random_vector(20, 2);
      const std::vector<std::int64_t> ws = {20, 3, 4}, bs = {20};
      EXPECT_EQ(compressor.average(comm, "w", w.data(), ws), c.matrix) << c.text;
      EXPECT_EQ(compressor.average(comm, "b", b.data(), bs), c.vector) << c.text;
    });
    EXPECT_EQ(failures, "");
  }
}

// topk:0.01:4 on 1000 elements: ⌈1000 · 0.01^((t+1)/4)⌉ elements at steps 0..3 (317, 100, 32,
// 10), then 10 a step; without a warm-up, 10 from the first step (one rank: the union is its
// choice, 9 bytes an element).
TEST(GradientCompressor, TopKWarmsUpFromDenseToItsRatio) {
  const auto failures = on_threads(1, [&](int) {
    auto comm = tutti::local_group(1)[0];
    for (const char* text : {"topk:0.01:4", "topk:0.01"}) {
      tc::GradientCompressor compressor(tc::Compression::parse(text), 1);
      const std::vector<std::int64_t> shape = {1000};
      std::vector<std::size_t> pairs;
      for (int step = 0; step < 6; ++step) {
        auto g = random_vector(1000, static_cast<unsigned>(step));
        pairs.push_back(compressor.average(comm, "g", g.data(), shape) / 9);
        compressor.next_step();
      }
      const std::vector<std::size_t> want = std::string(text) == "topk:0.01"
                                                ? std::vector<std::size_t>{10, 10, 10, 10, 10, 10}
                                                : std::vector<std::size_t>{317, 100, 32, 10, 10, 10};
      EXPECT_EQ(pairs, want) << text;
    }
  });
  EXPECT_EQ(failures, "");
}

// QSGD with error feedback over many steps of one constant gradient: the residual stays bounded
// (a codec whose error exceeds the input's norm, 4 bits in buckets of 512, grows it without end)
// and the mean delivered update approaches the gradient.
TEST(GradientCompressor, QsgdErrorFeedbackStaysBounded) {
  for (const char* text : {"qsgd:4", "qsgd:8"}) {
    const auto failures = on_threads(1, [&](int) {
      auto comm = tutti::local_group(1)[0];
      tc::GradientCompressor compressor(tc::Compression::parse(text), 2);
      const auto g = random_vector(2000, 77);
      const std::vector<std::int64_t> shape = {2000};
      std::vector<double> delivered(g.size(), 0.0);
      constexpr int kSteps = 200;
      for (int step = 0; step < kSteps; ++step) {
        auto x = g;
        compressor.average(comm, "v", x.data(), shape);
        compressor.next_step();
        for (std::size_t i = 0; i < x.size(); ++i) delivered[i] += x[i];
      }
      // Everything delivered plus the last residual is kSteps·g; the residual stays below a few
      // times ‖g‖, so the mean error over the steps is small.
      double error = 0, norm = 0;
      for (std::size_t i = 0; i < g.size(); ++i) {
        error += (delivered[i] / kSteps - g[i]) * (delivered[i] / kSteps - g[i]);
        norm += static_cast<double>(g[i]) * g[i];
      }
      EXPECT_LT(std::sqrt(error), 0.05 * std::sqrt(norm)) << text;
    });
    EXPECT_EQ(failures, "");
  }
}

// One rank, a constant gradient g, topk:0.25 over four elements: each step sends the largest
// corrected element; 8 steps of g and then steps of zeros deliver exactly 8·g.
TEST(GradientCompressor, TopKErrorFeedbackSendsEverythingEventually) {
  const auto failures = on_threads(1, [](int) {
    auto comm = tutti::local_group(1)[0];
    tc::GradientCompressor compressor(tc::Compression::parse("topk:0.25"), 1);
    const std::vector<float> g = {4, 3, 2, 1};
    std::vector<float> delivered(4, 0.0f);
    for (int step = 0; step < 8; ++step) {
      auto x = g;
      const std::vector<std::int64_t> shape = {4};
      compressor.average(comm, "v", x.data(), shape);
      int nonzero = 0;
      for (std::size_t i = 0; i < 4; ++i) delivered[i] += x[i], nonzero += x[i] != 0;
      EXPECT_EQ(nonzero, 1) << "step " << step;
    }
    for (std::size_t i = 0; i < 4; ++i) EXPECT_GT(delivered[i], 0.0f) << i;  // every element got its turn
    // Zero gradients then drain the residual, one element a step: everything arrives.
    const std::vector<std::int64_t> shape = {4};
    for (int extra = 0; extra < 4; ++extra) {
      std::vector<float> x(4, 0.0f);
      compressor.average(comm, "v", x.data(), shape);
      for (std::size_t i = 0; i < 4; ++i) delivered[i] += x[i];
    }
    EXPECT_EQ(delivered, (std::vector<float>{32, 24, 16, 8}));
  });
  EXPECT_EQ(failures, "");
}
