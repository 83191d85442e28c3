// The sparse layer's working representation of a (partial) result: sorted unique indices with
// their values, or a dense vector of every value. The algorithms only merge, cut and ship these.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "tutti/sparse.hpp"

namespace tutti::sparse::detail {

/// What every rank agreed on: the vector's shape and element sizes.
struct Layout {
  std::size_t dim = 0;
  IndexType index_type = IndexType::u32;
  DataType value_type = DataType::f32;
  std::size_t index_bytes = 4;  // c_i
  std::size_t value_bytes = 4;  // c_v
  std::size_t pair_bytes() const { return index_bytes + value_bytes; }
  /// SparCML's switch: nnz pairs take at least as many bytes as dim values.
  bool dense_is_smaller(std::size_t nnz) const;
};

Layout layout_of(std::size_t dim, IndexType index_type, DataType value_type);

/// Whether the result is dense whatever the ranks' overlap: the form is dense, or it is automatic
/// and one rank's `max_nnz` pairs alone pass the threshold (the union holds at least those).
bool surely_dense(Form form, const Layout& layout, std::size_t max_nnz);

/// Sparse: indices strictly increasing, values.size() == indices.size() * c_v. Dense: indices
/// empty, values holds dim values. Entries a sparse piece lacks are zero.
struct Piece {
  bool dense = false;
  std::vector<std::uint64_t> indices;
  std::vector<std::byte> values;
  std::size_t nnz() const { return indices.size(); }
};

/// The input as a sparse piece: sorted by index, duplicates combined with `op` in input order.
/// The input must have been checked (check_input).
Piece canonical(const Vector& input, ReduceOp op, const Layout& layout);

/// Error(invalid_argument) naming `operation` and `rank` for a null pointer with nnz > 0, an index
/// >= dim, an invalid enum, or a dim whose dense vector does not fit in size_t.
/// Returns whether the indices strictly increase (is_canonical), found in the same pass.
bool check_input(const Vector& input, std::string_view operation, int rank);

/// The piece op-combined with `b`, `a` the left operand: an index one side lacks combines with 0
/// there, so the result is what the dense vectors would give. Either may be dense (then so is
/// the result). Uses the reduce layer's kernels (avg combines as sum).
Piece merge(Piece a, const Piece& b, ReduceOp op, const Layout& layout);

/// The pieces merged pairwise as a balanced tree in rank order (0 with 1, 2 with 3, … then the
/// results likewise), so that p pieces cost log2 p passes and every rank that merges the same
/// pieces gets the same bits. A merged piece of `dense_from` pairs or more continues dense.
Piece merge_tree(std::vector<Piece> pieces, ReduceOp op, const Layout& layout, std::size_t dense_from);

/// The same piece as a dense vector of dim values, built in `zeroed` (dim zero values; empty: a
/// fresh allocation).
Piece densify(Piece piece, const Layout& layout, std::vector<std::byte> zeroed = {});

/// Whether the (checked) input is already canonical: indices strictly increasing, so no
/// duplicates; canonical() would then only copy it.
bool is_canonical(const Vector& input);

/// The piece of a canonical input (is_canonical): indices widened to 64 bits, values copied.
Piece copy_canonical(const Vector& input, const Layout& layout);

/// The dense vector of a canonical input (is_canonical), scattered from the caller's arrays
/// without the canonical piece's copy: as densify(canonical(...)), in `zeroed` likewise.
Piece densify_canonical(const Vector& input, const Layout& layout, std::vector<std::byte> zeroed = {});

/// Scatters the pairs of a canonical input (is_canonical) whose indices lie in [lo, hi) into
/// `dense`, the values of indices lo … hi - 1 (zeroed beforehand by the caller).
void scatter_canonical(const Vector& input, std::uint64_t lo, std::uint64_t hi, const Layout& layout, std::byte* dense);

/// Sets bit i % 64 of bits[i / 64] for every index i of a canonical input (is_canonical): the
/// input's presence bitmap, ORed into `bits` (of (dim + 63) / 64 words).
void mark_indices(const Vector& input, std::uint64_t* bits);

/// The sparse piece of a dense vector at the indices whose bits are set in `bits` ((dim + 63)
/// / 64 words), `count` of them: sorted indices and their values, in one pass.
Piece pick(const std::byte* dense, const std::uint64_t* bits, std::size_t count, const Layout& layout);

/// `bytes` zero bytes, the pages of a large allocation faulted in by one call to the kernel.
std::vector<std::byte> zeroed_bytes(std::size_t bytes);

/// A sparse piece seen as a canonical input (u64 indices), valid while the piece is.
Vector as_vector(const Piece& piece, const Layout& layout);

/// Index positions [first, last) of a sparse piece whose indices lie in [lo, hi).
std::pair<std::size_t, std::size_t> range_of(const Piece& piece, std::uint64_t lo, std::uint64_t hi);

/// Pairs [first, last) of a sparse piece on the wire: the indices in the layout's index type,
/// then the values ((last - first) · (c_i + c_v) bytes), appended to `out`.
void pack(const Piece& piece, std::size_t first, std::size_t last, const Layout& layout, std::vector<std::byte>& out);

/// Indices [first, last) of a sparse piece in the layout's index type, appended to `out`.
void append_indices(const Piece& piece, std::size_t first, std::size_t last, const Layout& layout,
                    std::vector<std::byte>& out);

/// A sparse piece from `bytes` a peer sent: a whole number of pairs whose indices are strictly
/// increasing and lie in [lo, hi); Error(invalid_argument) naming `what` otherwise.
Piece unpack(std::span<const std::byte> bytes, std::uint64_t lo, std::uint64_t hi, const Layout& layout,
             std::string_view what);

/// unpack, appending to `out` (whose indices must all be below lo for it to stay sorted); on an
/// error `out` is left as it was.
void unpack_into(std::span<const std::byte> bytes, std::uint64_t lo, std::uint64_t hi, const Layout& layout,
                 std::string_view what, Piece& out);

/// Where index range r of p begins ([begin(r), begin(r + 1)) is range r): balanced, dim·r/p.
std::uint64_t range_begin(std::size_t dim, int r, int p);

}  // namespace tutti::sparse::detail
