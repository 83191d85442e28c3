// SSAR recursive doubling: log2(p) rounds in which partners exchange their partial merges and
// both compute merge(lower group's, higher group's), so both hold the same bits. A partial merge
// whose pairs would outweigh its dense form travels dense from then on (the union only grows,
// so it stays dense). Non-powers of two fold as the dense schedules do (schedule/fold.hpp): the
// first 2·rest ranks pair up, the even one's piece is merged into its odd neighbour first, and
// the odd one sends the result back at the end.
#include <limits>
#include <string>

#include "schedule/fold.hpp"
#include "sparse/algorithms.hpp"

namespace tutti::sparse::detail {

namespace {

// The bytes that carry `piece`: its own values when dense, else `packed`, filled here.
std::span<const std::byte> wire_of(const Piece& piece, const Layout& layout, std::vector<std::byte>& packed) {
  if (piece.dense) return piece.values;
  pack(piece, 0, piece.nnz(), layout, packed);
  return packed;
}

// Sends `mine` to `peer` and receives the peer's piece (size first, then the pairs or values).
Piece exchange(Context& ctx, const Piece& mine, int peer) {
  const std::uint64_t header = mine.dense ? piece_mark : mine.nnz();
  std::uint64_t theirs = 0;
  tutti::Request sent = ctx.comm.isend(&header, 1, DataType::u64, peer, sparse_tag);
  ctx.comm.recv(&theirs, 1, DataType::u64, peer, sparse_tag);
  sent.wait();
  std::vector<std::byte> packed;
  const std::span<const std::byte> out = wire_of(mine, ctx.layout, packed);
  std::vector<std::byte> in(bytes_announced(ctx, theirs, peer));
  sent = ctx.comm.isend(out.data(), out.size(), DataType::u8, peer, sparse_tag);
  ctx.comm.recv(in.data(), in.size(), DataType::u8, peer, sparse_tag);
  sent.wait();
  return piece_of(ctx, theirs, std::move(in), peer);
}

void send_piece(Context& ctx, const Piece& piece, int peer) {
  const std::uint64_t header = piece.dense ? piece_mark : piece.nnz();
  ctx.comm.send(&header, 1, DataType::u64, peer, sparse_tag);
  std::vector<std::byte> packed;
  const std::span<const std::byte> out = wire_of(piece, ctx.layout, packed);
  ctx.comm.send(out.data(), out.size(), DataType::u8, peer, sparse_tag);
}

Piece recv_piece(Context& ctx, int peer) {
  std::uint64_t header = 0;
  ctx.comm.recv(&header, 1, DataType::u64, peer, sparse_tag);
  std::vector<std::byte> in(bytes_announced(ctx, header, peer));
  ctx.comm.recv(in.data(), in.size(), DataType::u8, peer, sparse_tag);
  return piece_of(ctx, header, std::move(in), peer);
}

// merge(a, b), switched to dense when the union has grown past the threshold.
Piece combine(Context& ctx, Piece a, const Piece& b) {
  Piece merged = merge(std::move(a), b, ctx.op, ctx.layout);
  if (!merged.dense && ctx.switch_to_dense(merged.nnz()))
    return densify(std::move(merged), ctx.layout, ctx.zeroed_dense());
  return merged;
}

}  // namespace

std::size_t bytes_announced(const Context& ctx, std::uint64_t header, int peer) {
  if (header == piece_mark && ctx.form != Form::sparse) {
    check_allocation(ctx.layout.dim, ctx.layout.value_bytes, "a dense piece from rank " + std::to_string(peer),
                     ctx.operation, ctx.rank);
    return ctx.layout.dim * ctx.layout.value_bytes;
  }
  if (header > ctx.layout.dim)
    throw Error(ErrorCode::invalid_argument,
                std::string(ctx.operation) + " (rank " + std::to_string(ctx.rank) + "): rank " + std::to_string(peer) +
                    " announced " + std::to_string(header) + " pairs, more than dim " + std::to_string(ctx.layout.dim));
  return static_cast<std::size_t>(header) * ctx.layout.pair_bytes();
}

Piece piece_of(const Context& ctx, std::uint64_t header, std::vector<std::byte> bytes, int peer) {
  if (header == piece_mark) {
    Piece p;
    p.dense = true;
    p.values = std::move(bytes);
    return p;
  }
  return unpack(bytes, 0, ctx.layout.dim, ctx.layout,
                std::string(ctx.operation) + ": the piece from rank " + std::to_string(peer));
}

Piece recursive_doubling(Context& ctx, Piece mine) {
  if (!mine.dense && ctx.switch_to_dense(mine.nnz())) mine = densify(std::move(mine), ctx.layout, ctx.zeroed_dense());
  if (ctx.size == 1) return mine;
  const schedule::Fold f = schedule::fold(ctx.rank, ctx.size);
  if (f.sits_out()) {
    send_piece(ctx, mine, f.partner);
    return recv_piece(ctx, f.partner);
  }
  if (f.receives_fold()) mine = combine(ctx, recv_piece(ctx, f.partner), mine);  // the even rank is lower
  for (int k = 0; k < f.steps; ++k) {
    const int partner_v = f.vrank ^ (1 << k);
    Piece theirs = exchange(ctx, mine, f.real(partner_v));
    mine = partner_v < f.vrank ? combine(ctx, std::move(theirs), mine) : combine(ctx, std::move(mine), theirs);
  }
  if (f.receives_fold()) send_piece(ctx, mine, f.partner);
  return mine;
}

}  // namespace tutti::sparse::detail
