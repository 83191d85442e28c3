// The dense switch taken at once (Algorithm::dense_allreduce): every rank scatters its pairs into
// a dense vector and the vector is allreduced. Building the vector (a fresh allocation of dim
// values, whose pages fault in as they are zeroed, and the scatter) costs tens of milliseconds for
// tens of millions of values, as much as a tenth of the allreduce on a 1 Gbit/s link; so the
// vector is built and reduced in pieces, each piece's allreduce issued (nonblocking) as soon as
// the piece is scattered, and the next piece built while the earlier ones travel. The first piece
// is built in a buffer of its own, so that its allreduce starts before the whole vector is
// allocated; it is copied into place at the end. Where the caller recycled a large enough result
// (Context::zeroed) there are no fresh pages to wait for, and every piece is built in place.
//
// Where the result may be sparse (Form::sparse, or the automatic form with no rank past the
// threshold alone), the dense values cannot say which indices the union holds (a sum can cancel
// to zero): the ranks also gather their presence bitmaps (dim bits each, issued first so that
// they travel while the pieces are built) and OR them. The union's size then decides the form by
// SparCML's rule, and a sparse result is picked out of the reduced vector at the union's indices,
// exactly the pairs the sparse algorithms give.
#include <algorithm>
#include <atomic>
#include <bit>
#include <cstring>

#include "sparse/algorithms.hpp"

namespace tutti::sparse::detail {

namespace {

// Pieces of at least least_piece_bytes (the allreduce of each is then well past its latency, and
// each piece's steps across hosts are few), and at most this many pieces (each piece's scatter is
// what the pipeline leaves exposed). At 16M f32 values, 50% dense, on the emulated cluster at
// 1 Gbit/s, dense allreduce of a ready vector / this one with pieces of 4, 8, 16 and 32 MiB
// (16, 8, 4, 2 pieces): 2 x 2 hosts 0.81, 0.85, 0.88, 0.78; 4 x 1 0.93, 0.94, 0.95, 0.90
// (docs/performance.md, 2026-11-28, hierarchical).
std::atomic<std::size_t> least_piece_bytes{std::size_t{16} << 20};
constexpr std::size_t most_pieces = 16;

// Whether the result may be sparse: not surely dense by the largest rank's pairs and the form.
bool may_be_sparse(const Context& ctx) { return !surely_dense(ctx.form, ctx.layout, ctx.largest_nnz()); }

// Every rank's presence bitmap, gathered (nonblocking) while the values are reduced; then ORed.
class Union {
 public:
  Union(Context& ctx, const Vector& input)
      : words_((ctx.layout.dim + 63) / 64), ranks_(static_cast<std::size_t>(ctx.size)) {
    // This rank's bitmap and every rank's, of dim bits each.
    check_allocation(words_, sizeof(std::uint64_t) * (ranks_ + 1), "the presence bitmaps", ctx.operation, ctx.rank);
    mine_.assign(words_, 0);
    mark_indices(input, mine_.data());
    all_.resize(words_ * ranks_);
    request_ = ctx.comm.iallgather(mine_.data(), all_.data(), words_, DataType::u64, ctx.collective_options);
  }
  Union(const Union&) = delete;
  Union& operator=(const Union&) = delete;
  ~Union() {
    try {  // the gather writes into all_ until it ends (with its error, within its timeout)
      request_.wait();
    } catch (...) {
    }
  }
  /// The OR of every rank's bitmap (in the first words of the gathered ones) and its population.
  std::pair<const std::uint64_t*, std::size_t> wait() {
    request_.wait();
    request_ = tutti::Request();
    std::size_t count = 0;
    for (std::size_t w = 0; w < words_; ++w) {
      std::uint64_t word = all_[w];
      for (std::size_t r = 1; r < ranks_; ++r) word |= all_[r * words_ + w];
      all_[w] = word;
      count += static_cast<std::size_t>(std::popcount(word));
    }
    return {all_.data(), count};
  }

 private:
  std::size_t words_, ranks_;
  std::vector<std::uint64_t> mine_, all_;
  tutti::Request request_;
};

// The dense allreduce of the ranks' inputs, built in pieces (the comment at the top).
Piece reduce_dense(Context& ctx, const Vector& input) {
  const Layout& l = ctx.layout;
  const std::size_t dim = l.dim, cv = l.value_bytes;
  // Every rank cuts the same pieces: they depend on dim and the value type only.
  const std::size_t pieces =
      ctx.size == 1 ? 1 : std::clamp<std::size_t>(dim * cv / least_piece_bytes.load(), 1, most_pieces);
  if (pieces == 1) {
    Piece out = densify_canonical(input, l, ctx.zeroed_dense());
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
    std::size_t lo = 0;
    if (!ctx.has_dense_spare()) {  // fresh pages: the first piece travels while they fault in
      first = zeroed_bytes(per_piece * cv);
      scatter_canonical(input, 0, per_piece, l, first.data());
      issue(first.data(), per_piece);
      lo = per_piece;
    }
    out.values = ctx.zeroed_dense();
    for (; lo < dim; lo += per_piece) {
      const std::size_t hi = std::min(dim, lo + per_piece);
      scatter_canonical(input, lo, hi, l, out.values.data() + lo * cv);
      issue(out.values.data() + lo * cv, hi - lo);
    }
    for (tutti::Request& request : requests) request.wait();
    if (!first.empty()) std::memcpy(out.values.data(), first.data(), first.size());
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

}  // namespace

std::size_t set_least_piece_bytes_for_testing(std::size_t bytes) { return least_piece_bytes.exchange(bytes); }

Piece dense_allreduce(Context& ctx, const Vector& input) {
  if (!may_be_sparse(ctx) || ctx.layout.dim == 0) return reduce_dense(ctx, input);
  Union presence(ctx, input);  // issued first: the bitmaps travel while the values are built
  Piece reduced = reduce_dense(ctx, input);
  const auto [bits, count] = presence.wait();
  if (ctx.switch_to_dense(count)) return reduced;
  return pick(reduced.values.data(), bits, count, ctx.layout);
}

}  // namespace tutti::sparse::detail
