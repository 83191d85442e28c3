// libtorch glue: the Tutti DataType of a tensor.
// Part of <tutti/torch.hpp>, which users include: header-only, CPU tensors only. Inside namespace
// tutti, `torch::` means tutti::torch: write `::torch::` there.
#pragma once

#include <string>

#include <torch/types.h>

#include "tutti/tutti.hpp"

namespace tutti::torch {

/// The Tutti type of a tensor's elements: float32/64, float16, bfloat16, int8, uint8, int32,
/// int64. Any other type (bool, complex, …) or an undefined tensor is an
/// Error(invalid_argument) naming the type.
inline DataType dtype_of(const ::torch::Tensor& tensor) {
  if (!tensor.defined()) throw Error(ErrorCode::invalid_argument, "tutti::torch::dtype_of: the tensor is undefined");
  switch (tensor.scalar_type()) {
    case ::torch::kFloat:
      return DataType::f32;
    case ::torch::kDouble:
      return DataType::f64;
    case ::torch::kHalf:
      return DataType::f16;
    case ::torch::kBFloat16:
      return DataType::bf16;
    case ::torch::kChar:
      return DataType::i8;
    case ::torch::kByte:
      return DataType::u8;
    case ::torch::kInt:
      return DataType::i32;
    case ::torch::kLong:
      return DataType::i64;
    default:
      throw Error(ErrorCode::invalid_argument,
                  std::string("tutti::torch::dtype_of: tensor type ") + c10::toString(tensor.scalar_type()) +
                      " has no Tutti DataType (supported: Float, Double, Half, BFloat16, Char, Byte, Int, Long)");
  }
}

}  // namespace tutti::torch
