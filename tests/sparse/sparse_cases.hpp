// Sparse collective cases shared by sparse_test (ranks as threads) and sparse_program (processes):
// every rank's input is a function of (case, rank), so that every rank can compute the dense
// reference itself and compare its result, byte for byte, against it.
#pragma once

#include <algorithm>
#include <cstring>
#include <numeric>
#include <random>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "harness.hpp"
#include "tutti/sparse.hpp"

namespace tutti::testing::sparse_cases {

using sparse::Algorithm;
using sparse::Form;
using sparse::IndexType;

enum class Pattern { disjoint, identical, overlapping };

struct Case {
  int p = 1;
  std::size_t dim = 37;
  std::size_t nnz = 5;  // per rank (overlapping: minus rank % 3; disjoint: at most its share)
  Pattern pattern = Pattern::overlapping;
  bool duplicates = false;
  bool shuffled = false;
  DataType value_type = DataType::f32;
  IndexType index_type = IndexType::u32;
  ReduceOp op = ReduceOp::sum;
  Algorithm algorithm = Algorithm::automatic;
  Form form = Form::automatic;
};

inline std::string name_of(const Case& c) {
  static const char* patterns[] = {"disjoint", "identical", "overlapping"};
  return "p=" + std::to_string(c.p) + " dim=" + std::to_string(c.dim) + " nnz=" + std::to_string(c.nnz) + " " +
         patterns[static_cast<int>(c.pattern)] + (c.duplicates ? " dup" : "") + (c.shuffled ? " shuffled" : "") + " " +
         std::string(to_string(c.value_type)) + (c.index_type == IndexType::u32 ? " u32 " : " u64 ") +
         std::string(to_string(c.op)) + " " + std::string(to_string(c.algorithm)) + " form " +
         std::string(to_string(c.form));
}

/// One rank's input: the pairs as passed, and the dense vector they stand for.
struct Input {
  std::vector<std::byte> indices, values;
  std::size_t nnz = 0;
  std::vector<double> dense;
  std::set<std::uint64_t> set;
  sparse::Vector vector() const {
    return {.dim = dense.size(),
            .nnz = nnz,
            .indices = indices.data(),
            .index_type = index_type,
            .values = values.data(),
            .value_type = value_type};
  }
  IndexType index_type = IndexType::u32;
  DataType value_type = DataType::f32;
};

inline std::vector<std::uint64_t> index_set(const Case& c, int rank) {
  std::vector<std::uint64_t> all(c.dim);
  std::iota(all.begin(), all.end(), 0);
  if (c.pattern == Pattern::disjoint) {
    std::vector<std::uint64_t> mine;
    for (std::uint64_t i = static_cast<std::uint64_t>(rank); i < c.dim && mine.size() < c.nnz; i += c.p)
      mine.push_back(i);
    return mine;
  }
  std::mt19937_64 random(c.pattern == Pattern::identical ? 1 : 100 + rank);
  std::shuffle(all.begin(), all.end(), random);
  std::size_t n = std::min(c.nnz, c.dim);
  if (c.pattern == Pattern::overlapping) n -= std::min<std::size_t>(n, static_cast<std::size_t>(rank % 3));
  all.resize(n);
  return all;
}

inline double combine(ReduceOp op, double a, double b) {
  switch (op) {
    case ReduceOp::prod:
      return a * b;
    case ReduceOp::min:
      return std::min(a, b);
    case ReduceOp::max:
      return std::max(a, b);
    default:
      return a + b;
  }
}

inline Input input_of(const Case& c, int rank) {
  Input in;
  in.index_type = c.index_type;
  in.value_type = c.value_type;
  in.dense.assign(c.dim, 0.0);
  std::vector<std::pair<std::uint64_t, double>> pairs;
  for (std::uint64_t i : index_set(c, rank)) {
    pairs.emplace_back(i, input_value(c.value_type, c.op, rank, i));
    if (c.duplicates && i % 3 == 0) pairs.emplace_back(i, input_value(c.value_type, c.op, rank + 17, i));
  }
  if (c.shuffled) std::shuffle(pairs.begin(), pairs.end(), std::mt19937_64(7 + rank));
  const std::size_t ci = c.index_type == IndexType::u32 ? 4 : 8, cv = size_of(c.value_type);
  in.nnz = pairs.size();
  in.indices.resize(pairs.size() * ci);
  in.values.resize(pairs.size() * cv);
  for (std::size_t k = 0; k < pairs.size(); ++k) {
    const auto [i, v] = pairs[k];
    if (ci == 4) {
      const auto small = static_cast<std::uint32_t>(i);
      std::memcpy(in.indices.data() + 4 * k, &small, 4);
    } else {
      std::memcpy(in.indices.data() + 8 * k, &i, 8);
    }
    store(c.value_type, in.values.data() + cv * k, v);
    in.dense[i] = in.set.count(i) ? combine(c.op, in.dense[i], v) : v;
    in.set.insert(i);
  }
  return in;
}

/// The dense reference y (as bytes of value_type) and the union of the index sets.
struct Reference {
  std::vector<std::byte> dense;
  std::vector<std::uint64_t> union_indices;
};

inline Reference reference_of(const Case& c) {
  std::vector<double> y(c.dim, 0.0);
  std::set<std::uint64_t> all;
  for (int r = 0; r < c.p; ++r) {
    const Input in = input_of(c, r);
    for (std::size_t i = 0; i < c.dim; ++i) y[i] = r == 0 ? in.dense[i] : combine(c.op, y[i], in.dense[i]);
    all.insert(in.set.begin(), in.set.end());
  }
  Reference ref;
  const std::size_t cv = size_of(c.value_type);
  ref.dense.resize(c.dim * cv);
  for (std::size_t i = 0; i < c.dim; ++i) {
    double v = y[i];
    if (c.op == ReduceOp::avg) {
      if (is_integer(c.value_type))
        v = static_cast<double>(static_cast<long long>(v) / c.p);
      else if (c.value_type != DataType::f64)
        v = static_cast<double>(static_cast<float>(v) / static_cast<float>(c.p));
      else
        v /= c.p;
    }
    store(c.value_type, ref.dense.data() + i * cv, v);
  }
  ref.union_indices.assign(all.begin(), all.end());
  return ref;
}

/// SparCML's rule for the automatic form.
inline bool dense_by_rule(const Case& c, std::size_t union_size) {
  const std::size_t ci = c.index_type == IndexType::u32 ? 4 : 8, cv = size_of(c.value_type);
  return union_size * (ci + cv) >= c.dim * cv;
}

/// "" if `got` is the reference exactly (form, indices, every value's bytes), else what differs.
inline std::string check(const Case& c, const sparse::Result& got, const Reference& ref) {
  const std::size_t ci = c.index_type == IndexType::u32 ? 4 : 8, cv = size_of(c.value_type);
  const bool want_dense =
      c.form == Form::dense || (c.form == Form::automatic && dense_by_rule(c, ref.union_indices.size()));
  if ((got.form == Form::dense) != want_dense)
    return "form " + std::string(to_string(got.form)) + ", want " + (want_dense ? "dense" : "sparse");
  if (got.dim != c.dim || got.value_type != c.value_type || got.index_type != c.index_type) return "wrong shape";
  if (c.algorithm != Algorithm::automatic && got.algorithm != c.algorithm) return "ran another algorithm";
  if (want_dense) {
    if (got.nnz != c.dim || !got.indices.empty() || got.values != ref.dense) return "dense values differ";
    return "";
  }
  if (got.nnz != ref.union_indices.size() || got.indices.size() != got.nnz * ci || got.values.size() != got.nnz * cv)
    return "sparse sizes: nnz " + std::to_string(got.nnz) + ", union " + std::to_string(ref.union_indices.size());
  for (std::size_t k = 0; k < got.nnz; ++k) {
    std::uint64_t i = 0;
    std::memcpy(&i, got.indices.data() + k * ci, ci);  // little-endian
    if (i != ref.union_indices[k]) return "index " + std::to_string(k) + " is " + std::to_string(i);
    if (std::memcmp(got.values.data() + k * cv, ref.dense.data() + i * cv, cv) != 0)
      return "value at index " + std::to_string(i) + " is " +
             std::to_string(load(c.value_type, got.values.data() + k * cv)) + ", want " +
             std::to_string(load(c.value_type, ref.dense.data() + i * cv));
  }
  return "";
}

/// Runs case `c` on this rank of `comm` and checks the result; "" or what failed.
inline std::string run_case(Communicator& comm, const Case& c) {
  const Input in = input_of(c, comm.rank());
  sparse::Options options{.algorithm = c.algorithm, .form = c.form, .timeout = std::chrono::milliseconds(20000)};
  const sparse::Result got = sparse_allreduce(comm, in.vector(), c.op, options);
  const std::string error = check(c, got, reference_of(c));
  return error.empty() ? "" : name_of(c) + ": " + error;
}

inline constexpr Algorithm all_algorithms[] = {Algorithm::automatic,
                                               Algorithm::ssar_recursive_doubling,
                                               Algorithm::ssar_split_allgather,
                                               Algorithm::dsar_split_allgather,
                                               Algorithm::allgather,
                                               Algorithm::dense_allreduce,
                                               Algorithm::hierarchical};

}  // namespace tutti::testing::sparse_cases
