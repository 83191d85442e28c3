// Recursive-halving reduce_scatter: in round k partners v and v^(pof2/2^(k+1)) split their current
// range of blocks in halves; each sends the half the other keeps and reduces the half it keeps,
// so after log2(pof2) rounds each rank holds its own block, summed. Blocks are exactly `count`
// elements (the call's layout). Non-powers of two fold (fold.hpp): an even rank of the first
// 2·rest sends its whole input to its odd neighbour, which then carries both ranks' blocks (they
// are adjacent, so every range stays contiguous) and at the end sends the even rank its block.
//
// Partial sums live in scratch, laid out like input from the start of the range kept in round 0
// (a folded rank's whole sum from the fold onwards); the last reduction writes output directly.
#include <tuple>
#include <utility>

#include "schedule/algorithms.hpp"
#include "schedule/fold.hpp"

namespace tutti::schedule {

namespace {

struct Layout {
  const Fold& f;
  std::size_t count;
  std::size_t base = 0;  // input element that scratch element 0 stands for
  // Elements of the blocks that virtual ranks [lo, hi) carry, in `b` (scratch: shifted by base).
  Region range(Buffer b, int lo, int hi) const {
    const std::size_t a = static_cast<std::size_t>(f.first(lo)) * count;
    const std::size_t z = static_cast<std::size_t>(f.first(hi)) * count;
    return Region{b, b == Buffer::scratch ? a - base : a, z - a};
  }
};

}  // namespace

Schedule reduce_scatter_rabenseifner(const Params& params) {
  Schedule s;
  const std::size_t c = params.count, all = c * static_cast<std::size_t>(params.size);
  const auto own = static_cast<std::size_t>(params.rank) * c;
  if (params.size == 1 || c == 0) {
    if (c > 0) s.copy(Region{Buffer::output, 0, c}, Region{Buffer::input, 0, c});  // elided in place
    return s;
  }
  const Fold f = fold(params.rank, params.size);
  if (f.sits_out()) {
    const std::uint32_t sent = s.send(f.partner, Region{Buffer::input, 0, all});
    s.recv(f.partner, Region{Buffer::output, 0, c}, {sent});  // in place, output is part of that input
    return s;
  }
  Layout layout{f, c};
  Buffer from = Buffer::input;
  std::uint32_t reduced = no_step;
  if (f.receives_fold()) {
    s.scratch_count = all;
    reduced = s.recv_reduce(f.partner, Region{Buffer::scratch, 0, all}, Region{Buffer::input, 0, all});
    from = Buffer::scratch;
  }
  int lo = 0, hi = f.pof2;
  for (int k = 0; k < f.steps; ++k) {
    const int m = f.pof2 >> (k + 1), mid = lo + m, peer = f.real(f.vrank ^ m);
    const bool upper = (f.vrank & m) != 0;
    const auto keep = upper ? std::pair{mid, hi} : std::pair{lo, mid};
    const auto give = upper ? std::pair{lo, mid} : std::pair{mid, hi};
    const Buffer source = k == 0 ? from : Buffer::scratch;
    s.send(peer, layout.range(source, give.first, give.second), deps_of({reduced}));
    if (k == 0 && from == Buffer::input) {  // scratch starts at the kept range
      layout.base = layout.range(Buffer::input, keep.first, keep.second).offset;
      s.scratch_count = f.steps > 1 ? layout.range(Buffer::input, keep.first, keep.second).count : 0;
    }
    const Region operand = layout.range(source, keep.first, keep.second);
    const bool into_output = k == f.steps - 1 && !f.receives_fold();
    const Region to =
        into_output ? Region{Buffer::output, 0, c} : layout.range(Buffer::scratch, keep.first, keep.second);
    reduced = s.recv_reduce(peer, to, operand, deps_of({reduced}));
    std::tie(lo, hi) = keep;
  }
  if (f.receives_fold()) {  // scratch holds the sums of blocks rank-1 (the partner's) and rank
    s.send(f.partner, Region{Buffer::scratch, own - c, c}, {reduced});
    s.copy(Region{Buffer::output, 0, c}, Region{Buffer::scratch, own, c}, {reduced});
  }
  return s;
}

}  // namespace tutti::schedule
