// Recursive-halving reduce_scatter: in each round two partners split their current range of
// blocks in halves; each sends the half the other keeps and reduces the half it keeps, so after
// log2(pof2) rounds each rank holds its own block, summed. Blocks are exactly `count` elements
// (the call's layout). Non-powers of two fold (fold.hpp): an even rank of the first 2·rest sends
// its whole input to its odd neighbour, which then carries both ranks' blocks (they are
// adjacent, so every range stays contiguous) and at the end sends the even rank its block.
//
// The ranges are of positions, one per virtual rank (its blocks), and round k pairs positions
// u and u ^ pof2/2^(k+1). Two orders:
// - Farthest first (positions = virtual ranks): round 0 exchanges half the buffer between ranks
//   pof2/2 apart. Ranges are ranges of the input as it lies, so nothing is copied.
// - Nearest first, where ranks lie in blocks on hosts (Params::ranks_per_host, below size):
//   positions are virtual ranks with their bits reversed, so round 0 pairs ranks 1 apart, round 1
//   ranks 2 apart, ..., and the rounds across hosts move the smallest pieces. With L ranks a host
//   each host's link carries the 1/L of the buffer bound for the other hosts once each way (the
//   least a reduce_scatter can move); farthest first, both directions carry L times that, since
//   every rank of a host sends half the buffer across at once. The input's blocks are not in
//   that order (rank r's block must end on rank r, and the blocks a round gives away are every
//   other one), so every rank first copies its input into scratch in position order, a copy of
//   the buffer in memory for a message's worth less on the link; a rank that sits out a fold
//   does so too, and sends its partner the copy.
//
// Partial sums live in scratch. Farthest first it is laid out like input from the start of the
// range kept in round 0 (a folded rank's whole sum from the fold onwards); nearest first it holds
// the whole buffer in position order. The last reduction writes output directly.
#include <tuple>
#include <utility>
#include <vector>

#include "schedule/algorithms.hpp"
#include "schedule/fold.hpp"

namespace tutti::schedule {

namespace {

struct Layout {
  const Fold& f;
  std::size_t count;
  bool nearest = false;              // positions are virtual ranks with their bits reversed
  std::vector<std::size_t> offsets;  // elements before each position in that order, pof2 + 1
  std::size_t base = 0;              // input element that scratch element 0 stands for (farthest first)

  Layout(const Fold& fold, std::size_t c, bool nearest_first) : f(fold), count(c), nearest(nearest_first) {
    offsets.push_back(0);
    for (int u = 0; u < f.pof2; ++u) {
      const int v = virtual_rank(u);
      offsets.push_back(offsets.back() + static_cast<std::size_t>(f.first(v + 1) - f.first(v)) * count);
    }
  }
  int virtual_rank(int u) const { return nearest ? reversed(u, f.steps) : u; }
  int position(int v) const { return virtual_rank(v); }  // reversal is its own inverse
  // Elements of positions [lo, hi) in `b` (scratch: shifted by base).
  Region range(Buffer b, int lo, int hi) const {
    const std::size_t a = offsets[static_cast<std::size_t>(lo)], z = offsets[static_cast<std::size_t>(hi)];
    return Region{b, b == Buffer::scratch ? a - base : a, z - a};
  }
  // Nearest first: copies the input into scratch in position order; returns each position's copy.
  std::vector<std::uint32_t> place(Schedule& s) const {
    std::vector<std::uint32_t> placed;
    for (int u = 0; u < f.pof2; ++u) {
      const int v = virtual_rank(u);
      const Region to = range(Buffer::scratch, u, u + 1);
      placed.push_back(s.copy(to, Region{Buffer::input, static_cast<std::size_t>(f.first(v)) * count, to.count}));
    }
    return placed;
  }
};

// The steps among `placed` for positions [lo, hi).
std::vector<std::uint32_t> placed_in(const std::vector<std::uint32_t>& placed, int lo, int hi) {
  if (placed.empty()) return {};
  return {placed.begin() + lo, placed.begin() + hi};
}

}  // namespace

Schedule reduce_scatter_rabenseifner(const Params& params) {
  Schedule s;
  const std::size_t c = params.count, all = c * static_cast<std::size_t>(params.size);
  if (params.size == 1 || c == 0) {
    if (c > 0) s.copy(Region{Buffer::output, 0, c}, Region{Buffer::input, 0, c});  // elided in place
    return s;
  }
  const Fold f = fold(params.rank, params.size);
  Layout layout(f, c, params.in_host_blocks());
  std::vector<std::uint32_t> placed;
  if (layout.nearest) {
    s.scratch_count = all;
    placed = layout.place(s);
  }
  const Buffer from = layout.nearest ? Buffer::scratch : Buffer::input;
  if (f.sits_out()) {
    const std::uint32_t sent = s.send(f.partner, Region{from, 0, all}, placed);
    s.recv(f.partner, Region{Buffer::output, 0, c}, {sent});  // in place, output is part of that input
    return s;
  }
  Buffer source = from;
  std::uint32_t reduced = no_step;
  if (f.receives_fold()) {
    s.scratch_count = all;
    reduced = s.recv_reduce(f.partner, Region{Buffer::scratch, 0, all}, Region{from, 0, all}, placed);
    source = Buffer::scratch;
  }
  const int v = layout.position(f.vrank);
  int lo = 0, hi = f.pof2;
  for (int k = 0; k < f.steps; ++k) {
    const int m = f.pof2 >> (k + 1), mid = lo + m, peer = f.real(layout.virtual_rank(v ^ m));
    const bool upper = (v & m) != 0;
    const auto keep = upper ? std::pair{mid, hi} : std::pair{lo, mid};
    const auto give = upper ? std::pair{lo, mid} : std::pair{mid, hi};
    // Round 0 without a fold waits only for the copies it reads (nearest first; none farthest).
    const bool first = reduced == no_step;
    s.send(peer, layout.range(source, give.first, give.second),
           first ? placed_in(placed, give.first, give.second) : deps_of({reduced}));
    if (source == Buffer::input) {  // farthest first: scratch starts at the range kept in round 0
      layout.base = layout.range(Buffer::input, keep.first, keep.second).offset;
      s.scratch_count = f.steps > 1 ? layout.range(Buffer::input, keep.first, keep.second).count : 0;
    }
    const Region operand = layout.range(source, keep.first, keep.second);
    const bool into_output = k == f.steps - 1 && !f.receives_fold();
    const Region to =
        into_output ? Region{Buffer::output, 0, c} : layout.range(Buffer::scratch, keep.first, keep.second);
    reduced = s.recv_reduce(peer, to, operand, first ? placed_in(placed, keep.first, keep.second) : deps_of({reduced}));
    source = Buffer::scratch;
    std::tie(lo, hi) = keep;
  }
  if (f.receives_fold()) {  // position v holds the sums of blocks rank-1 (the partner's) and rank
    const std::size_t at = layout.range(Buffer::scratch, v, v + 1).offset;
    s.send(f.partner, Region{Buffer::scratch, at, c}, {reduced});
    s.copy(Region{Buffer::output, 0, c}, Region{Buffer::scratch, at + c, c}, {reduced});
  }
  return s;
}

}  // namespace tutti::schedule
