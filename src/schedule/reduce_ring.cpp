// Pipelined chain reduce: root+1 -> root+2 -> ... -> root, the buffer cut into chunks
// (Params::chunk_bytes). Each hop reduces chunk c with its own input as soon as it arrives and
// passes it on, so for large messages the time approaches one buffer's transfer and reduction
// plus p-2 chunk latencies. Intermediate ranks have no output, so they reduce into scratch;
// the root reduces into output, reading input first (input == output in place is fine).
#include "schedule/algorithms.hpp"

namespace tutti::schedule {

Schedule reduce_ring(const Params& params) {
  Schedule s;
  const int p = params.size;
  const std::size_t n = params.count;
  if (n == 0) return s;
  if (p == 1) {
    s.copy({Buffer::output, 0, n}, {Buffer::input, 0, n});
    return s;
  }
  const int position = (params.rank - params.root - 1 + 2 * p) % p;  // 0 = root+1, p-1 = root
  const int prev = (params.rank - 1 + p) % p, next = (params.rank + 1) % p;
  const bool is_root = position == p - 1;
  if (position > 0 && !is_root) s.scratch_count = n;
  const std::size_t chunks = chunks_for(params, n);

  for (std::size_t c = 0; c < chunks; ++c) {
    const std::size_t offset = block_offset(n, chunks, c), count = block_count(n, chunks, c);
    const Region input{Buffer::input, offset, count};
    if (position == 0) {
      s.send(next, input);
      continue;
    }
    const Region acc{is_root ? Buffer::output : Buffer::scratch, offset, count};
    const std::uint32_t reduced = s.recv_reduce(prev, acc, input);
    if (!is_root) s.send(next, acc, {reduced});
  }
  return s;
}

}  // namespace tutti::schedule
