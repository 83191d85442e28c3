// The dense switch taken at once (Algorithm::dense_allreduce): every rank scatters its pairs into
// a dense vector and the vector is allreduced. Building the vector (a fresh allocation of dim
// values, whose pages fault in as they are zeroed, and the scatter) costs tens of milliseconds for
// tens of millions of values, as much as a tenth of the allreduce on a 1 Gbit/s link; so the
// vector is built and reduced in pieces, each piece's allreduce issued (nonblocking) as soon as
// the piece is scattered, and the next piece built while the earlier ones travel. The first piece
// is built in a buffer of its own, so that its allreduce starts before the whole vector is
// allocated; it is copied into place at the end.
#include <algorithm>
#include <cstring>

#include "sparse/algorithms.hpp"

namespace tutti::sparse::detail {

namespace {

// Pieces of at least this many bytes (the allreduce of each is then well past its latency), and
// at most this many pieces (each piece's scatter is what the pipeline leaves exposed).
constexpr std::size_t least_piece_bytes = std::size_t{4} << 20;
constexpr std::size_t most_pieces = 16;

}  // namespace

Piece dense_allreduce(Context& ctx, const Vector& input) {
  const Layout& l = ctx.layout;
  const std::size_t dim = l.dim, cv = l.value_bytes;
  // Every rank cuts the same pieces: they depend on dim and the value type only.
  const std::size_t pieces = ctx.size == 1 ? 1 : std::clamp<std::size_t>(dim * cv / least_piece_bytes, 1, most_pieces);
  if (pieces == 1) {
    Piece out = densify_canonical(input, l);
    ctx.comm.allreduce(out.values.data(), out.values.data(), dim, l.value_type, ctx.op, ctx.collective_options);
    return out;
  }
  const std::size_t per_piece = (dim + pieces - 1) / pieces;
  Piece out;
  out.dense = true;
  // Declared before the try: on an error, the allreduces in flight still write into both.
  std::vector<std::byte> first;
  std::vector<tutti::Request> requests;
  requests.reserve(pieces);
  const auto issue = [&](std::byte* values, std::size_t count) {
    requests.push_back(ctx.comm.iallreduce(values, values, count, l.value_type, ctx.op, ctx.collective_options));
  };
  try {
    first = zeroed_bytes(per_piece * cv);
    scatter_canonical(input, 0, per_piece, l, first.data());
    issue(first.data(), per_piece);
    out.values = zeroed_bytes(dim * cv);
    for (std::size_t lo = per_piece; lo < dim; lo += per_piece) {
      const std::size_t hi = std::min(dim, lo + per_piece);
      scatter_canonical(input, lo, hi, l, out.values.data() + lo * cv);
      issue(out.values.data() + lo * cv, hi - lo);
    }
    for (tutti::Request& request : requests) request.wait();
    std::memcpy(out.values.data(), first.data(), first.size());
    return out;
  } catch (...) {
    // The pieces' buffers must outlive every allreduce issued on them: each ends (with its
    // error, if the communicator failed) within its timeout.
    for (tutti::Request& request : requests) try {
        request.wait();
      } catch (...) {
      }
    throw;
  }
}

}  // namespace tutti::sparse::detail
