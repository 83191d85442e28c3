// Loops over element_ops.hpp that GCC and Clang auto-vectorize at -O2, for whatever -m flags the
// including kernel file is compiled with; and the table rows they fill.
//
// Two things make -O2 vectorize them (its "very cheap" cost model neither peels, nor versions a
// loop for aliasing, nor vectorizes a loop whose trip count may not be a multiple of the vector):
// - the work is cut into blocks of a constant number of elements, and only then a scalar rest;
// - the pointers are __restrict. `dst` may equal `a` or `b`, so each aliasing case has its own
//   instantiation that reads the aliased operand through `dst` and gets a null pointer for it.
// Check with: g++ -O2 -fopt-info-vec-optimized (every block loop reports "loop vectorized").
// Internal linkage throughout, for the reason given in element_ops.hpp.
#pragma once

#include <cstddef>
#include <cstdint>

#include "reduce/element_ops.hpp"
#include "reduce/kernel_table.hpp"

namespace tutti::reduce {
namespace {

enum class Alias { none, dst_is_a, dst_is_b, all };

// 256 bytes: a few vectors of any width per block; 32 bytes: one 256-bit vector, for the rest.
template <class T>
inline constexpr std::size_t big_block = 256 / sizeof(T);
template <class T>
inline constexpr std::size_t small_block = 32 / sizeof(T);

// Elements [i, n) in blocks of K while they last; returns where it stopped.
template <Alias kAlias, std::size_t K, class T, class Op>
std::size_t binary_blocks(T* __restrict d, const T* __restrict a, const T* __restrict b, std::size_t i, std::size_t n,
                          Op op) {
  constexpr bool a_in_d = kAlias == Alias::dst_is_a || kAlias == Alias::all;
  constexpr bool b_in_d = kAlias == Alias::dst_is_b || kAlias == Alias::all;
  for (; i + K <= n; i += K) {
    for (std::size_t j = 0; j < K; ++j) {
      const T x = a_in_d ? d[i + j] : a[i + j];
      const T y = b_in_d ? d[i + j] : b[i + j];
      d[i + j] = op(x, y);
    }
  }
  return i;
}

template <Alias kAlias, class T, class Op>
void binary_loop(T* d, const T* a, const T* b, std::size_t n, Op op) {
  std::size_t i = binary_blocks<kAlias, big_block<T>>(d, a, b, 0, n, op);
  i = binary_blocks<kAlias, small_block<T>>(d, a, b, i, n, op);
  binary_blocks<kAlias, 1>(d, a, b, i, n, op);
}

template <class T, class Op>
void binary_kernel(void* dst, const void* lhs, const void* rhs, std::size_t n) {
  T* d = static_cast<T*>(dst);
  const T* a = static_cast<const T*>(lhs);
  const T* b = static_cast<const T*>(rhs);
  if (d == a && d == b)
    binary_loop<Alias::all, T, Op>(d, nullptr, nullptr, n, Op{});
  else if (d == a)
    binary_loop<Alias::dst_is_a, T, Op>(d, nullptr, b, n, Op{});
  else if (d == b)
    binary_loop<Alias::dst_is_b, T, Op>(d, a, nullptr, n, Op{});
  else
    binary_loop<Alias::none, T, Op>(d, a, b, n, Op{});
}

template <std::size_t K, class T, class Op>
std::size_t unary_blocks(T* __restrict d, std::size_t i, std::size_t n, Op op) {
  for (; i + K <= n; i += K) {
    for (std::size_t j = 0; j < K; ++j) d[i + j] = op(d[i + j]);
  }
  return i;
}

template <class T, class Op>
void unary_loop(T* d, std::size_t n, Op op) {
  std::size_t i = unary_blocks<big_block<T>>(d, 0, n, op);
  i = unary_blocks<small_block<T>>(d, i, n, op);
  unary_blocks<1>(d, i, n, op);
}

template <class T>
void divide_kernel(void* data, std::size_t n, int divisor) {
  using Divisor = typename DivideBy<T>::Divisor;
  unary_loop(static_cast<T*>(data), n, DivideBy<T>{static_cast<Divisor>(divisor)});
}

template <class Codec>
void divide_halves_kernel(void* data, std::size_t n, int divisor) {
  unary_loop(static_cast<std::uint16_t*>(data), n, DivideHalves<Codec>{static_cast<float>(divisor)});
}

constexpr std::size_t index_of(ReduceOp op) { return static_cast<std::size_t>(op); }
constexpr std::size_t index_of(DataType type) { return static_cast<std::size_t>(type); }

// avg reduces as sum; `divide` finishes it.
constexpr void set_ops(KernelTable& table, DataType type, BinaryKernel sum, BinaryKernel prod, BinaryKernel min,
                       BinaryKernel max) {
  table.apply[index_of(ReduceOp::sum)][index_of(type)] = sum;
  table.apply[index_of(ReduceOp::prod)][index_of(type)] = prod;
  table.apply[index_of(ReduceOp::min)][index_of(type)] = min;
  table.apply[index_of(ReduceOp::max)][index_of(type)] = max;
  table.apply[index_of(ReduceOp::avg)][index_of(type)] = sum;
}

template <class T>
constexpr void set_portable_row(KernelTable& table) {
  constexpr DataType type = data_type_of<T>();
  set_ops(table, type, &binary_kernel<T, SumOp>, &binary_kernel<T, ProdOp>, &binary_kernel<T, MinOp>,
          &binary_kernel<T, MaxOp>);
  table.divide[index_of(type)] = &divide_kernel<T>;
}

// f16 and bf16 rows through `Codec` (each kernel file picks its codecs).
template <class Codec>
constexpr void set_portable_half_row(KernelTable& table, DataType type) {
  using H = std::uint16_t;
  set_ops(table, type, &binary_kernel<H, OnHalves<Codec, SumOp>>, &binary_kernel<H, OnHalves<Codec, ProdOp>>,
          &binary_kernel<H, OnHalves<Codec, MinOp>>, &binary_kernel<H, OnHalves<Codec, MaxOp>>);
  table.divide[index_of(type)] = &divide_halves_kernel<Codec>;
}

// Every type but f16 and bf16.
constexpr void set_portable_rows(KernelTable& table) {
  set_portable_row<std::int8_t>(table);
  set_portable_row<std::uint8_t>(table);
  set_portable_row<std::int32_t>(table);
  set_portable_row<std::uint32_t>(table);
  set_portable_row<std::int64_t>(table);
  set_portable_row<std::uint64_t>(table);
  set_portable_row<float>(table);
  set_portable_row<double>(table);
}

}  // namespace
}  // namespace tutti::reduce
