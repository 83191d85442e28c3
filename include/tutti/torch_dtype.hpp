// libtorch glue: the Tutti DataType of a tensor (and, by name, the FNV-1a hash of <tutti/types.hpp>).
// Part of <tutti/torch.hpp>. Inline, unlike the rest of Tutti::torch: the Python modules use these
// two without linking the compiled library (they load one libtutti of their own).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include <torch/types.h>

#include "tutti/tutti.hpp"

namespace tutti::libtorch {

namespace detail {

// The ranks' FNV-1a (<tutti/types.hpp>), by the names the torch glue has always used.
using tutti::detail::fnv1a;
using tutti::detail::fnv1a_offset;

}  // namespace detail

/// The Tutti type of a tensor's elements: float32/64, float16, bfloat16, int8, uint8, int32,
/// int64. Any other type (bool, complex, …) or an undefined tensor is an
/// Error(invalid_argument) naming the type.
inline DataType dtype_of(const torch::Tensor& tensor) {
  if (!tensor.defined()) throw Error(ErrorCode::invalid_argument, "tutti::libtorch::dtype_of: the tensor is undefined");
  switch (tensor.scalar_type()) {
    case torch::kFloat:
      return DataType::f32;
    case torch::kDouble:
      return DataType::f64;
    case torch::kHalf:
      return DataType::f16;
    case torch::kBFloat16:
      return DataType::bf16;
    case torch::kChar:
      return DataType::i8;
    case torch::kByte:
      return DataType::u8;
    case torch::kInt:
      return DataType::i32;
    case torch::kLong:
      return DataType::i64;
    default:
      throw Error(ErrorCode::invalid_argument,
                  std::string("tutti::libtorch::dtype_of: tensor type ") + c10::toString(tensor.scalar_type()) +
                      " has no Tutti DataType (supported: Float, Double, Half, BFloat16, Char, Byte, Int, Long)");
  }
}

}  // namespace tutti::libtorch
