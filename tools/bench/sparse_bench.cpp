// Each rank draws its indices independently: index i is in rank r's set with probability D (a
// hash of (i, r, D) decides), so the expected overlap between ranks is that of independent sets,
// the overlap the sparse cost model assumes. Values are small integers (1 + (i + r) mod 3), so
// every algorithm's result and the dense allreduce must agree bit for bit.
// With --values qsgd:BITS an f32 sum or avg gets one more row, compress::qsgd_sparse_allreduce,
// which does not give the exact sum: it is checked against every rank's input (rebuilt from its
// rank) encoded with that rank's key, decoded and summed as the call sums them.
#include "bench/sparse_bench.hpp"

#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "bench/cases.hpp"
#include "bench/runner.hpp"
#include "tutti/compress.hpp"
#include "tutti/sparse.hpp"

namespace tutti::bench {

namespace {

using sparse::Algorithm;

constexpr Algorithm algorithms[] = {Algorithm::automatic,
                                    Algorithm::ssar_recursive_doubling,
                                    Algorithm::ssar_split_allgather,
                                    Algorithm::dsar_split_allgather,
                                    Algorithm::allgather,
                                    Algorithm::dense_allreduce,
                                    Algorithm::hierarchical};

std::uint64_t mix(std::uint64_t x) {  // splitmix64's finalizer
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

struct Input {
  std::vector<std::uint32_t> indices;
  std::vector<std::byte> values;  // nnz values
  std::vector<std::byte> dense;   // the same as dim values
};

Input make_input(int rank, std::size_t dim, double density, DataType type) {
  Input in;
  const std::size_t cv = size_of(type);
  in.dense.assign(dim * cv, std::byte{0});
  const auto limit = static_cast<std::uint64_t>(density * 18446744073709551615.0);
  const std::uint64_t seed =
      mix(static_cast<std::uint64_t>(rank) * 0x9e3779b97f4a7c15ull + std::bit_cast<std::uint64_t>(density));
  std::vector<std::byte> one(cv);
  for (std::size_t i = 0; i < dim; ++i) {
    if (density < 1 && mix(seed ^ i) >= limit) continue;
    in.indices.push_back(static_cast<std::uint32_t>(i));
    const double v = 1 + static_cast<double>((i + static_cast<std::size_t>(rank)) % 3);
    store(type, one.data(), v);
    in.values.insert(in.values.end(), one.begin(), one.end());
    std::memcpy(in.dense.data() + i * cv, one.data(), cv);
  }
  return in;
}

// Elements of `got` (expanded to dense) that differ from `want`, summed over ranks.
std::uint64_t wrong_of(Communicator& world, const sparse::Result& got, const std::vector<std::byte>& want) {
  std::uint64_t wrong = 0;
  const std::size_t cv = size_of(got.value_type);
  if (got.form == sparse::Form::dense) {
    for (std::size_t i = 0; i < got.dim; ++i)
      wrong += std::memcmp(got.values.data() + i * cv, want.data() + i * cv, cv) != 0;
  } else {
    std::vector<std::byte> dense(want.size(), std::byte{0});
    const auto indices = got.indices_as<std::uint32_t>();
    for (std::size_t k = 0; k < got.nnz; ++k)
      std::memcpy(dense.data() + indices[k] * cv, got.values.data() + k * cv, cv);
    for (std::size_t i = 0; i < got.dim; ++i)
      wrong += std::memcmp(dense.data() + i * cv, want.data() + i * cv, cv) != 0;
  }
  world.allreduce(std::span<std::uint64_t>(&wrong, 1), ReduceOp::sum);
  return wrong;
}

struct Row {
  double density;
  std::size_t nnz, union_size;
  DataType type;
  ReduceOp op;
};

void print_row(const Row& row, std::uint64_t nnz, const sparse::Result& result, const std::string& name, double t,
               double dense_time, std::uint64_t wrong) {
  std::printf("%9.4f %10llu %10zu %5s %4s  %-40s %6s %12.1f %12.1f %9.2f %7llu\n", row.density,
              static_cast<unsigned long long>(nnz), result.form == sparse::Form::dense ? result.dim : result.nnz,
              std::string(tutti::to_string(row.type)).c_str(), std::string(tutti::to_string(row.op)).c_str(),
              name.c_str(), std::string(tutti::to_string(result.form)).c_str(), t * 1e6, dense_time * 1e6,
              dense_time / t, static_cast<unsigned long long>(wrong));
}

// What qsgd_sparse_allreduce must return on every rank, densely: each rank's values encoded with
// its key, decoded, summed as a balanced tree in rank order (as the call sums them), avg divided
// by p with the reduce layer's kernel (as the call divides).
std::vector<std::byte> qsgd_reference(int p, std::size_t dim, const Row& row, const compress::QsgdOptions& q,
                                      compress::RandomKey key) {
  std::vector<std::vector<float>> level;
  for (int r = 0; r < p; ++r) {
    const Input in = make_input(r, dim, row.density, DataType::f32);
    std::vector<float> values(in.indices.size()), dense(dim, 0.0f);
    if (!values.empty()) std::memcpy(values.data(), in.values.data(), in.values.size());
    std::vector<std::byte> encoded(compress::qsgd_encoded_bytes(values.size(), q));
    key.rank = static_cast<std::uint32_t>(r);
    compress::qsgd_encode(values.data(), values.size(), q, key, encoded.data());
    compress::qsgd_decode(encoded.data(), values.size(), q, values.data());
    for (std::size_t k = 0; k < values.size(); ++k) dense[in.indices[k]] = values[k];
    level.push_back(std::move(dense));
  }
  while (level.size() > 1) {
    std::vector<std::vector<float>> next;
    for (std::size_t k = 0; k + 1 < level.size(); k += 2) {
      for (std::size_t i = 0; i < dim; ++i) level[k][i] += level[k + 1][i];
      next.push_back(std::move(level[k]));
    }
    if (level.size() % 2 == 1) next.push_back(std::move(level.back()));
    level = std::move(next);
  }
  if (row.op == ReduceOp::avg)
    for (float& x : level.front()) x /= static_cast<float>(p);  // as the library divides: IEEE, once
  std::vector<std::byte> out(dim * sizeof(float));
  std::memcpy(out.data(), level.front().data(), out.size());
  return out;
}

// The QSGD row (buckets of 512, a fixed key); returns its #wrong.
std::uint64_t run_qsgd(Communicator& world, const BenchOptions& options, const Row& row, const sparse::Vector& vector,
                       std::uint64_t nnz, double dense_time) {
  const compress::QsgdOptions q{options.sparse_qsgd_bits, 512};
  const compress::RandomKey key{.seed = 1, .step = 0};
  sparse::Result result;
  const auto call = [&] { result = compress::qsgd_sparse_allreduce(world, vector, q, key, row.op); };
  call();
  const std::uint64_t wrong =
      options.check ? wrong_of(world, result, qsgd_reference(world.size(), options.sparse_dim, row, q, key)) : 0;
  const int iterations = choose_iterations(world, call, options.iterations);
  const double t = time_op(world, call, options.warmup, iterations);
  if (world.rank() == 0)
    print_row(row, nnz, result, "qsgd:" + std::to_string(q.bits) + "(allgather)", t, dense_time, wrong);
  return wrong;
}

void run_density(Communicator& world, const BenchOptions& options, const Row& row_in, std::size_t& total_wrong) {
  Row row = row_in;
  const std::size_t dim = options.sparse_dim;
  const Input in = make_input(world.rank(), dim, row.density, row.type);
  const sparse::Vector vector{.dim = dim,
                              .nnz = in.indices.size(),
                              .indices = in.indices.data(),
                              .index_type = sparse::IndexType::u32,
                              .values = in.values.data(),
                              .value_type = row.type};
  std::vector<std::byte> dense_out(in.dense.size());
  const auto dense_call = [&] { world.allreduce(in.dense.data(), dense_out.data(), dim, row.type, row.op); };
  dense_call();
  const std::vector<std::byte> want = dense_out;
  auto nnz = static_cast<std::uint64_t>(in.indices.size());
  world.allreduce(std::span<std::uint64_t>(&nnz, 1), ReduceOp::max);
  // Every algorithm once, checked; then all of them and the dense allreduce timed alternately
  // (time_alternating), so that none is always the one measured after the dense allreduce has
  // emptied a shaped link's token bucket.
  const std::size_t n = std::size(algorithms);
  std::vector<sparse::Result> results(n);
  std::vector<std::uint64_t> wrong(n, 0);
  std::vector<std::function<void()>> calls;
  std::vector<int> iterations;
  for (std::size_t k = 0; k < n; ++k) {
    const sparse::Options sparse_options{.algorithm = algorithms[k]};
    // Each call hands the previous result back (what a training loop does with its gradient
    // buffer); the dense allreduce reuses its buffers likewise.
    calls.push_back([&, sparse_options, k] {
      results[k] = sparse_allreduce(world, vector, row.op, sparse_options, std::move(results[k]));
    });
    calls.back()();
    wrong[k] = options.check ? wrong_of(world, results[k], want) : 0;
    total_wrong += wrong[k];
    iterations.push_back(choose_iterations(world, calls.back(), options.iterations));
  }
  // What a caller without sparse collectives does with its pairs: its vector of dim values
  // zeroed, the pairs stored into it, the dense allreduce in place (the vector reused from call
  // to call, as the sparse rows reuse their results).
  sparse::Result densified;
  densified.form = sparse::Form::dense;
  densified.dim = dim;
  densified.value_type = row.type;
  const std::size_t cv = size_of(row.type);
  calls.push_back([&] {
    std::vector<std::byte>& values = densified.values;
    values.assign(dim * cv, std::byte{0});
    for (std::size_t k = 0; k < in.indices.size(); ++k)
      std::memcpy(values.data() + static_cast<std::size_t>(in.indices[k]) * cv, in.values.data() + k * cv, cv);
    world.allreduce(values.data(), values.data(), dim, row.type, row.op);
  });
  calls.back()();
  densified.nnz = dim;
  const std::uint64_t densified_wrong = options.check ? wrong_of(world, densified, want) : 0;
  total_wrong += densified_wrong;
  iterations.push_back(choose_iterations(world, calls.back(), options.iterations));
  calls.push_back(dense_call);
  iterations.push_back(choose_iterations(world, dense_call, options.iterations));
  const std::vector<double> times = time_alternating(world, calls, options.warmup, iterations);
  const double dense_time = times.back();
  for (std::size_t k = 0; k < n && world.rank() == 0; ++k) {
    const std::string name = algorithms[k] == Algorithm::automatic
                                 ? "automatic(" + std::string(tutti::to_string(results[k].algorithm)) + ")"
                                 : std::string(tutti::to_string(algorithms[k]));
    print_row(row, nnz, results[k], name, times[k], dense_time, wrong[k]);
  }
  if (world.rank() == 0) print_row(row, nnz, densified, "densify+allreduce", times[n], dense_time, densified_wrong);
  if (options.sparse_qsgd_bits != 0 && row.type == DataType::f32 &&
      (row.op == ReduceOp::sum || row.op == ReduceOp::avg))
    total_wrong += run_qsgd(world, options, row, vector, nnz, dense_time);
}

}  // namespace

int run_sparse(Communicator& world, const BenchOptions& options) {
  if (world.rank() == 0) {
    std::printf(
        "# tutti-bench: sparse_allreduce, %d ranks over %s; dim %zu, u32 indices, each rank's index set drawn "
        "independently (index in the set with probability = density); %s\n",
        world.size(), std::string(world.transport_name()).c_str(), options.sparse_dim, options.command_line.c_str());
    std::printf(
        "# time(us): max over ranks of the mean per call, every row's calls and the dense allreduce's alternating, "
        "each from a barrier; dense(us): allreduce of the dim values; speedup = dense / time; union: the result's "
        "nnz (dim when dense); every sparse row hands its previous result back (sparse_allreduce's recycled); "
        "densify+allreduce: the pairs stored into a zeroed vector (reused), then the dense allreduce\n");
    std::printf("#  density   max nnz      union  type   op  %-40s %6s %12s %12s %9s %7s\n", "algorithm", "form",
                "time(us)", "dense(us)", "speedup", "#wrong");
  }
  std::size_t wrong = 0;
  for (DataType type : options.types)
    for (ReduceOp op : options.ops)
      for (double density : options.densities) run_density(world, options, {density, 0, 0, type, op}, wrong);
  if (world.rank() == 0) std::printf("# Out of bounds values : %zu %s\n", wrong, wrong == 0 ? "OK" : "ERROR");
  return wrong == 0 ? 0 : 1;
}

}  // namespace tutti::bench
