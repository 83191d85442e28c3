// What the out-of-core layers and optimizer share (src/libtorch/offload.cpp, offload_sgd.cpp):
// the check that a pool's memory is host-addressable, and CPU tensors over its blocks.
#pragma once

#include <ATen/ATen.h>

#include "tutti/offload.hpp"

namespace tutti::libtorch::detail {

/// Error(unsupported), naming `who`, if `pool`'s device memory is not host-addressable: libtorch
/// computes on the CPU over the blocks.
void require_host_addressable(const offload::Pool& pool, const char* who);

/// A CPU tensor of `sizes` and `type` over `data` (which it does not own).
inline at::Tensor view_of(void* data, at::IntArrayRef sizes, at::ScalarType type) {
  return at::from_blob(data, sizes, at::TensorOptions().dtype(type));
}

}  // namespace tutti::libtorch::detail
