// Pipelined chain broadcast: root -> root+1 -> ... -> root+p-1, the buffer cut into chunks
// (Params::chunk_bytes). Each rank forwards chunk c as soon as it has arrived, so for large
// messages the time approaches one buffer's transfer plus p-2 chunk latencies.
#include "schedule/algorithms.hpp"

namespace tutti::schedule {

Schedule broadcast_ring(const Params& params) {
  Schedule s;
  const int p = params.size;
  if (p <= 1 || params.count == 0) return s;
  const int position = (params.rank - params.root + p) % p;  // 0 = root, p-1 = end of the chain
  const int prev = (params.rank - 1 + p) % p, next = (params.rank + 1) % p;
  const std::size_t chunks = chunks_for(params, params.count);

  for (std::size_t c = 0; c < chunks; ++c) {
    const Region chunk{Buffer::output, block_offset(params.count, chunks, c), block_count(params.count, chunks, c)};
    std::vector<std::uint32_t> arrived;
    if (position > 0) arrived.push_back(s.recv(prev, chunk));
    if (position < p - 1) s.send(next, chunk, std::move(arrived));
  }
  return s;
}

}  // namespace tutti::schedule
