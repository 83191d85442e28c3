// Dissemination barrier (Bruck's pattern, Algorithm::bruck): in round k rank r signals
// r + 2^k and waits for r - 2^k (mod p), each round after the previous one. After
// ceil(log2 p) rounds every rank has heard, directly or through others, from every rank;
// unlike a tree it needs no power of two and has no root to serialize on.
#include "schedule/algorithms.hpp"

namespace tutti::schedule {

Schedule barrier_dissemination(const Params& params) {
  Schedule s;
  const int p = params.size, r = params.rank;
  const Region signal{Buffer::scratch, 0, 0};  // messages carry no data
  std::vector<std::uint32_t> previous;
  for (int distance = 1; distance < p; distance <<= 1) {
    const std::uint32_t sent = s.send((r + distance) % p, signal, previous);
    const std::uint32_t heard = s.recv((r - distance + p) % p, signal, previous);
    previous = {sent, heard};
  }
  return s;
}

}  // namespace tutti::schedule
