// Rabenseifner's allreduce: a recursive-halving reduce_scatter (each round a rank sends the half
// of its current range that its partner keeps, and reduces the half it keeps) leaves each active
// rank with one of pof2 near-equal blocks; a recursive-doubling allgather in the reverse order of
// partners assembles the result. Non-powers of two fold (fold.hpp): two extra rounds.
//
// The halving pairs the nearest ranks first (virtual ranks that differ in bit 0, then bit 1...)
// and the doubling the farthest first: the first halving round, which moves half the buffer, and
// the last doubling round stay among neighbours, and the rounds between ranks far apart move the
// smallest pieces. Where ranks lie in blocks of L on hosts (ranks 0..L-1 on the first, as
// launchers place them by default) the reduce_scatter's rounds across send 1/L of what a rank
// holds, and the hosts' links carry the buffer once each way over the call, as with hierarchical;
// far ranks first carried it L times. The blocks are numbered in
// that pairing order (position u = the rank's bits reversed), so that every message is still one
// contiguous range; which block a rank reduces does not matter to an allreduce.
//
// Partial sums live in output. The first reduction of a range reads input (or, on a rank that
// received a fold, output) and writes output; the halves it sends are never written again until
// the allgather brings them back, which therefore waits for that send (in place it read them).
#include <algorithm>
#include <tuple>
#include <utility>

#include "schedule/algorithms.hpp"
#include "schedule/fold.hpp"

namespace tutti::schedule {

namespace {

struct Halving {
  const Fold& f;
  std::size_t count;
  // Elements of virtual ranks [lo, hi).
  Region range(Buffer b, int lo, int hi) const {
    const std::size_t a = block_offset(count, static_cast<std::size_t>(f.pof2), static_cast<std::size_t>(lo));
    const std::size_t z = block_offset(count, static_cast<std::size_t>(f.pof2), static_cast<std::size_t>(hi));
    return Region{b, a, z - a};
  }
};

// Recursive halving then recursive doubling among the pof2 active ranks (a PowerOfTwoPhase), in
// positions u = reversed(virtual rank): partners u ^ m for m = pof2/2, pof2/4, ... are virtual
// ranks that differ in bit 0, 1, ... (nearest first).
std::vector<std::uint32_t> halve_then_double(Schedule& s, const Fold& f, Region from, std::uint32_t ready) {
  const Halving h{f, from.count};
  const int v = reversed(f.vrank, f.steps);
  const auto real = [&f](int u) { return f.real(reversed(u, f.steps)); };
  std::vector<std::uint32_t> rs_sent(static_cast<std::size_t>(f.steps), no_step);
  std::vector<std::pair<int, int>> given(static_cast<std::size_t>(f.steps));  // virtual ranges sent away
  int lo = 0, hi = f.pof2;
  std::uint32_t reduced = ready;
  for (int k = 0; k < f.steps; ++k) {
    const int m = f.pof2 >> (k + 1), mid = lo + m, peer = real(v ^ m);
    const bool upper = (v & m) != 0;
    const auto keep = upper ? std::pair{mid, hi} : std::pair{lo, mid};
    given[static_cast<std::size_t>(k)] = upper ? std::pair{lo, mid} : std::pair{mid, hi};
    const Buffer source = k == 0 ? from.buffer : Buffer::output;
    const auto [glo, ghi] = given[static_cast<std::size_t>(k)];
    rs_sent[static_cast<std::size_t>(k)] = send_if(s, peer, h.range(source, glo, ghi), deps_of({reduced}));
    const Region to = h.range(Buffer::output, keep.first, keep.second);
    reduced =
        to.count == 0 ? no_step : s.recv_reduce(peer, to, h.range(source, keep.first, keep.second), deps_of({reduced}));
    std::tie(lo, hi) = keep;
  }
  std::vector<std::uint32_t> complete{reduced};
  std::uint32_t sent = no_step, arrived = no_step;
  for (int k = f.steps - 1; k >= 0; --k) {
    const int peer = real(v ^ (f.pof2 >> (k + 1)));
    // What this rank has: its reduced block and every earlier arrival (through the previous send).
    sent = send_if(s, peer, h.range(Buffer::output, lo, hi), deps_of({reduced, sent, arrived}));
    const auto [glo, ghi] = given[static_cast<std::size_t>(k)];
    const Region back = h.range(Buffer::output, glo, ghi);
    arrived = recv_if(s, peer, back, deps_of({rs_sent[static_cast<std::size_t>(k)]}));
    complete.push_back(arrived);
    lo = std::min(lo, glo);
    hi = std::max(hi, ghi);
  }
  return complete;
}

}  // namespace

Schedule allreduce_rabenseifner(const Params& params) { return folded_allreduce(params, halve_then_double); }

}  // namespace tutti::schedule
