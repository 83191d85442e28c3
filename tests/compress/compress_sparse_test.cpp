// compress::qsgd_sparse_allreduce with ranks as threads (local_group): identical bits on every
// rank, equal to a reference decoded from the same encodings, indices exactly the union, exact on
// integers when every bucket holds one value, unbiased and within QSGD's variance over many seeds,
// the dense switch on both sides, and bad input refused on every rank.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <map>
#include <numeric>
#include <random>
#include <stdexcept>
#include <vector>

#include "threads.hpp"
#include "tutti/compress.hpp"

namespace tc = tutti::compress;
namespace ts = tutti::sparse;
using tutti::testing::on_threads;

namespace {

// One rank's input: unsorted, possibly with duplicate indices.
struct Input {
  std::vector<std::uint32_t> indices;
  std::vector<float> values;
  ts::Vector vector(std::size_t dim) const {
    return {dim, indices.size(), indices.data(), ts::IndexType::u32, values.data(), tutti::DataType::f32};
  }
};

// The canonical form as the contract states it: sorted, duplicates summed in input order (f32).
std::map<std::uint32_t, float> canonical(const Input& in) {
  std::map<std::uint32_t, float> out;
  for (std::size_t k = 0; k < in.indices.size(); ++k) {
    auto [it, fresh] = out.try_emplace(in.indices[k], in.values[k]);
    if (!fresh) it->second += in.values[k];
  }
  return out;
}

// Rank r's values as every rank decodes them, laid out densely (zero where r has no index).
std::vector<float> decoded(const Input& in, std::size_t dim, const tc::QsgdOptions& options, tc::RandomKey key,
                           int rank) {
  const auto c = canonical(in);
  std::vector<float> values, out(dim, 0.0f);
  for (const auto& [i, v] : c) values.push_back(v);
  std::vector<std::byte> encoded(tc::qsgd_encoded_bytes(values.size(), options));
  key.rank = static_cast<std::uint32_t>(rank);
  tc::qsgd_encode(values.data(), values.size(), options, key, encoded.data());
  tc::qsgd_decode(encoded.data(), values.size(), options, values.data());
  std::size_t k = 0;
  for (const auto& [i, v] : c) out[i] = values[k++];
  return out;
}

// The decoded vectors summed as a balanced tree in rank order (0+1, 2+3, ..., then likewise).
std::vector<float> tree_sum(std::vector<std::vector<float>> level) {
  while (level.size() > 1) {
    std::vector<std::vector<float>> next;
    for (std::size_t k = 0; k + 1 < level.size(); k += 2) {
      for (std::size_t i = 0; i < level[k].size(); ++i) level[k][i] += level[k + 1][i];
      next.push_back(std::move(level[k]));
    }
    if (level.size() % 2 == 1) next.push_back(std::move(level.back()));
    level = std::move(next);
  }
  return level.front();
}

std::vector<std::uint32_t> union_of(const std::vector<Input>& inputs) {
  std::vector<std::uint32_t> u;
  for (const Input& in : inputs) u.insert(u.end(), in.indices.begin(), in.indices.end());
  std::sort(u.begin(), u.end());
  u.erase(std::unique(u.begin(), u.end()), u.end());
  return u;
}

// Random inputs: about `nnz` draws per rank from [0, dim), so with repeats (duplicates) and
// overlap between ranks; normal values.
std::vector<Input> random_inputs(int p, std::size_t dim, std::size_t nnz, unsigned seed) {
  std::mt19937 gen(seed);
  std::uniform_int_distribution<std::uint32_t> index(0, static_cast<std::uint32_t>(dim - 1));
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<Input> inputs(static_cast<std::size_t>(p));
  for (int r = 0; r < p; ++r)
    for (std::size_t k = 0; k < nnz + static_cast<std::size_t>(r); ++k) {
      inputs[r].indices.push_back(index(gen));
      inputs[r].values.push_back(normal(gen));
    }
  return inputs;
}

std::vector<ts::Result> run(const std::vector<Input>& inputs, std::size_t dim, const tc::QsgdOptions& options,
                            const tc::RandomKey& key, tutti::ReduceOp op = tutti::ReduceOp::sum,
                            ts::Form form = ts::Form::automatic) {
  const int p = static_cast<int>(inputs.size());
  auto comms = tutti::local_group(p);
  std::vector<ts::Result> results(inputs.size());
  const auto failures = on_threads(p, [&](int r) {
    results[r] = tc::qsgd_sparse_allreduce(comms[r], inputs[r].vector(dim), options, key, op, {.form = form});
  });
  EXPECT_EQ(failures, "");
  return results;
}

// Every rank's result equals rank 0's bit for bit, and rank 0's equals `expected` (dense, dim
// values) in the form asked: sparse results hold exactly the union's indices.
void expect_result(const std::vector<ts::Result>& results, const std::vector<Input>& inputs, std::size_t dim,
                   const std::vector<float>& expected, ts::Form form, const std::string& what) {
  const ts::Result& first = results.front();
  for (std::size_t r = 1; r < results.size(); ++r) {
    EXPECT_EQ(results[r].form, first.form) << what << " rank " << r;
    EXPECT_EQ(results[r].indices, first.indices) << what << " rank " << r;
    EXPECT_EQ(results[r].values, first.values) << what << " rank " << r;
  }
  EXPECT_EQ(first.form, form) << what;
  EXPECT_EQ(first.algorithm, ts::Algorithm::allgather) << what;
  const auto values = first.values_as<float>();
  if (form == ts::Form::dense) {
    ASSERT_EQ(first.nnz, dim) << what;
    ASSERT_EQ(values.size(), dim) << what;
    EXPECT_TRUE(first.indices.empty()) << what;
    EXPECT_EQ(std::memcmp(values.data(), expected.data(), dim * sizeof(float)), 0) << what;
    return;
  }
  const auto indices = first.indices_as<std::uint32_t>();
  const auto u = union_of(inputs);
  ASSERT_EQ(first.nnz, u.size()) << what;
  ASSERT_EQ(std::vector<std::uint32_t>(indices.begin(), indices.end()), u) << what;
  ASSERT_EQ(values.size(), u.size()) << what;
  for (std::size_t k = 0; k < u.size(); ++k)
    ASSERT_EQ(std::memcmp(&values[k], &expected[u[k]], sizeof(float)), 0)
        << what << " index " << u[k] << ": " << values[k] << " vs " << expected[u[k]];
}

std::vector<float> reference(const std::vector<Input>& inputs, std::size_t dim, const tc::QsgdOptions& options,
                             const tc::RandomKey& key) {
  std::vector<std::vector<float>> each;
  for (std::size_t r = 0; r < inputs.size(); ++r)
    each.push_back(decoded(inputs[r], dim, options, key, static_cast<int>(r)));
  return tree_sum(std::move(each));
}

}  // namespace

// p = 1..8, 4 and 8 bits, buckets of 7 (several per rank, the last one short), unsorted input
// with duplicates and overlapping ranks: every rank gets the same bits, equal to the reference.
TEST(QsgdSparseAllreduce, IdenticalOnEveryRankAndEqualToReference) {
  const std::size_t dim = 1000;
  for (const int bits : {4, 8})
    for (int p = 1; p <= 8; ++p) {
      const tc::QsgdOptions options{bits, 7};
      const tc::RandomKey key{.seed = 42, .rank = 0, .step = 3, .stream = 9};
      const auto inputs = random_inputs(p, dim, 40, static_cast<unsigned>(p * 10 + bits));
      const auto results = run(inputs, dim, options, key);
      expect_result(results, inputs, dim, reference(inputs, dim, options, key), ts::Form::sparse,
                    "bits " + std::to_string(bits) + " p " + std::to_string(p));
      // A rerun with the same key reproduces the bits; another step draws other coins.
      const auto again = run(inputs, dim, options, key);
      EXPECT_EQ(again[0].values, results[0].values) << "p " << p;
      tc::RandomKey next = key;
      next.step = 4;
      EXPECT_NE(run(inputs, dim, options, next)[0].values, results[0].values) << "p " << p;
    }
}

// One value per bucket is sent exactly (its norm is its magnitude), so integer data sums exactly:
// the result is the exact sum of the canonical inputs, duplicates combined, the union's indices.
TEST(QsgdSparseAllreduce, ExactOnIntegersWithBucketsOfOne) {
  const std::size_t dim = 64;
  for (int p = 1; p <= 8; ++p)
    for (const auto op : {tutti::ReduceOp::sum, tutti::ReduceOp::avg}) {
      std::vector<Input> inputs(static_cast<std::size_t>(p));
      std::vector<float> exact(dim, 0.0f);
      for (int r = 0; r < p; ++r)
        for (std::uint32_t k = 0; k < 12; ++k) {
          const std::uint32_t i = (k * 5 + static_cast<std::uint32_t>(r) * 3) % 20;  // repeats within a rank
          const float v = static_cast<float>(p * (static_cast<int>(k % 7) - 3));     // sums divide by p
          inputs[r].indices.push_back(i);
          inputs[r].values.push_back(v);
          exact[i] += v;
        }
      if (op == tutti::ReduceOp::avg)
        for (float& x : exact) x /= static_cast<float>(p);
      const auto results = run(inputs, dim, {8, 1}, {.seed = 1}, op);
      expect_result(results, inputs, dim, exact, ts::Form::sparse, "p " + std::to_string(p));
    }
}

// SparCML's rule with u32 indices and f32 values: dense iff union nnz * 8 >= dim * 4. A union of
// 49 of 100 stays sparse, one of 50 goes dense; forced forms override it.
TEST(QsgdSparseAllreduce, DenseSwitchOnBothSides) {
  const std::size_t dim = 100;
  for (int p = 1; p <= 5; ++p)
    for (const std::size_t u : {49u, 50u}) {
      std::vector<Input> inputs(static_cast<std::size_t>(p));
      for (std::uint32_t i = 0; i < u; ++i) {  // index i on rank i % p: disjoint, union u
        inputs[i % static_cast<std::uint32_t>(p)].indices.push_back(i);
        inputs[i % static_cast<std::uint32_t>(p)].values.push_back(static_cast<float>(i) - 20.5f);
      }
      const tc::QsgdOptions options{4, 16};
      const tc::RandomKey key{.seed = 5, .step = 1};
      const auto expected = reference(inputs, dim, options, key);
      const std::string what = "p " + std::to_string(p) + " union " + std::to_string(u);
      expect_result(run(inputs, dim, options, key), inputs, dim, expected, u >= 50 ? ts::Form::dense : ts::Form::sparse,
                    what);
      expect_result(run(inputs, dim, options, key, tutti::ReduceOp::sum, ts::Form::dense), inputs, dim, expected,
                    ts::Form::dense, what + " forced dense");
      expect_result(run(inputs, dim, options, key, tutti::ReduceOp::sum, ts::Form::sparse), inputs, dim, expected,
                    ts::Form::sparse, what + " forced sparse");
    }
}

// No pairs anywhere, or on some ranks only.
TEST(QsgdSparseAllreduce, EmptyInputs) {
  const std::size_t dim = 50;
  for (int p = 1; p <= 8; ++p) {
    std::vector<Input> inputs(static_cast<std::size_t>(p));
    expect_result(run(inputs, dim, {8, 4}, {}), inputs, dim, std::vector<float>(dim, 0.0f), ts::Form::sparse,
                  "all empty p " + std::to_string(p));
    inputs[static_cast<std::size_t>(p) / 2].indices = {7, 3, 7};
    inputs[static_cast<std::size_t>(p) / 2].values = {1.5f, -2.0f, 0.25f};
    const auto expected = reference(inputs, dim, {8, 4}, {});
    expect_result(run(inputs, dim, {8, 4}, {}), inputs, dim, expected, ts::Form::sparse,
                  "one rank holds pairs, p " + std::to_string(p));
  }
}

// A dense result no host holds (dim 2^40 of f32: 4 TiB) is refused on every rank with its size,
// before anything is allocated (under ASan a huge malloc aborts: the check must come first).
TEST(QsgdSparseAllreduce, ADenseResultLargerThanMemoryIsRefused) {
  const std::size_t dim = std::size_t{1} << 40;
  const std::vector<std::uint64_t> indices = {5, dim - 1};
  const std::vector<float> values = {1, 2};
  auto comms = tutti::local_group(2);
  std::vector<std::string> errors(2);
  const auto failures = on_threads(2, [&](int r) {
    const ts::Vector v{dim, 2, indices.data(), ts::IndexType::u64, values.data(), tutti::DataType::f32};
    try {
      tc::qsgd_sparse_allreduce(comms[r], v, {8, 512}, {}, tutti::ReduceOp::sum, {.form = ts::Form::dense});
    } catch (const tutti::Error& e) {
      if (e.code() == tutti::ErrorCode::invalid_argument) errors[r] = e.what();
    }
  });
  ASSERT_EQ(failures, "");
  for (const std::string& e : errors) {
    EXPECT_NE(e.find(std::to_string(dim) + " elements"), std::string::npos) << e;
    EXPECT_NE(e.find(std::to_string(dim * 4) + " bytes"), std::string::npos) << e;
  }
}

// u64 indices travel and come back as u64.
TEST(QsgdSparseAllreduce, U64Indices) {
  const std::size_t dim = std::size_t{1} << 40;
  const int p = 3;
  std::vector<std::vector<std::uint64_t>> indices = {{dim - 1, 5}, {5, 1u << 31}, {}};
  std::vector<std::vector<float>> values = {{1, 2}, {3, 4}, {}};
  auto comms = tutti::local_group(p);
  std::vector<ts::Result> results(p);
  const auto failures = on_threads(p, [&](int r) {
    const ts::Vector v{
        dim, indices[r].size(), indices[r].data(), ts::IndexType::u64, values[r].data(), tutti::DataType::f32};
    results[r] = tc::qsgd_sparse_allreduce(comms[r], v, {8, 1}, {});
  });
  ASSERT_EQ(failures, "");
  for (const auto& result : results) {
    ASSERT_EQ(result.form, ts::Form::sparse);
    const auto i = result.indices_as<std::uint64_t>();
    EXPECT_EQ(std::vector<std::uint64_t>(i.begin(), i.end()), (std::vector<std::uint64_t>{5, 1u << 31, dim - 1}));
    const auto v = result.values_as<float>();
    EXPECT_EQ(std::vector<float>(v.begin(), v.end()), (std::vector<float>{5, 4, 1}));
  }
}

// Over 3000 seeds (a fixed base), every index of the result averages to the exact sum within five
// standard errors, and the mean squared error matches the variance QSGD's coins give (each value
// v of a bucket with norm ‖b‖ contributes (‖b‖/s)²·f·(1−f), f the fraction of s|v|/‖b‖), which
// itself is within QSGD's bound min(n/s², √n/s)·‖b‖² per bucket of n values.
TEST(QsgdSparseAllreduce, UnbiasedWithQsgdVariance) {
  const std::size_t dim = 200, trials = 3000;
  const int p = 3;
  const auto inputs = random_inputs(p, dim, 30, 77);
  const auto u = union_of(inputs);
  for (const int bits : {4, 8}) {
    const tc::QsgdOptions options{bits, 8};
    const double s = tc::qsgd_levels(bits);
    std::vector<double> exact(dim, 0.0), expected_error(1, 0.0);
    double bound = 0;
    for (const Input& in : inputs) {
      std::vector<float> v;
      for (const auto& [i, x] : canonical(in)) {
        exact[i] += x;
        v.push_back(x);
      }
      for (std::size_t b = 0; b < v.size(); b += options.bucket_size) {
        const std::size_t e = std::min(v.size(), b + options.bucket_size);
        double sq = 0;
        for (std::size_t k = b; k < e; ++k) sq += double(v[k]) * v[k];
        const double norm = static_cast<float>(std::sqrt(sq));
        for (std::size_t k = b; k < e; ++k) {
          const double r = std::fabs(v[k]) / norm * s, f = r - std::floor(r);
          expected_error[0] += (norm / s) * (norm / s) * f * (1 - f);
        }
        const double n = static_cast<double>(e - b);
        bound += std::min(n / (s * s), std::sqrt(n) / s) * sq;
      }
    }
    std::vector<double> sum(u.size(), 0.0), sum_sq(u.size(), 0.0);
    double squared_error = 0;
    auto comms = tutti::local_group(p);
    const auto failures = on_threads(p, [&](int r) {
      for (std::size_t t = 0; t < trials; ++t) {
        const auto result =
            tc::qsgd_sparse_allreduce(comms[r], inputs[r].vector(dim), options, {.seed = 1000 + t, .step = 2});
        if (r != 0) continue;
        const auto values = result.values_as<float>();
        if (values.size() != u.size()) throw std::runtime_error("the result lost the union's indices");
        for (std::size_t k = 0; k < u.size(); ++k) {
          const double d = values[k] - exact[u[k]];
          sum[k] += values[k];
          sum_sq[k] += d * d;
          squared_error += d * d;
        }
      }
    });
    ASSERT_EQ(failures, "");
    for (std::size_t k = 0; k < u.size(); ++k) {
      const double n = static_cast<double>(trials), mean = sum[k] / n;
      const double variance = sum_sq[k] / n - (mean - exact[u[k]]) * (mean - exact[u[k]]);
      EXPECT_LE(std::fabs(mean - exact[u[k]]), 5 * std::sqrt(variance / n) + 1e-5 * std::fabs(exact[u[k]]))
          << "bits " << bits << " index " << u[k];
    }
    const double measured = squared_error / static_cast<double>(trials);
    EXPECT_LE(expected_error[0], bound) << "bits " << bits;
    EXPECT_NEAR(measured, expected_error[0], 0.1 * expected_error[0]) << "bits " << bits;
    EXPECT_GT(measured, 0) << "bits " << bits;
  }
}

// Each bad input on one rank (or ranks disagreeing) raises the expected code on every rank, naming
// the operation, before anything moves: the same communicator then runs a good call correctly.
TEST(QsgdSparseAllreduce, BadInputRefusedOnEveryRank) {
  using Spoil = std::function<void(int, ts::Vector&, tc::QsgdOptions&, tutti::ReduceOp&, ts::Options&)>;
  const std::uint32_t out_of_range[] = {3, 16, 1};  // nnz 3, as every input here
  const double doubles[] = {1.0, 2.0, 3.0};
  const std::vector<std::pair<Spoil, tutti::ErrorCode>> cases = {
      {[&](int r, auto& v, auto&, auto&, auto&) {
         if (r == 1) v.indices = out_of_range;
       },
       tutti::ErrorCode::invalid_argument},
      {[](int r, auto& v, auto&, auto&, auto&) {
         if (r == 2) v.values = nullptr;
       },
       tutti::ErrorCode::invalid_argument},
      {[&](int r, auto& v, auto&, auto&, auto&) {
         if (r == 0) v.values = doubles, v.value_type = tutti::DataType::f64;
       },
       tutti::ErrorCode::invalid_argument},
      {[](int, auto&, auto&, auto& op, auto&) { op = tutti::ReduceOp::max; }, tutti::ErrorCode::invalid_argument},
      {[](int r, auto&, auto& q, auto&, auto&) {
         if (r == 2) q.bits = 5;
       },
       tutti::ErrorCode::invalid_argument},
      {[](int r, auto&, auto& q, auto&, auto&) {
         if (r == 1) q.bucket_size = 0;
       },
       tutti::ErrorCode::invalid_argument},
      {[](int r, auto&, auto&, auto&, auto& o) {
         if (r == 1) o.algorithm = ts::Algorithm::ssar_split_allgather;
       },
       tutti::ErrorCode::invalid_argument},
      {[](int r, auto&, auto& q, auto&, auto&) {
         if (r == 1) q.bits = 4;
       },
       tutti::ErrorCode::mismatch},
      {[](int r, auto&, auto& q, auto&, auto&) {
         if (r == 2) q.bucket_size = 3;
       },
       tutti::ErrorCode::mismatch},
      {[](int r, auto& v, auto&, auto&, auto&) {
         if (r == 2) v.dim = 17;
       },
       tutti::ErrorCode::mismatch},
      {[](int r, auto&, auto&, auto&, auto& o) {
         if (r == 0) o.form = ts::Form::dense;
       },
       tutti::ErrorCode::mismatch},
  };
  const int p = 3;
  const std::size_t dim = 16;
  auto comms = tutti::local_group(p);
  std::vector<Input> inputs(p);
  for (int r = 0; r < p; ++r) inputs[r] = {{2, 9, static_cast<std::uint32_t>(r)}, {3, -1, 2}};
  for (std::size_t c = 0; c < cases.size(); ++c) {
    std::vector<int> codes(p, -1);
    std::vector<std::string> messages(p);
    const auto failures = on_threads(p, [&](int r) {
      ts::Vector v = inputs[r].vector(dim);
      tc::QsgdOptions q{8, 8};
      tutti::ReduceOp op = tutti::ReduceOp::sum;
      ts::Options o;
      cases[c].first(r, v, q, op, o);
      try {
        tc::qsgd_sparse_allreduce(comms[r], v, q, {}, op, o);
      } catch (const tutti::Error& e) {
        codes[r] = static_cast<int>(e.code());
        messages[r] = e.what();
      }
    });
    ASSERT_EQ(failures, "") << "case " << c;
    for (int r = 0; r < p; ++r) {
      EXPECT_EQ(codes[r], static_cast<int>(cases[c].second)) << "case " << c << " rank " << r << ": " << messages[r];
      EXPECT_NE(messages[r].find("qsgd_sparse_allreduce"), std::string::npos) << messages[r];
    }
    // Buckets of one and integers: the exact sum, so a leftover message would show.
    std::vector<ts::Result> results(p);
    ASSERT_EQ(on_threads(p,
                         [&](int r) {
                           results[r] = tc::qsgd_sparse_allreduce(comms[r], inputs[r].vector(dim), {8, 1}, {});
                         }),
              "")
        << "case " << c;
    std::vector<float> exact(dim, 0.0f);
    for (const Input& in : inputs)
      for (std::size_t k = 0; k < in.indices.size(); ++k) exact[in.indices[k]] += in.values[k];
    expect_result(results, inputs, dim, exact, ts::Form::sparse, "after case " + std::to_string(c));
  }
}
