// Argument checks, and the choice of kernel table (see dispatch.hpp).
#include "reduce/reduce.hpp"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <iterator>
#include <string>

#if defined(TUTTI_REDUCE_X86)
#include <cpuid.h>
#endif

#include "core/copy.hpp"
#include "core/env.hpp"
#include "reduce/dispatch.hpp"
#include "reduce/kernel_table.hpp"

namespace tutti::reduce {
namespace {

constexpr Isa all_isas[] = {Isa::generic, Isa::avx2, Isa::avx512};

#if defined(TUTTI_REDUCE_X86)
// From cpuid itself: clang's __builtin_cpu_supports does not know "f16c". (The AVX2 and AVX-512
// checks below also cover the OS saving the wider registers.)
bool cpu_has_f16c() {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  return __get_cpuid(1, &eax, &ebx, &ecx, &edx) && (ecx & bit_F16C) != 0;
}
#endif

bool cpu_has(Isa isa) {
#if defined(TUTTI_REDUCE_X86)
  __builtin_cpu_init();
  switch (isa) {
    case Isa::generic:
      return true;
    case Isa::avx2:
      return __builtin_cpu_supports("avx2") && cpu_has_f16c();
    case Isa::avx512:
      return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") && cpu_has_f16c();
  }
  return false;
#else
  return isa == Isa::generic;
#endif
}

const KernelTable& kernels(Isa isa) {
  switch (isa) {
#if defined(TUTTI_REDUCE_X86)
    case Isa::avx2:
      return avx2_kernels();
    case Isa::avx512:
      return avx512_kernels();
#endif
    default:
      return generic_kernels();
  }
}

Isa choose_isa() {
  const auto forced = core::env("TUTTI_REDUCE_ISA");
  if (!forced) {
    for (const Isa isa : {Isa::avx512, Isa::avx2})
      if (supported(isa)) return isa;
    return Isa::generic;
  }
  for (const Isa isa : all_isas) {
    if (*forced != name(isa)) continue;
    if (!supported(isa))
      throw Error(ErrorCode::unsupported, "TUTTI_REDUCE_ISA=" + *forced + ": this CPU or build cannot run it");
    return isa;
  }
  throw Error(ErrorCode::invalid_argument, "TUTTI_REDUCE_ISA: expected generic, avx2 or avx512, got '" + *forced + "'");
}

const KernelTable& supported_kernels(Isa isa) {
  if (!supported(isa))
    throw Error(ErrorCode::unsupported, std::string("tutti::reduce: ") + name(isa) + " kernels cannot run here");
  return kernels(isa);
}

std::string describe(const char* function, DataType type, std::size_t count) {
  return std::string("tutti::reduce::") + function + "(" + std::string(to_string(type)) + ", count " +
         std::to_string(count) + ")";
}

void check_type(DataType type, const char* function) {
  if (static_cast<std::size_t>(type) >= type_count)
    throw Error(ErrorCode::invalid_argument, std::string("tutti::reduce::") + function + ": invalid DataType value " +
                                                 std::to_string(static_cast<int>(type)));
}

void check_buffer(const void* p, const char* what, const char* function, DataType type, std::size_t count) {
  if (p == nullptr)
    throw Error(ErrorCode::invalid_argument, describe(function, type, count) + ": " + what + " is null");
}

// Exact aliasing is fine (each element is read before it is written); a partial overlap would
// read elements that an earlier block already overwrote.
void check_overlap(const void* dst, const void* src, const char* what, DataType type, std::size_t count) {
  const auto d = reinterpret_cast<std::uintptr_t>(dst);
  const auto s = reinterpret_cast<std::uintptr_t>(src);
  const std::size_t bytes = count * size_of(type);
  if (d != s && d < s + bytes && s < d + bytes)
    throw Error(ErrorCode::invalid_argument,
                describe("apply", type, count) + ": dst and " + what + " overlap without being equal");
}

// The kernels read and write elements through typed pointers, which must be aligned for the
// type. Buffers are not always: a TCP payload lies at whatever offset of the receive buffer the
// stream put it, and a caller's array may sit at an odd address in a byte buffer. Such calls go
// through aligned copies, a block at a time, into the same kernels (so the same bits).
constexpr std::size_t bounce_bytes = 4096;

bool misaligned(const void* p, DataType type) { return reinterpret_cast<std::uintptr_t>(p) % size_of(type) != 0; }

void apply_misaligned(BinaryKernel kernel, DataType type, void* dst, const void* a, const void* b, std::size_t count) {
  alignas(64) std::byte x[bounce_bytes];
  alignas(64) std::byte y[bounce_bytes];
  const std::size_t element = size_of(type), block = bounce_bytes / element;
  for (std::size_t done = 0; done < count; done += block) {
    const std::size_t n = std::min(block, count - done), offset = done * element, bytes = n * element;
    core::copy(x, static_cast<const std::byte*>(a) + offset, bytes);
    core::copy(y, static_cast<const std::byte*>(b) + offset, bytes);
    kernel(x, x, y, n);
    core::copy(static_cast<std::byte*>(dst) + offset, x, bytes);
  }
}

void divide_misaligned(DivideKernel kernel, DataType type, void* data, std::size_t count, int divisor) {
  alignas(64) std::byte x[bounce_bytes];
  const std::size_t element = size_of(type), block = bounce_bytes / element;
  for (std::size_t done = 0; done < count; done += block) {
    const std::size_t n = std::min(block, count - done), offset = done * element, bytes = n * element;
    core::copy(x, static_cast<const std::byte*>(data) + offset, bytes);
    kernel(x, n, divisor);
    core::copy(static_cast<std::byte*>(data) + offset, x, bytes);
  }
}

void run_apply(const KernelTable& table, ReduceOp op, DataType type, void* dst, const void* a, const void* b,
               std::size_t count) {
  check_type(type, "apply");
  if (static_cast<std::size_t>(op) >= op_count)
    throw Error(ErrorCode::invalid_argument,
                "tutti::reduce::apply: invalid ReduceOp value " + std::to_string(static_cast<int>(op)));
  if (count == 0) return;
  check_buffer(dst, "dst", "apply", type, count);
  check_buffer(a, "a", "apply", type, count);
  check_buffer(b, "b", "apply", type, count);
  check_overlap(dst, a, "a", type, count);
  check_overlap(dst, b, "b", type, count);
  const BinaryKernel kernel = table.apply[static_cast<std::size_t>(op)][static_cast<std::size_t>(type)];
  if (misaligned(dst, type) || misaligned(a, type) || misaligned(b, type))
    apply_misaligned(kernel, type, dst, a, b, count);
  else
    kernel(dst, a, b, count);
}

void run_divide(const KernelTable& table, DataType type, void* data, std::size_t count, int divisor) {
  check_type(type, "divide");
  if (divisor < 1)
    throw Error(ErrorCode::invalid_argument,
                describe("divide", type, count) + ": divisor must be at least 1, got " + std::to_string(divisor));
  if (count == 0) return;
  check_buffer(data, "data", "divide", type, count);
  const DivideKernel kernel = table.divide[static_cast<std::size_t>(type)];
  if (misaligned(data, type))
    divide_misaligned(kernel, type, data, count, divisor);
  else
    kernel(data, count, divisor);
}

const KernelTable& active_kernels() {
  static const KernelTable& table = kernels(active_isa());
  return table;
}

}  // namespace

bool supported(Isa isa) {
  static const bool has[] = {cpu_has(Isa::generic), cpu_has(Isa::avx2), cpu_has(Isa::avx512)};
  const auto index = static_cast<std::size_t>(isa);
  return index < std::size(has) && has[index];
}

Isa active_isa() {
  static const Isa isa = choose_isa();
  return isa;
}

const char* name(Isa isa) {
  switch (isa) {
    case Isa::generic:
      return "generic";
    case Isa::avx2:
      return "avx2";
    case Isa::avx512:
      return "avx512";
  }
  return "unknown";
}

const char* isa() { return name(active_isa()); }

void apply(ReduceOp op, DataType type, void* dst, const void* a, const void* b, std::size_t count) {
  run_apply(active_kernels(), op, type, dst, a, b, count);
}

void divide(DataType type, void* data, std::size_t count, int divisor) {
  run_divide(active_kernels(), type, data, count, divisor);
}

void apply_with(Isa isa, ReduceOp op, DataType type, void* dst, const void* a, const void* b, std::size_t count) {
  run_apply(supported_kernels(isa), op, type, dst, a, b, count);
}

void divide_with(Isa isa, DataType type, void* data, std::size_t count, int divisor) {
  run_divide(supported_kernels(isa), type, data, count, divisor);
}

}  // namespace tutti::reduce
