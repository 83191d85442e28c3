// Argument checks shared by the device implementations, so that both reject the same calls with
// the same messages before anything is enqueued.
#pragma once

#include <cstddef>
#include <cstdint>

#include "tutti/types.hpp"

namespace tutti::device::detail {

/// A copy from or to pageable host memory goes through pinned blocks of this size (the CUDA
/// device; the strict emulated device models it), one host function each.
inline constexpr std::size_t pageable_chunk_bytes = std::size_t{1} << 20;

/// Error(invalid_argument) unless `flag` is non-null and 4-byte aligned.
void check_flag(const void* flag, const char* function);

/// Error(invalid_argument) for a null pointer with bytes > 0, or overlapping buffers other than
/// dst == src.
void check_copy(const void* dst, const void* src, std::size_t bytes);

/// The bytes `count` elements of `type` take; Error(invalid_argument) for an unknown type or op
/// (op may be null: divide has none), or a size that overflows.
std::size_t checked_bytes(DataType type, const ReduceOp* op, std::size_t count, const char* function);

/// Error(invalid_argument) for a null pointer or one not aligned to `type`'s size.
void check_element_pointer(const void* p, DataType type, const char* what, const char* function);

/// Error(invalid_argument) if [dst, dst + bytes) and [src, src + bytes) overlap without dst == src.
void check_overlap(const void* dst, const void* src, std::size_t bytes, const char* what, const char* function);

}  // namespace tutti::device::detail
