// The portable kernels, built for the baseline instruction set: what runs on a CPU without AVX2,
// on other architectures, or anywhere with TUTTI_REDUCE_ISA=generic. Vectorized by the compiler
// (SSE2 on x86-64).
#include "reduce/kernel_table.hpp"
#include "reduce/portable_loops.hpp"

namespace tutti::reduce {
namespace {

constexpr KernelTable make_table() {
  KernelTable table{};
  set_portable_rows(table);
  set_portable_half_row<F16Codec>(table, DataType::f16);
  set_portable_half_row<Bf16Codec>(table, DataType::bf16);
  return table;
}

constexpr KernelTable table = make_table();

}  // namespace

const KernelTable& generic_kernels() { return table; }

}  // namespace tutti::reduce
