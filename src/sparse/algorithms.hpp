// The sparse allreduce algorithms (SparCML). Each takes this rank's canonical piece and returns
// the merged piece of every rank, identical on every rank: sparse, or dense where it switched.
// They talk only through the public Communicator API of ctx.comm, exchanging sizes before data;
// every size and every index a peer sends is checked against dim and its range before use.
#pragma once

#include <algorithm>
#include <limits>
#include <vector>

#include "comm/cost_model.hpp"
#include "sparse/allocation.hpp"
#include "sparse/piece.hpp"
#include "tutti/sparse.hpp"

namespace tutti::sparse::detail {

using tutti::comm::choice::CostParams;

struct Context {
  explicit Context(tutti::Communicator& c) : comm(c) {}
  tutti::Communicator& comm;
  int rank = 0;
  int size = 1;
  Layout layout;
  ReduceOp op = ReduceOp::sum;        // avg arrives here as sum (the division comes last)
  Form form = Form::automatic;        // forced sparse: never switch to dense
  tutti::Options collective_options;  // the timeout, for the collective steps
  std::vector<std::size_t> nnz;       // every rank's canonical nnz (checked ≤ dim)
  const char* operation = "sparse_allreduce";
  /// The storage of the caller's recycled Result (sparse_allreduce's overload that takes one):
  /// the first dense vector this call builds takes spare_values, a sparse result spare_indices.
  std::vector<std::byte> spare_values, spare_indices;

  /// `bytes` zero bytes: spare_values where its capacity holds them (zeroed in place, no fresh
  /// pages), else a fresh allocation (zeroed_bytes).
  std::vector<std::byte> zeroed(std::size_t bytes) {
    if (spare_values.capacity() < bytes) return zeroed_bytes(bytes);
    std::vector<std::byte> out = std::move(spare_values);
    spare_values = {};
    out.assign(bytes, std::byte{0});
    return out;
  }
  /// zeroed() of the dense vector's dim values; Error(invalid_argument) naming the size where
  /// they exceed this host's memory (check_allocation), before anything is allocated.
  std::vector<std::byte> zeroed_dense() {
    check_allocation(layout.dim, layout.value_bytes, "the dense vector", operation, rank);
    return zeroed(layout.dim * layout.value_bytes);
  }
  /// Whether zeroed_dense() reuses the caller's storage.
  bool has_dense_spare() const { return spare_values.capacity() >= layout.dim * layout.value_bytes; }

  /// Whether a piece of `nnz` pairs should now travel dense (never under Form::sparse).
  bool switch_to_dense(std::size_t n) const { return form != Form::sparse && layout.dense_is_smaller(n); }
  /// The largest rank's nnz.
  std::size_t largest_nnz() const { return nnz.empty() ? 0 : *std::max_element(nnz.begin(), nnz.end()); }
  /// Whether one rank's pairs alone take at least as many bytes as the dense vector.
  bool pairs_outweigh_dense() const { return layout.dense_is_smaller(largest_nnz()); }
  /// The least nnz for which switch_to_dense holds (SIZE_MAX under Form::sparse).
  std::size_t dense_from() const {
    if (form == Form::sparse) return std::numeric_limits<std::size_t>::max();
    const std::size_t c = layout.pair_bytes();
    return static_cast<std::size_t>((static_cast<unsigned __int128>(layout.dim) * layout.value_bytes + c - 1) / c);
  }
};

/// The tag of the sparse layer's point-to-point messages.
constexpr int sparse_tag = 0x5ba;

Piece recursive_doubling(Context& ctx, Piece mine);
/// dense_allgather: dsar (the reduced ranges travel dense once the result is dense) or ssar.
Piece split_allgather(Context& ctx, Piece mine, bool dense_allgather);
Piece allgather_merge(Context& ctx, Piece mine);

/// split_allgather's halves. reduce_scatter: range ctx.rank of p (range_begin) of every rank's
/// piece, merged in rank order (sparse). allgather_ranges: every rank's reduced range (sparse with
/// indices in its range, or, with dense_allgather, a dense block of the range's length) to every
/// rank, as pairs or (dense_allgather and the result dense by ctx.form or the rule) dense blocks.
Piece reduce_scatter(Context& ctx, const Piece& mine);
Piece allgather_ranges(Context& ctx, const Piece& reduced, bool dense_allgather);

/// Algorithm::hierarchical (src/sparse/hierarchical.cpp): merged inside each host, reduced across
/// hosts among one rank per host and range, shared inside the host again. `cost` prices the
/// choice of the algorithm across hosts. Where ctx.pairs_outweigh_dense(), sparse_allreduce runs
/// dense_allreduce for it instead.
Piece hierarchical(Context& ctx, Piece mine, const CostParams& cost);

/// The flat algorithm `algorithm` (not automatic or hierarchical) on ctx.comm.
Piece run_flat(Context& ctx, Algorithm algorithm, Piece mine);

/// What automatic picks for ctx among the flat algorithms (hosts ignored), priced with `cost`.
Algorithm choose_flat(const Context& ctx, const CostParams& cost);

/// A whole piece on the wire (ssar_recursive_doubling's exchanges, hierarchical's broadcast): a u64
/// header, piece_mark for a dense piece or the pair count, then the values or the packed pairs.
constexpr std::uint64_t piece_mark = std::numeric_limits<std::uint64_t>::max();
/// The bytes a peer's header announces, checked: a dense piece only where ctx.form allows one,
/// at most dim pairs. Error(invalid_argument) naming `peer` otherwise.
std::size_t bytes_announced(const Context& ctx, std::uint64_t header, int peer);
/// The piece a peer sent (pairs checked by unpack).
Piece piece_of(const Context& ctx, std::uint64_t header, std::vector<std::byte> bytes, int peer);
/// The dense allreduce of the ranks' canonical inputs (is_canonical), as one dense piece: built
/// and reduced in pieces that overlap (src/sparse/dense_allreduce.cpp).
Piece dense_allreduce(Context& ctx, const Vector& input);
/// Test-only: the least bytes of one of dense_allreduce's pieces (16 MiB; vectors of twice that
/// or more are cut into 2-16 pieces). Returns the previous value; not for use while calls run.
std::size_t set_least_piece_bytes_for_testing(std::size_t bytes);

/// Every rank's canonical piece, in rank order (sizes from ctx.nnz): the allgather baseline's
/// exchange, shared with sparse_allgather.
std::vector<Piece> allgather_pieces(Context& ctx, const Piece& mine);

}  // namespace tutti::sparse::detail
