// Ring allreduce: a ring reduce_scatter over p near-equal blocks of output, then a ring
// allgather of the reduced blocks. Every block moves in chunks (chunks_for), and chunk k of a
// block is forwarded as soon as it has arrived, so the 2(p-1) steps pipeline. Partial sums
// live in output: the one reduction a block gets on a rank reads input and writes output, so
// the schedule is the same in place; the allgather's receives wait for the reduce_scatter's
// send of the same block, which in place read that memory.
#include "schedule/algorithms.hpp"

namespace tutti::schedule {

namespace {

// Step indices per block and chunk (no_step where the chunk is empty or not yet emitted).
using ChunkSteps = std::vector<std::vector<std::uint32_t>>;

struct Ring {
  const Params& params;
  int p, r, right, left;
  std::size_t block_offset_of(std::size_t b) const { return block_offset(params.count, p, b); }
  std::size_t block_size(std::size_t b) const { return block_count(params.count, p, b); }
  std::size_t block_at(int shift) const { return static_cast<std::size_t>(((r + shift) % p + p) % p); }
  std::size_t chunks(std::size_t b) const { return chunks_for(params, block_size(b)); }
  // Region of chunk k of block b in `buffer`.
  Region chunk(Buffer buffer, std::size_t b, std::size_t k) const {
    const std::size_t n = block_size(b), parts = chunks(b);
    return Region{buffer, block_offset_of(b) + block_offset(n, parts, k), block_count(n, parts, k)};
  }
};

}  // namespace

Schedule allreduce_ring(const Params& params) {
  Schedule s;
  const int p = params.size, r = params.rank;
  if (p == 1 || params.count == 0) {
    if (params.count > 0) s.copy(Region{Buffer::output, 0, params.count}, Region{Buffer::input, 0, params.count});
    return s;
  }
  const Ring ring{params, p, r, (r + 1) % p, (r + p - 1) % p};
  const auto np = static_cast<std::size_t>(p);
  ChunkSteps sent(np), reduced(np), arrived(np);
  for (std::size_t b = 0; b < np; ++b)
    sent[b] = reduced[b] = arrived[b] = std::vector<std::uint32_t>(ring.chunks(b), no_step);
  for (int step = 0; step < p - 1; ++step) {  // reduce_scatter
    const std::size_t out = ring.block_at(-step), in = ring.block_at(-step - 1);
    for (std::size_t k = 0; k < ring.chunks(out); ++k) {
      const Region from = ring.chunk(step == 0 ? Buffer::input : Buffer::output, out, k);
      if (from.count > 0) sent[out][k] = s.send(ring.right, from, deps_of({reduced[out][k]}));
    }
    for (std::size_t k = 0; k < ring.chunks(in); ++k) {
      const Region to = ring.chunk(Buffer::output, in, k);
      if (to.count > 0) reduced[in][k] = s.recv_reduce(ring.left, to, ring.chunk(Buffer::input, in, k));
    }
  }
  for (int step = 0; step < p - 1; ++step) {  // allgather
    const std::size_t out = ring.block_at(1 - step), in = ring.block_at(-step);
    for (std::size_t k = 0; k < ring.chunks(out); ++k) {
      const Region from = ring.chunk(Buffer::output, out, k);
      const std::uint32_t ready = step == 0 ? reduced[out][k] : arrived[out][k];
      if (from.count > 0) s.send(ring.right, from, deps_of({ready}));
    }
    for (std::size_t k = 0; k < ring.chunks(in); ++k) {
      const Region to = ring.chunk(Buffer::output, in, k);
      if (to.count > 0) arrived[in][k] = s.recv(ring.left, to, deps_of({sent[in][k]}));
    }
  }
  return s;
}

}  // namespace tutti::schedule
