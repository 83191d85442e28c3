// The baseline (Horovod's way for sparse tensors): every rank's pairs to every rank, merged
// locally as a balanced tree in rank order. Also the exchange of sparse_allgather.
#include <string>

#include "sparse/algorithms.hpp"

namespace tutti::sparse::detail {

std::vector<Piece> allgather_pieces(Context& ctx, const Piece& mine) {
  const Layout& l = ctx.layout;
  std::vector<std::size_t> counts(ctx.size);
  std::size_t total = 0;
  // ctx.nnz was checked against dim when the descriptors were exchanged.
  for (int r = 0; r < ctx.size; ++r) total += counts[r] = ctx.nnz[r] * l.pair_bytes();
  std::vector<std::byte> send, recv(total);
  pack(mine, 0, mine.nnz(), l, send);
  ctx.comm.allgatherv(send.data(), send.size(), recv.data(), counts, DataType::u8, ctx.collective_options);
  std::vector<Piece> pieces;
  pieces.reserve(ctx.size);
  std::size_t at = 0;
  for (int r = 0; r < ctx.size; ++r) {
    pieces.push_back(unpack(std::span(recv).subspan(at, counts[r]), 0, l.dim, l,
                            std::string(ctx.operation) + " (rank " + std::to_string(ctx.rank) +
                                "): the pairs from rank " + std::to_string(r)));
    at += counts[r];
  }
  return pieces;
}

Piece allgather_merge(Context& ctx, Piece mine) {
  if (ctx.size == 1) return mine;
  // Once a union is dense, merging into the dense vector is cheaper than growing the union.
  return merge_tree(allgather_pieces(ctx, mine), ctx.op, ctx.layout, ctx.dense_from());
}

}  // namespace tutti::sparse::detail
