#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "tutti/compress.hpp"

namespace tutti::compress {

GradientCompressor::GradientCompressor(Compression compression, std::uint64_t seed)
    : compression_(compression), seed_(seed) {
  using Kind = Compression::Kind;
  if (compression_.kind == Kind::none)
    throw Error(ErrorCode::invalid_argument, "GradientCompressor: compression 'none' compresses nothing");
  if (compression_.kind == Kind::topk && !(compression_.ratio > 0 && compression_.ratio <= 1))
    throw Error(ErrorCode::invalid_argument,
                "GradientCompressor: topk ratio " + std::to_string(compression_.ratio) + " is not in (0, 1]");
  qsgd_levels(compression_.kind == Kind::qsgd ? compression_.bits : 8);
  if (compression_.kind == Kind::powersgd) power_ = std::make_unique<PowerSgd>(compression_.rank, seed_);
}

// Error feedback around a lossy allreduce: the gradient plus what earlier steps did not send is
// compressed, and what this step's compression left out is kept for the next one.
template <class Reduce>
void GradientCompressor::with_feedback(std::string_view name, float* grad, std::size_t count, Reduce reduce) {
  corrected_.assign(grad, grad + count);
  feedback_.add_residual(name, corrected_.data(), count);
  sent_.resize(count);
  reduce(corrected_.data(), sent_.data());
  feedback_.set_residual(name, corrected_.data(), sent_.data(), count);
}

std::size_t GradientCompressor::average(Communicator& comm, std::string_view name, float* grad,
                                        std::span<const std::int64_t> shape) {
  std::size_t count = 1;
  for (const auto d : shape) {
    if (d < 0)
      throw Error(ErrorCode::invalid_argument, "GradientCompressor on rank " + std::to_string(comm.rank()) +
                                                   ": tensor '" + std::string(name) + "' has a negative dimension");
    // The product sizes the residual and the staging copies: it must not wrap around.
    if (d != 0 && count > std::numeric_limits<std::size_t>::max() / sizeof(float) / static_cast<std::size_t>(d))
      throw Error(ErrorCode::invalid_argument, "GradientCompressor on rank " + std::to_string(comm.rank()) +
                                                   ": tensor '" + std::string(name) +
                                                   "' has more elements than 2^64 bytes hold");
    count *= static_cast<std::size_t>(d);
  }
  switch (compression_.kind) {
    case Compression::Kind::fp16:
    case Compression::Kind::bf16:
      allreduce(comm, grad, grad, count, compression_.kind == Compression::Kind::fp16 ? Wire::fp16 : Wire::bf16,
                ReduceOp::avg);
      return count * sizeof(std::uint16_t);
    case Compression::Kind::qsgd: {
      // Error feedback converges only with a contractive codec, E‖Q(v) − v‖² < ‖v‖²: the residual
      // is fed back whole, so a larger error grows it from step to step (seen as a NaN loss with
      // 4 bits in buckets of 512). QSGD's bound min(n/s², √n/s) is 0.03 for 8 bits (s = 127) in
      // buckets of 512, but for 4 bits (s = 7) it stays below 1 only for n < 49: buckets of 32
      // (bound 0.65), at the cost of a 4-byte norm per 32 elements.
      const QsgdOptions options{compression_.bits, compression_.bits == 4 ? 32u : 512u};
      const RandomKey key{seed_, 0, step_, stream_of(name)};
      with_feedback(name, grad, count, [&](const float* corrected, float* sent) {
        qsgd_allreduce(comm, corrected, grad, count, options, key, ReduceOp::avg, sent);
      });
      return qsgd_encoded_bytes(count, options);
    }
    case Compression::Kind::topk: {
      const double ratio = step_ < static_cast<std::uint64_t>(compression_.warmup)
                               ? std::pow(compression_.ratio, static_cast<double>(step_ + 1) / compression_.warmup)
                               : compression_.ratio;
      const auto k = std::min(count, std::max<std::size_t>(1, static_cast<std::size_t>(std::ceil(ratio * count))));
      std::size_t united = 0;
      with_feedback(name, grad, count, [&](const float* corrected, float* sent) {
        united = top_k_allreduce(comm, corrected, grad, count, k, ReduceOp::avg, sent);
      });
      // The chosen indices with a byte each, then the values on the union.
      return k * (sizeof(std::uint32_t) + 1) + united * sizeof(float);
    }
    case Compression::Kind::powersgd: {
      // A matrix is its first dimension by the rest, as the hook views a parameter.
      const std::size_t rows = shape.empty() ? 1 : static_cast<std::size_t>(shape[0]);
      return power_->allreduce(comm, name, grad, rows, rows == 0 ? 0 : count / rows);
    }
    default:
      break;
  }
  throw Error(ErrorCode::invalid_argument, "GradientCompressor: nothing to do for " + compression_.to_string());
}

}  // namespace tutti::compress
