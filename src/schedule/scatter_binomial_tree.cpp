// Binomial-tree scatter, the mirror of gather_binomial_tree: ceil(log2 p) rounds, for small
// blocks. Relative rank v (rank - root mod p) receives its whole subtree's blocks, relative ranks
// [v, v + min(lowbit(v), p - v)), from its parent into scratch, keeps its own and forwards each
// child's range (largest subtree first, as it has the most rounds ahead). Any p, any root.
// Only the root has an input (absolute rank order): a child's range that wraps past rank p-1 is
// packed into scratch from the input's end and start before it is sent.
#include <algorithm>

#include "schedule/algorithms.hpp"

namespace tutti::schedule {
namespace {

void scatter_from_root(Schedule& s, const Params& params) {
  const int p = params.size, root = params.root;
  const std::size_t c = params.count;
  s.copy({Buffer::output, 0, c}, {Buffer::input, root * c, c});  // elided in place
  int top = 1;
  while (top < p) top <<= 1;
  for (int m = top >> 1; m > 0; m >>= 1) {
    const int first = (root + m) % p, n = std::min(m, p - m);  // child's range, absolute start
    if (first + n <= p) {
      s.send(first, {Buffer::input, first * c, n * c});
      continue;
    }
    const int head = p - first;  // blocks before the wrap; at most one child's range wraps
    s.scratch_count = n * c;
    const std::uint32_t a = s.copy({Buffer::scratch, 0, head * c}, {Buffer::input, first * c, head * c});
    const std::uint32_t b = s.copy({Buffer::scratch, head * c, (n - head) * c}, {Buffer::input, 0, (n - head) * c});
    s.send(first, {Buffer::scratch, 0, n * c}, {a, b});
  }
}

}  // namespace

Schedule scatter_binomial_tree(const Params& params) {
  Schedule s;
  const int p = params.size;
  const std::size_t c = params.count;
  if (c == 0) return s;
  const int v = (params.rank - params.root + p) % p;
  if (v == 0) {
    scatter_from_root(s, params);
    return s;
  }
  auto absolute = [&](int relative) { return (relative + params.root) % p; };
  int mask = 1;
  while ((v & mask) == 0) mask <<= 1;
  const int subtree = std::min(mask, p - v);
  const Region output{Buffer::output, 0, c};
  if (subtree == 1) {
    s.recv(absolute(v - mask), output);
    return s;
  }
  s.scratch_count = subtree * c;
  const std::uint32_t got = s.recv(absolute(v - mask), {Buffer::scratch, 0, subtree * c});
  s.copy(output, {Buffer::scratch, 0, c}, {got});
  for (int m = mask >> 1; m > 0; m >>= 1)
    if (v + m < p) s.send(absolute(v + m), {Buffer::scratch, m * c, std::min(m, p - v - m) * c}, {got});
  return s;
}

}  // namespace tutti::schedule
