// SSAR / DSAR split-allgather: the index space is cut into p balanced ranges; a sparse
// reduce-scatter (alltoallv of each range's pairs, merged by the range's owner as a balanced tree
// in rank order) leaves range r reduced on rank r; then the reduced ranges are allgathered, as
// pairs (SSAR) or, when the result is dense, as dense blocks (DSAR). Pair counts travel before
// the pairs, and each is checked against its range's length before a buffer is sized from it.
#include <cstring>
#include <limits>
#include <string>

#include "sparse/algorithms.hpp"

namespace tutti::sparse::detail {

namespace {

std::string from_rank(const Context& ctx, const char* what, int peer) {
  return std::string(ctx.operation) + " (rank " + std::to_string(ctx.rank) + "): " + what + " from rank " +
         std::to_string(peer);
}

void check_count(const Context& ctx, std::uint64_t pairs, std::uint64_t length, const char* what, int peer) {
  if (pairs > length)
    throw Error(ErrorCode::invalid_argument, from_rank(ctx, what, peer) + " announces " + std::to_string(pairs) +
                                                 " pairs for a range of " + std::to_string(length));
}

}  // namespace

Piece reduce_scatter(Context& ctx, const Piece& mine) {
  const int p = ctx.size;
  const Layout& l = ctx.layout;
  std::vector<std::uint64_t> pairs_out(p), pairs_in(p);
  std::vector<std::size_t> send_counts(p), recv_counts(p);
  std::vector<std::byte> send;
  send.reserve(mine.nnz() * l.pair_bytes());
  for (int r = 0; r < p; ++r) {
    const auto [first, last] = range_of(mine, range_begin(l.dim, r, p), range_begin(l.dim, r + 1, p));
    pack(mine, first, last, l, send);
    pairs_out[r] = last - first;
    send_counts[r] = (last - first) * l.pair_bytes();
  }
  ctx.comm.alltoall(pairs_out.data(), pairs_in.data(), 1, DataType::u64, ctx.collective_options);
  const std::uint64_t lo = range_begin(l.dim, ctx.rank, p), hi = range_begin(l.dim, ctx.rank + 1, p);
  std::size_t total = 0;
  for (int r = 0; r < p; ++r) {
    check_count(ctx, pairs_in[r], hi - lo, "the reduce-scatter", r);
    recv_counts[r] = static_cast<std::size_t>(pairs_in[r]) * l.pair_bytes();
    total += recv_counts[r];
  }
  std::vector<std::byte> recv(total);
  ctx.comm.alltoallv(send.data(), send_counts, recv.data(), recv_counts, DataType::u8, ctx.collective_options);
  std::vector<Piece> pieces;
  std::size_t at = 0;
  for (int r = 0; r < p; ++r) {
    pieces.push_back(unpack(std::span(recv).subspan(at, recv_counts[r]), lo, hi, l,
                            from_rank(ctx, "the reduce-scatter's pairs", r)));
    at += recv_counts[r];
  }
  // Never dense here: a dense piece spans all of dim, and this is one range of it.
  return merge_tree(std::move(pieces), ctx.op, l, std::numeric_limits<std::size_t>::max());
}

namespace {

// Every reduced range as a dense block of its length, straight into the dense result.
Piece dense_allgather(Context& ctx, const Piece& reduced) {
  const Layout& l = ctx.layout;
  const int p = ctx.size;
  const std::uint64_t lo = range_begin(l.dim, ctx.rank, p), hi = range_begin(l.dim, ctx.rank + 1, p);
  std::vector<std::byte> filled;
  if (!reduced.dense) {
    filled.assign((hi - lo) * l.value_bytes, std::byte{0});
    for (std::size_t k = 0; k < reduced.nnz(); ++k)
      std::memcpy(filled.data() + (reduced.indices[k] - lo) * l.value_bytes, reduced.values.data() + k * l.value_bytes,
                  l.value_bytes);
  }
  const std::vector<std::byte>& block = reduced.dense ? reduced.values : filled;
  std::vector<std::size_t> counts(p);
  for (int r = 0; r < p; ++r) counts[r] = range_begin(l.dim, r + 1, p) - range_begin(l.dim, r, p);
  Piece out;
  out.dense = true;
  out.values = ctx.zeroed_dense();
  ctx.comm.allgatherv(block.data(), hi - lo, out.values.data(), counts, l.value_type, ctx.collective_options);
  return out;
}

// Every reduced range as pairs; ranges ascend, so their concatenation is sorted.
Piece sparse_allgather(Context& ctx, const Piece& reduced, const std::vector<std::uint64_t>& pairs) {
  const Layout& l = ctx.layout;
  const int p = ctx.size;
  std::vector<std::size_t> counts(p);
  std::size_t total = 0;
  for (int r = 0; r < p; ++r) total += counts[r] = static_cast<std::size_t>(pairs[r]) * l.pair_bytes();
  std::vector<std::byte> send, recv(total);
  pack(reduced, 0, reduced.nnz(), l, send);
  ctx.comm.allgatherv(send.data(), send.size(), recv.data(), counts, DataType::u8, ctx.collective_options);
  // Straight into the result, sized once (growing it range by range copied it over and over).
  Piece out;
  out.indices.reserve(total / l.pair_bytes());
  out.values.reserve(total / l.pair_bytes() * l.value_bytes);
  std::size_t at = 0;
  for (int r = 0; r < p; ++r) {
    unpack_into(std::span(recv).subspan(at, counts[r]), range_begin(l.dim, r, p), range_begin(l.dim, r + 1, p), l,
                from_rank(ctx, "the allgather's pairs", r), out);
    at += counts[r];
  }
  return out;
}

}  // namespace

Piece split_allgather(Context& ctx, Piece mine, bool dense) {
  if (ctx.size == 1) return mine;
  return allgather_ranges(ctx, reduce_scatter(ctx, mine), dense);
}

Piece allgather_ranges(Context& ctx, const Piece& reduced, bool dense) {
  const Layout& l = ctx.layout;
  const int p = ctx.size;
  const std::uint64_t length = range_begin(l.dim, ctx.rank + 1, p) - range_begin(l.dim, ctx.rank, p);
  std::uint64_t n = reduced.dense ? length : reduced.nnz();  // a dense range counts as full
  std::vector<std::uint64_t> pairs(p);
  ctx.comm.allgather(&n, pairs.data(), 1, DataType::u64, ctx.collective_options);
  std::uint64_t merged = 0;
  for (int r = 0; r < p; ++r) {
    check_count(ctx, pairs[r], range_begin(l.dim, r + 1, p) - range_begin(l.dim, r, p), "the reduced range", r);
    merged += pairs[r];
  }
  if (dense && (ctx.form == Form::dense || ctx.switch_to_dense(merged))) return dense_allgather(ctx, reduced);
  return sparse_allgather(ctx, reduced, pairs);
}

}  // namespace tutti::sparse::detail
