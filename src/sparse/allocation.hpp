// Checks before the sparse layer allocates by a size the caller chose: `dim` reaches the dense
// vector (dim values) and the presence bitmaps (dim bits per rank) without any memory of the
// caller's behind it, so a dim of 2^40 would otherwise end in std::bad_alloc (or, under ASan, an
// abort: a huge malloc is fatal there unless allocator_may_return_null is set).
#pragma once

#include <cstddef>
#include <string_view>

namespace tutti::sparse::detail {

/// The bytes a single allocation may take on this host: its RAM plus swap (the most the kernel's
/// default overcommit heuristic grants); SIZE_MAX where the host does not say.
std::size_t allocation_limit();

/// Error(invalid_argument) "OPERATION (rank R): WHAT (COUNT elements of E bytes: BYTES bytes)
/// exceeds this host's memory ..." when `count` elements of `element_bytes` bytes each exceed
/// allocation_limit() (or size_t).
void check_allocation(std::size_t count, std::size_t element_bytes, std::string_view what, std::string_view operation,
                      int rank);

}  // namespace tutti::sparse::detail
