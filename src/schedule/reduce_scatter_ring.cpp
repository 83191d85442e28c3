// Ring reduce_scatter: in step s rank r sends its partial sum of block r-s-1 to r+1 and reduces
// block r-s-2 arriving from r-1 with its own input, so after p-1 steps it holds block r summed
// over all ranks. Blocks move in chunks (chunks_for) and chunk k is forwarded as soon as it has
// been reduced, so the steps pipeline.
//
// Partial sums of other ranks' blocks live in two scratch slots used alternately (output is a
// single block); a slot's chunk is reduced into again only after the send that read it two steps
// earlier completed. The rank's own block is never sent, and its one reduction reads input and
// writes output, so the schedule is the same in place (output == input + r·count).
#include "schedule/algorithms.hpp"

namespace tutti::schedule {

Schedule reduce_scatter_ring(const Params& params) {
  Schedule s;
  const int p = params.size, r = params.rank;
  const std::size_t c = params.count;
  if (p == 1 || c == 0) {
    if (c > 0) s.copy(Region{Buffer::output, 0, c}, Region{Buffer::input, 0, c});  // elided in place
    return s;
  }
  const int right = (r + 1) % p, left = (r + p - 1) % p;
  const std::size_t chunks = chunks_for(params, c);
  auto block = [&](int shift) { return static_cast<std::size_t>(((r + shift) % p + p) % p) * c; };
  s.scratch_count = p > 2 ? 2 * c : 0;
  // Per chunk: the latest reduction and the sends of the last two steps (slot reuse).
  std::vector<std::uint32_t> reduced(chunks, no_step), sent(chunks, no_step), sent_before(chunks, no_step);
  for (int step = 0; step < p - 1; ++step) {
    for (std::size_t k = 0; k < chunks; ++k) {
      const std::size_t lo = block_offset(c, chunks, k), n = block_count(c, chunks, k);
      const Region from = step == 0 ? Region{Buffer::input, block(-1) + lo, n}
                                    : Region{Buffer::scratch, static_cast<std::size_t>((step - 1) % 2) * c + lo, n};
      sent_before[k] = sent[k];
      sent[k] = s.send(right, from, deps_of({reduced[k]}));
    }
    const bool last = step == p - 2;
    for (std::size_t k = 0; k < chunks; ++k) {
      const std::size_t lo = block_offset(c, chunks, k), n = block_count(c, chunks, k);
      const Region to = last ? Region{Buffer::output, lo, n}
                             : Region{Buffer::scratch, static_cast<std::size_t>(step % 2) * c + lo, n};
      // sent_before read this slot's chunk (step - 2's partial sum) one step ago.
      reduced[k] = s.recv_reduce(left, to, Region{Buffer::input, block(-step - 2) + lo, n},
                                 deps_of({reduced[k], sent_before[k]}));
    }
  }
  return s;
}

}  // namespace tutti::schedule
