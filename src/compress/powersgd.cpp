// PowerSGD, one matrix at a time, as PyTorch DDP's powerSGD_hook does for each bucket's matrices
// (torch/distributed/algorithms/ddp_comm_hooks/powerSGD_hook.py). The products accumulate in
// double in a fixed order: ranks that hold the same P and Q compute the same bits.
#include <algorithm>
#include <cmath>
#include <limits>
#include <numbers>
#include <string>

#include "compress/random.hpp"
#include "tutti/compress.hpp"

namespace tutti::compress {

namespace {

// out (rows x r) = m (rows x cols) * q (cols x r)
void multiply(const float* m, const float* q, float* out, std::size_t rows, std::size_t cols, std::size_t r) {
  std::vector<double> acc(r);
  for (std::size_t i = 0; i < rows; ++i) {
    std::fill(acc.begin(), acc.end(), 0.0);
    for (std::size_t k = 0; k < cols; ++k) {
      const double x = m[i * cols + k];
      for (std::size_t j = 0; j < r; ++j) acc[j] += x * q[k * r + j];
    }
    for (std::size_t j = 0; j < r; ++j) out[i * r + j] = static_cast<float>(acc[j]);
  }
}

// out (cols x r) = mᵀ (cols x rows) * p (rows x r)
void multiply_transposed(const float* m, const float* p, float* out, std::size_t rows, std::size_t cols,
                         std::size_t r) {
  std::vector<double> acc(cols * r, 0.0);
  for (std::size_t i = 0; i < rows; ++i)
    for (std::size_t k = 0; k < cols; ++k) {
      const double x = m[i * cols + k];
      for (std::size_t j = 0; j < r; ++j) acc[k * r + j] += x * p[i * r + j];
    }
  for (std::size_t n = 0; n < acc.size(); ++n) out[n] = static_cast<float>(acc[n]);
}

// out (rows x cols) = p (rows x r) * qᵀ (r x cols)
void multiply_outer(const float* p, const float* q, float* out, std::size_t rows, std::size_t cols, std::size_t r) {
  for (std::size_t i = 0; i < rows; ++i)
    for (std::size_t k = 0; k < cols; ++k) {
      double acc = 0;
      for (std::size_t j = 0; j < r; ++j) acc += static_cast<double>(p[i * r + j]) * q[k * r + j];
      out[i * cols + k] = static_cast<float>(acc);
    }
}

// Standard normal numbers (Box-Muller) from the counter-based generator.
void fill_normal(float* out, std::size_t n, const RandomKey& key) {
  const detail::CounterRandom random(key);
  for (std::size_t i = 0; i < n; ++i) {
    const double u1 = 1.0 - random(2 * i), u2 = random(2 * i + 1);  // u1 in (0, 1]
    out[i] = static_cast<float>(std::sqrt(-2.0 * std::log(u1)) * std::cos(2 * std::numbers::pi * u2));
  }
}

}  // namespace

void orthogonalize(float* matrix, std::size_t rows, std::size_t cols) {
  for (std::size_t c = 0; c < cols; ++c) {
    double norm = 0;
    for (std::size_t i = 0; i < rows; ++i) norm += static_cast<double>(matrix[i * cols + c]) * matrix[i * cols + c];
    norm = std::sqrt(norm);
    if (norm > 0)
      for (std::size_t i = 0; i < rows; ++i) matrix[i * cols + c] = static_cast<float>(matrix[i * cols + c] / norm);
    for (std::size_t d = c + 1; d < cols; ++d) {
      double dot = 0;
      for (std::size_t i = 0; i < rows; ++i) dot += static_cast<double>(matrix[i * cols + c]) * matrix[i * cols + d];
      for (std::size_t i = 0; i < rows; ++i)
        matrix[i * cols + d] = static_cast<float>(matrix[i * cols + d] - dot * matrix[i * cols + c]);
    }
  }
}

PowerSgd::PowerSgd(int rank, std::uint64_t seed) : rank_(rank), seed_(seed) {
  if (rank < 1)
    throw Error(ErrorCode::invalid_argument, "PowerSgd: rank must be at least 1, not " + std::to_string(rank));
}

std::size_t PowerSgd::allreduce(Communicator& comm, std::string_view name, float* grad, std::size_t rows,
                                std::size_t cols) {
  // rows * cols sizes the residual: a product that wraps around would make it too small.
  if (cols != 0 && rows > std::numeric_limits<std::size_t>::max() / sizeof(float) / cols)
    throw Error(ErrorCode::invalid_argument, "PowerSgd on rank " + std::to_string(comm.rank()) + ": tensor '" +
                                                 std::string(name) + "' of " + std::to_string(rows) + "x" +
                                                 std::to_string(cols) + " elements takes more than 2^64 bytes");
  const std::size_t n = rows * cols;
  if (n > 0 && grad == nullptr)
    throw Error(ErrorCode::invalid_argument,
                "PowerSgd on rank " + std::to_string(comm.rank()) + ": null gradient '" + std::string(name) + "'");
  const std::size_t r = std::min({static_cast<std::size_t>(rank_), rows, cols});
  if (n == 0) return 0;
  if (r * (rows + cols) >= n) {  // vectors, and matrices the factors would not shrink
    comm.allreduce(grad, grad, n, DataType::f32, ReduceOp::avg);
    return n * sizeof(float);
  }
  auto [it, fresh] = states_.try_emplace(std::string(name));
  State& s = it->second;
  if (fresh) {
    s.rows = rows;
    s.cols = cols;
    s.residual.assign(n, 0.0f);
    s.q.resize(cols * r);
    fill_normal(s.q.data(), s.q.size(), RandomKey{seed_, 0, 0, stream_of(name)});
  } else if (s.rows != rows || s.cols != cols) {
    throw Error(ErrorCode::invalid_argument, "PowerSgd on rank " + std::to_string(comm.rank()) + ": tensor '" +
                                                 std::string(name) + "' is " + std::to_string(rows) + "x" +
                                                 std::to_string(cols) + ", earlier " + std::to_string(s.rows) + "x" +
                                                 std::to_string(s.cols));
  }
  // M = grad + residual, kept in the residual's storage until the residual is recomputed.
  std::vector<float>& m = s.residual;
  for (std::size_t i = 0; i < n; ++i) m[i] += grad[i];
  std::vector<float> p(rows * r);
  multiply(m.data(), s.q.data(), p.data(), rows, cols, r);
  comm.allreduce(p.data(), p.data(), p.size(), DataType::f32, ReduceOp::sum);
  orthogonalize(p.data(), rows, r);
  multiply_transposed(m.data(), p.data(), s.q.data(), rows, cols, r);
  comm.allreduce(s.q.data(), s.q.data(), s.q.size(), DataType::f32, ReduceOp::avg);
  multiply_outer(p.data(), s.q.data(), grad, rows, cols, r);
  for (std::size_t i = 0; i < n; ++i) m[i] -= grad[i];
  return (p.size() + s.q.size()) * sizeof(float);
}

std::span<const float> PowerSgd::residual(std::string_view name) const {
  const auto it = states_.find(std::string(name));
  if (it == states_.end()) return {};
  return it->second.residual;
}

}  // namespace tutti::compress
