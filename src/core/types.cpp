#include "tutti/types.hpp"

namespace tutti {

std::size_t size_of(DataType type) {
  switch (type) {
    case DataType::i8:
    case DataType::u8:
      return 1;
    case DataType::f16:
    case DataType::bf16:
      return 2;
    case DataType::i32:
    case DataType::u32:
    case DataType::f32:
      return 4;
    case DataType::i64:
    case DataType::u64:
    case DataType::f64:
      return 8;
  }
  throw Error(ErrorCode::invalid_argument, "invalid DataType value " + std::to_string(static_cast<int>(type)));
}

std::string_view to_string(DataType type) {
  switch (type) {
    case DataType::i8:
      return "i8";
    case DataType::u8:
      return "u8";
    case DataType::i32:
      return "i32";
    case DataType::u32:
      return "u32";
    case DataType::i64:
      return "i64";
    case DataType::u64:
      return "u64";
    case DataType::f16:
      return "f16";
    case DataType::bf16:
      return "bf16";
    case DataType::f32:
      return "f32";
    case DataType::f64:
      return "f64";
  }
  return "invalid";
}

std::string_view to_string(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum:
      return "sum";
    case ReduceOp::prod:
      return "prod";
    case ReduceOp::min:
      return "min";
    case ReduceOp::max:
      return "max";
    case ReduceOp::avg:
      return "avg";
  }
  return "invalid";
}

std::string_view to_string(Algorithm algorithm) {
  switch (algorithm) {
    case Algorithm::automatic:
      return "automatic";
    case Algorithm::ring:
      return "ring";
    case Algorithm::recursive_doubling:
      return "recursive_doubling";
    case Algorithm::rabenseifner:
      return "rabenseifner";
    case Algorithm::binomial_tree:
      return "binomial_tree";
    case Algorithm::bruck:
      return "bruck";
    case Algorithm::pairwise:
      return "pairwise";
    case Algorithm::linear:
      return "linear";
    case Algorithm::direct:
      return "direct";
    case Algorithm::hierarchical:
      return "hierarchical";
    case Algorithm::mpi:
      return "mpi";
  }
  return "invalid";
}

std::string_view to_string(ErrorCode code) {
  switch (code) {
    case ErrorCode::invalid_argument:
      return "invalid_argument";
    case ErrorCode::mismatch:
      return "mismatch";
    case ErrorCode::timeout:
      return "timeout";
    case ErrorCode::peer_failure:
      return "peer_failure";
    case ErrorCode::aborted:
      return "aborted";
    case ErrorCode::unsupported:
      return "unsupported";
    case ErrorCode::system:
      return "system";
  }
  return "invalid";
}

}  // namespace tutti
