// Which instruction set `reduce::apply` runs on, and calls that name one: for tests, which compare
// every path the CPU supports, and benchmarks. Library code calls reduce.hpp's functions.
//
// The choice is made once, at the first call: the best of avx512 > avx2 > generic that both this
// build and the CPU support. TUTTI_REDUCE_ISA=generic|avx2|avx512 forces one instead (to rule the
// SIMD code in or out of a bug hunt, or to time the fallback); forcing one that the CPU or build
// lacks, or an unknown name, is Error(unsupported / invalid_argument) from every call.
#pragma once

#include <cstddef>

#include "tutti/types.hpp"

namespace tutti::reduce {

enum class Isa { generic, avx2, avx512 };

/// Whether `isa`'s kernels were built and this CPU can run them. `generic` always can.
bool supported(Isa isa);

/// The instruction set `apply` and `divide` dispatch to (see above).
Isa active_isa();

/// "generic", "avx2" or "avx512".
const char* name(Isa isa);

/// reduce::apply and reduce::divide on the kernels of `isa`, with the same checks; `isa` must be
/// supported (Error(unsupported) otherwise).
void apply_with(Isa isa, ReduceOp op, DataType type, void* dst, const void* a, const void* b, std::size_t count);
void divide_with(Isa isa, DataType type, void* data, std::size_t count, int divisor);

}  // namespace tutti::reduce
