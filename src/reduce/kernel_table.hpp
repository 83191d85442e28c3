// One instruction set's kernels for every (op, type): what reduce.cpp dispatches through.
// Each kernel file (kernels_generic.cpp, kernels_avx2.cpp, kernels_avx512.cpp) builds one table.
#pragma once

#include <cstddef>

#include "tutti/types.hpp"

namespace tutti::reduce {

/// dst[i] = a[i] op b[i]; pointers are valid for `count` elements, dst == a or dst == b allowed.
using BinaryKernel = void (*)(void* dst, const void* a, const void* b, std::size_t count);
/// data[i] /= divisor, divisor >= 1.
using DivideKernel = void (*)(void* data, std::size_t count, int divisor);

inline constexpr std::size_t op_count = static_cast<std::size_t>(ReduceOp::avg) + 1;
inline constexpr std::size_t type_count = static_cast<std::size_t>(DataType::f64) + 1;

struct KernelTable {
  BinaryKernel apply[op_count][type_count];
  DivideKernel divide[type_count];
};

const KernelTable& generic_kernels();
#if defined(TUTTI_REDUCE_X86)
const KernelTable& avx2_kernels();    // needs AVX2 and F16C
const KernelTable& avx512_kernels();  // needs AVX-512 F, BW, VL, DQ and F16C
#endif

}  // namespace tutti::reduce
