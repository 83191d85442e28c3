// Recursive-doubling allgather (and allgatherv): in round k partners v and v^2^k swap everything
// they have, a contiguous run of 2^k virtual ranks' blocks, so log2(pof2) rounds gather it all.
// Non-powers of two fold (fold.hpp): an even rank of the first 2·rest hands its block to its odd
// neighbour, which then carries both (adjacent, so every run stays contiguous in the packed
// output), and at the end receives the whole output from it; two extra rounds.
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

}  // namespace

Schedule allgather_recursive_doubling(const Params& params) {
  Schedule s;
  const auto offsets = block_offsets(params);
  const auto r = static_cast<std::size_t>(params.rank), p = static_cast<std::size_t>(params.size);
  const Region input{Buffer::input, 0, offsets[r + 1] - offsets[r]};
  const Region all{Buffer::output, 0, offsets[p]};
  if (all.count == 0) return s;
  const Fold f = fold(params.rank, params.size);
  auto send = [&](int peer, Region region, std::vector<std::uint32_t> deps) {
    return region.count == 0 ? no_step : s.send(peer, region, std::move(deps));
  };
  auto recv = [&](int peer, Region region, std::vector<std::uint32_t> deps) {
    return region.count == 0 ? no_step : s.recv(peer, region, std::move(deps));
  };
  if (f.sits_out()) {
    const std::uint32_t sent = send(f.partner, input, {});
    recv(f.partner, all, deps_of({sent}));  // in place, this rewrites the own block just sent
    return s;
  }
  std::vector<std::uint32_t> written;  // the steps that filled what this rank has so far
  if (input.count > 0) written.push_back(s.copy(Region{Buffer::output, offsets[r], input.count}, input));
  if (f.receives_fold()) {
    const auto q = static_cast<std::size_t>(f.partner);
    add(written, recv(f.partner, Region{Buffer::output, offsets[q], offsets[q + 1] - offsets[q]}, {}));
  }
  for (int k = 0; k < f.steps; ++k) {
    const int mine = (f.vrank >> k) << k, theirs = mine ^ (1 << k), peer = f.real(f.vrank ^ (1 << k));
    send(peer, run_of(f, offsets, mine, mine + (1 << k)), written);
    add(written, recv(peer, run_of(f, offsets, theirs, theirs + (1 << k)), {}));
  }
  if (f.receives_fold()) send(f.partner, all, written);
  return s;
}

}  // namespace tutti::schedule
