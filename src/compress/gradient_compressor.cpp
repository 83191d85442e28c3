#include <string>

#include "tutti/compress.hpp"

namespace tutti::compress {

GradientCompressor::GradientCompressor(Compression compression, std::uint64_t seed)
    : compression_(compression), seed_(seed) {
  using Kind = Compression::Kind;
  if (compression_.kind == Kind::none)
    throw Error(ErrorCode::invalid_argument, "GradientCompressor: compression 'none' compresses nothing");
  if (compression_.kind == Kind::topk)
    throw Error(ErrorCode::unsupported, "GradientCompressor: " + compression_.to_string() +
                                            " needs a sparse allreduce, which this build does not have");
  qsgd_levels(compression_.kind == Kind::qsgd ? compression_.bits : 8);
  if (compression_.kind == Kind::powersgd) power_ = std::make_unique<PowerSgd>(compression_.rank, seed_);
}

void GradientCompressor::average(Communicator& comm, std::string_view name, float* grad,
                                 std::span<const std::int64_t> shape) {
  std::size_t count = 1;
  for (const auto d : shape) {
    if (d < 0)
      throw Error(ErrorCode::invalid_argument, "GradientCompressor on rank " + std::to_string(comm.rank()) +
                                                   ": tensor '" + std::string(name) + "' has a negative dimension");
    count *= static_cast<std::size_t>(d);
  }
  switch (compression_.kind) {
    case Compression::Kind::fp16:
    case Compression::Kind::bf16:
      allreduce(comm, grad, grad, count, compression_.kind == Compression::Kind::fp16 ? Wire::fp16 : Wire::bf16,
                ReduceOp::avg);
      return;
    case Compression::Kind::qsgd: {
      // Error feedback: the gradient plus what earlier steps did not send is quantized, and what
      // this step's quantization lost is kept for the next one.
      corrected_.assign(grad, grad + count);
      feedback_.add_residual(name, corrected_.data(), count);
      sent_.resize(count);
      const RandomKey key{seed_, 0, step_, stream_of(name)};
      qsgd_allreduce(comm, corrected_.data(), grad, count, QsgdOptions{compression_.bits, 512}, key, ReduceOp::avg,
                     sent_.data());
      feedback_.set_residual(name, corrected_.data(), sent_.data(), count);
      return;
    }
    case Compression::Kind::powersgd: {
      // A matrix is its first dimension by the rest, as the hook views a parameter.
      const std::size_t rows = shape.empty() ? 1 : static_cast<std::size_t>(shape[0]);
      power_->allreduce(comm, name, grad, rows, rows == 0 ? 0 : count / rows);
      return;
    }
    default:
      break;
  }
  throw Error(ErrorCode::invalid_argument, "GradientCompressor: nothing to do for " + compression_.to_string());
}

}  // namespace tutti::compress
