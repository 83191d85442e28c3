// Binomial-tree broadcast: ceil(log2 p) rounds of whole-buffer messages, for small and medium
// messages where latency dominates. Ranks are taken relative to the root, so any root and any p
// (not only powers of two) give the same tree: relative rank v receives from v - lowbit(v) and
// forwards to v + m for every power of two m < lowbit(v) with v + m < p (the root: every m < p).
#include "schedule/algorithms.hpp"

namespace tutti::schedule {

Schedule broadcast_binomial_tree(const Params& params) {
  Schedule s;
  const int p = params.size;
  if (p <= 1 || params.count == 0) return s;
  const int v = (params.rank - params.root + p) % p;
  auto absolute = [&](int relative) { return (relative + params.root) % p; };
  const Region all{Buffer::output, 0, params.count};

  int mask = 1;
  std::vector<std::uint32_t> received;
  for (; mask < p; mask <<= 1) {
    if (v & mask) {
      received.push_back(s.recv(absolute(v - mask), all));
      break;
    }
  }
  // Largest subtree first: it has the most rounds still ahead of it.
  for (mask >>= 1; mask > 0; mask >>= 1)
    if (v + mask < p) s.send(absolute(v + mask), all, received);
  return s;
}

}  // namespace tutti::schedule
