// Recursive-doubling allgather (and allgatherv): in round k partners v and v^2^k swap everything
// they have, a contiguous run of 2^k virtual ranks' blocks, so log2(pof2) rounds gather it all.
// Non-powers of two fold (fold.hpp): an even rank of the first 2·rest hands its block to its odd
// neighbour, which then carries both (adjacent, so every run stays contiguous in the packed
// output), and at the end receives the whole output from it; two extra rounds.
//
// Where ranks lie in blocks on hosts (Params::ranks_per_host, below size) the rounds go farthest
// first instead: round k pairs virtual ranks pof2/2^(k+1) apart, so the rounds across hosts come
// first and move the fewest blocks; with L ranks a host each host's link carries the host's own L
// blocks once each way (the least an allgather can move), where nearest first both ranks of a
// host send half the output across in the last round (L times that). What a rank holds after
// round k is then every other block, or every fourth..., of the output, so the runs are kept in
// scratch in the order of positions (virtual ranks with their bits reversed), where they are
// contiguous, and copied into the output once all have arrived: a copy of the output in memory
// for the bytes saved on the links.
#include "schedule/algorithms.hpp"
#include "schedule/fold.hpp"

namespace tutti::schedule {

namespace {

// The packed output elements of virtual ranks [lo, hi).
Region run_of(const Fold& f, const std::vector<std::size_t>& offsets, int lo, int hi) {
  const std::size_t a = offsets[static_cast<std::size_t>(f.first(lo))];
  return Region{Buffer::output, a, offsets[static_cast<std::size_t>(f.first(hi))] - a};
}

void add(std::vector<std::uint32_t>& steps, std::uint32_t step) {
  if (step != no_step) steps.push_back(step);
}

// Farthest first (see above), on a rank that takes part in the power-of-two phase; `written` holds
// the copy of its own block into output. Scratch holds the blocks by position.
void farthest_first(Schedule& s, const Fold& f, const std::vector<std::size_t>& offsets, Region input,
                    std::vector<std::uint32_t> written) {
  const auto first_of = [&](int v) { return offsets[static_cast<std::size_t>(f.first(v))]; };
  std::vector<std::size_t> at{0};  // scratch offset of each position, pof2 + 1
  for (int u = 0; u < f.pof2; ++u) {
    const int v = reversed(u, f.steps);
    at.push_back(at.back() + first_of(v + 1) - first_of(v));
  }
  s.scratch_count = at.back();
  const auto run = [&](int lo, int hi) {
    return Region{Buffer::scratch, at[static_cast<std::size_t>(lo)],
                  at[static_cast<std::size_t>(hi)] - at[static_cast<std::size_t>(lo)]};
  };
  const int u = reversed(f.vrank, f.steps);
  const Region mine = run(u, u + 1);  // a folded rank's partner's block, then its own
  std::vector<std::uint32_t> held;    // the steps that filled scratch so far
  if (f.receives_fold()) {
    const auto q = static_cast<std::size_t>(f.partner);
    add(held, recv_if(s, f.partner, Region{Buffer::scratch, mine.offset, offsets[q + 1] - offsets[q]}, {}));
  }
  if (input.count > 0)
    held.push_back(s.copy(Region{Buffer::scratch, mine.offset + mine.count - input.count, input.count}, input));
  for (int k = 0; k < f.steps; ++k) {
    const int lo = (u >> k) << k, theirs = lo ^ (1 << k), peer = f.real(reversed(u ^ (1 << k), f.steps));
    send_if(s, peer, run(lo, lo + (1 << k)), held);
    add(held, recv_if(s, peer, run(theirs, theirs + (1 << k)), {}));
  }
  // Into the output in rank order: every position but this rank's own block (already there).
  for (int j = 0; j < f.pof2; ++j) {
    const int v = reversed(j, f.steps);
    Region from = run(j, j + 1);
    if (j == u) from.count -= input.count;  // a folded rank's partner's block only
    if (from.count > 0) written.push_back(s.copy(Region{Buffer::output, first_of(v), from.count}, from, held));
  }
  if (f.receives_fold()) send_if(s, f.partner, Region{Buffer::output, 0, offsets.back()}, written);
}

}  // namespace

Schedule allgather_recursive_doubling(const Params& params) {
  Schedule s;
  const auto offsets = block_offsets(params);
  const auto r = static_cast<std::size_t>(params.rank), p = static_cast<std::size_t>(params.size);
  const Region input{Buffer::input, 0, offsets[r + 1] - offsets[r]};
  const Region all{Buffer::output, 0, offsets[p]};
  if (all.count == 0) return s;
  const Fold f = fold(params.rank, params.size);
  if (f.sits_out()) {
    const std::uint32_t sent = send_if(s, f.partner, input, {});
    recv_if(s, f.partner, all, deps_of({sent}));  // in place, this rewrites the own block just sent
    return s;
  }
  std::vector<std::uint32_t> written;  // the steps that filled what this rank has so far
  if (input.count > 0) written.push_back(s.copy(Region{Buffer::output, offsets[r], input.count}, input));
  if (params.in_host_blocks()) {
    farthest_first(s, f, offsets, input, written);
    return s;
  }
  if (f.receives_fold()) {
    const auto q = static_cast<std::size_t>(f.partner);
    add(written, recv_if(s, f.partner, Region{Buffer::output, offsets[q], offsets[q + 1] - offsets[q]}, {}));
  }
  for (int k = 0; k < f.steps; ++k) {
    const int mine = (f.vrank >> k) << k, theirs = mine ^ (1 << k), peer = f.real(f.vrank ^ (1 << k));
    send_if(s, peer, run_of(f, offsets, mine, mine + (1 << k)), written);
    add(written, recv_if(s, peer, run_of(f, offsets, theirs, theirs + (1 << k)), {}));
  }
  if (f.receives_fold()) send_if(s, f.partner, all, written);
  return s;
}

}  // namespace tutti::schedule
