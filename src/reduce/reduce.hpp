// Element-wise reduction kernels for every DataType x ReduceOp, vectorized, with runtime
// dispatch to AVX2 / AVX-512 paths where the CPU has them.
#pragma once

#include <cstddef>

#include "tutti/types.hpp"

namespace tutti::reduce {

/// dst[i] = a[i] op b[i] for i < count. `dst` may alias `a` or `b` exactly (not partially).
/// ReduceOp::avg reduces as sum (the division is `divide`'s job, once, at the end).
/// f16 and bf16 are computed in f32 and rounded to nearest even. Integer sum and prod wrap. Float
/// min/max are IEEE 754-2019 minimum/maximum (NaN wins, -0 < +0); a NaN result is `a`'s NaN if
/// `a` is NaN, else `b`'s, quieted (element_ops.hpp). Every instruction set gives the same bits.
/// The buffers may have any alignment (misaligned ones are copied through aligned blocks).
/// Errors: Error(invalid_argument) for an unknown op or type, a null pointer with count > 0, or
/// a partial overlap.
void apply(ReduceOp op, DataType type, void* dst, const void* a, const void* b, std::size_t count);

/// data[i] /= divisor (integers truncate toward zero; f16/bf16 via f32, rounded to nearest even).
/// Error(invalid_argument) if divisor < 1.
void divide(DataType type, void* data, std::size_t count, int divisor);

/// Name of the instruction set `apply` dispatches to on this CPU ("avx512", "avx2" or "generic"),
/// chosen at the first call; TUTTI_REDUCE_ISA forces one (dispatch.hpp).
const char* isa();

}  // namespace tutti::reduce
