// Ring allgather (and allgatherv): in step s rank r forwards block r-s to r+1 and receives block
// r-s-1 from r-1. Each block travels in chunks, and chunk k of a block is forwarded as soon as
// it has arrived, so the p-1 steps pipeline instead of running one after another.
#include "schedule/algorithms.hpp"

namespace tutti::schedule {

Schedule allgather_ring(const Params& params) {
  const int p = params.size, r = params.rank;
  const auto offsets = block_offsets(params);
  const auto own = static_cast<std::size_t>(r);
  Schedule s;
  const Region input{Buffer::input, 0, offsets[own + 1] - offsets[own]};
  if (input.count > 0) s.copy(Region{Buffer::output, offsets[own], input.count}, input);  // elided in place
  if (p == 1) return s;
  const int right = (r + 1) % p, left = (r + p - 1) % p;
  // arrived[b][k]: the recv of chunk k of block b (block r's own chunks come from input: none).
  std::vector<std::vector<std::uint32_t>> arrived(static_cast<std::size_t>(p));
  for (int step = 0; step < p - 1; ++step) {
    const auto out_block = static_cast<std::size_t>((r - step + p) % p);
    const auto in_block = static_cast<std::size_t>((r - step - 1 + 2 * p) % p);
    const std::size_t n_out = offsets[out_block + 1] - offsets[out_block];
    const std::size_t n_in = offsets[in_block + 1] - offsets[in_block];
    const std::size_t k_out = chunks_for(params, n_out), k_in = chunks_for(params, n_in);
    for (std::size_t k = 0; k < k_out; ++k) {
      const std::size_t lo = block_offset(n_out, k_out, k), n = block_count(n_out, k_out, k);
      if (n == 0) continue;
      if (step == 0)
        s.send(right, Region{Buffer::input, lo, n});  // own block straight from input
      else
        s.send(right, Region{Buffer::output, offsets[out_block] + lo, n}, {arrived[out_block][k]});
    }
    arrived[in_block].assign(k_in, no_step);
    for (std::size_t k = 0; k < k_in; ++k) {
      const std::size_t lo = block_offset(n_in, k_in, k), n = block_count(n_in, k_in, k);
      if (n > 0) arrived[in_block][k] = s.recv(left, Region{Buffer::output, offsets[in_block] + lo, n});
    }
  }
  return s;
}

}  // namespace tutti::schedule
