// The portable kernels, built for the baseline instruction set: what runs on a CPU without AVX2
// (or anywhere with TUTTI_REDUCE_ISA=generic). Vectorized by the compiler (SSE2 on x86-64).
#include "reduce/kernel_table.hpp"
#include "reduce/portable_loops.hpp"

namespace tutti::reduce {
namespace {

// IEEE half through the scalar helpers: branchy, so f16 is not vectorized here; the AVX2 and
// AVX-512 files convert with F16C instead. Only this file may call tutti::detail (see
// element_ops.hpp on linkage).
struct F16Codec {
  static float decode(std::uint16_t h) { return detail::f16_bits_to_float(h); }
  static std::uint16_t encode(float f) { return detail::float_to_f16_bits(f); }
};

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
