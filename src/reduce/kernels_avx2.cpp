// AVX2 kernels: the portable loops compiled with -mavx2 -mf16c (see CMakeLists.txt), and f16 and
// bf16 from half_avx2.hpp. reduce.cpp calls this table only on a CPU with AVX2 and F16C.
#if defined(TUTTI_REDUCE_X86)

#include "reduce/half_avx2.hpp"
#include "reduce/kernel_table.hpp"
#include "reduce/portable_loops.hpp"

namespace tutti::reduce {
namespace {

constexpr KernelTable make_table() {
  KernelTable table{};
  set_portable_rows(table);
  avx2::set_half_row<avx2::F16x16>(table, DataType::f16);
  avx2::set_half_row<avx2::Bf16x16>(table, DataType::bf16);
  return table;
}

constexpr KernelTable table = make_table();

}  // namespace

const KernelTable& avx2_kernels() { return table; }

}  // namespace tutti::reduce

#endif  // TUTTI_REDUCE_X86
