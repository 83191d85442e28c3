// Element-wise reduction kernels for every DataType x ReduceOp, vectorized, with runtime
// dispatch to AVX2 / AVX-512 paths where the CPU has them.
#pragma once

#include <cstddef>

#include "tutti/types.hpp"

namespace tutti::reduce {

/// dst[i] = a[i] op b[i] for i < count. `dst` may alias `a` or `b` exactly (not partially).
/// ReduceOp::avg reduces as sum (the division is `divide`'s job, once, at the end).
/// f16 and bf16 are computed in f32 and rounded to nearest even.
void apply(ReduceOp op, DataType type, void* dst, const void* a, const void* b, std::size_t count);

/// data[i] /= divisor (integers truncate toward zero; f16/bf16 via f32, rounded to nearest even).
void divide(DataType type, void* data, std::size_t count, int divisor);

/// Name of the instruction set `apply` dispatches to on this CPU ("avx512", "avx2" or "generic").
const char* isa();

}  // namespace tutti::reduce
