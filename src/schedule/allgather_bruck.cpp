// Bruck's allgather (and allgatherv), for any p in ceil(log2 p) rounds: in scratch, position j
// holds block (r + j) mod p; in round k (d = 2^k) rank r sends its first min(d, p - d) positions
// to r - d and receives as many into positions [d, ...) from r + d, whose first positions are
// exactly those blocks. A final local rotation moves the blocks to their places in output.
#include <algorithm>

#include "schedule/algorithms.hpp"

namespace tutti::schedule {

Schedule allgather_bruck(const Params& params) {
  Schedule s;
  const auto offsets = block_offsets(params);
  const int p = params.size, r = params.rank;
  const auto ur = static_cast<std::size_t>(r), np = static_cast<std::size_t>(p);
  const Region input{Buffer::input, 0, offsets[ur + 1] - offsets[ur]};
  if (offsets[np] == 0) return s;
  if (input.count > 0) s.copy(Region{Buffer::output, offsets[ur], input.count}, input);  // elided in place
  if (p == 1) return s;
  // at[j]: scratch offset of position j (block (r + j) mod p), packed in position order.
  std::vector<std::size_t> at(np + 1, 0);
  for (std::size_t j = 0; j < np; ++j) {
    const std::size_t b = (ur + j) % np;
    at[j + 1] = at[j] + offsets[b + 1] - offsets[b];
  }
  s.scratch_count = at[np];
  auto positions = [&](std::size_t from, std::size_t to) {
    return Region{Buffer::scratch, at[from], at[to] - at[from]};
  };
  std::vector<std::uint32_t> have;  // steps that filled scratch positions so far
  if (input.count > 0 && p > 2) have.push_back(s.copy(positions(0, 1), input));  // sent again from round 1
  for (std::size_t d = 1; d < np; d *= 2) {
    const std::size_t n = std::min(d, np - d);
    const int to = (r - static_cast<int>(d) + p) % p, from = (r + static_cast<int>(d)) % p;
    // Round 0 sends only the own block: straight from input, without waiting for the copy.
    const Region out = d == 1 ? input : positions(0, n);
    if (out.count > 0) s.send(to, out, d == 1 ? std::vector<std::uint32_t>{} : have);
    const Region in = positions(d, d + n);
    if (in.count > 0) have.push_back(s.recv(from, in));
  }
  // Rotate: positions 1..p-1-r are blocks r+1..p-1, positions p-r..p-1 are blocks 0..r-1.
  const Region after = positions(1, np - ur), before = positions(np - ur, np);
  if (after.count > 0) s.copy(Region{Buffer::output, offsets[ur + 1], after.count}, after, have);
  if (before.count > 0) s.copy(Region{Buffer::output, 0, before.count}, before, have);
  return s;
}

}  // namespace tutti::schedule
