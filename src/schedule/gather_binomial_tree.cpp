// Binomial-tree gather: ceil(log2 p) rounds instead of the linear gather's p-1 messages into the
// root, for small blocks. Ranks are relative to the root (v = rank - root mod p), so any root and
// any p work: v's subtree is the relative ranks [v, v + min(lowbit(v), p - v)); v collects its
// children's subtrees (v + m for powers of two m < lowbit(v)) next to its own block in scratch,
// contiguous in relative order, and sends the whole range to its parent v - lowbit(v).
// Only the root has an output (absolute rank order), so a child's relative range that wraps past
// rank p-1 lands in scratch first and is split into the output's end and start.
//
// Binomial-tree scatter is its mirror (schedule::mirror): v receives its subtree's blocks from
// its parent into scratch, keeps its own and forwards each child's range, largest subtree (the
// one with the most rounds ahead) first; the root packs a wrapping range from its input's end
// and start into scratch before sending it.
#include <algorithm>

#include "schedule/algorithms.hpp"

namespace tutti::schedule {
namespace {

void gather_at_root(Schedule& s, const Params& params) {
  const int p = params.size, root = params.root;
  const std::size_t c = params.count;
  s.copy({Buffer::output, root * c, c}, {Buffer::input, 0, c});  // elided in place
  for (int m = 1; m < p; m <<= 1) {
    const int first = (root + m) % p, n = std::min(m, p - m);  // child's range, absolute start
    if (first + n <= p) {
      s.recv(first, {Buffer::output, first * c, n * c});
      continue;
    }
    const int head = p - first;  // blocks before the wrap; at most one child's range wraps
    s.scratch_count = n * c;
    const std::uint32_t got = s.recv(first, {Buffer::scratch, 0, n * c});
    s.copy({Buffer::output, first * c, head * c}, {Buffer::scratch, 0, head * c}, {got});
    s.copy({Buffer::output, 0, (n - head) * c}, {Buffer::scratch, head * c, (n - head) * c}, {got});
  }
}

}  // namespace

Schedule gather_binomial_tree(const Params& params) {
  Schedule s;
  const int p = params.size;
  const std::size_t c = params.count;
  if (c == 0) return s;
  const int v = (params.rank - params.root + p) % p;
  if (v == 0) {
    gather_at_root(s, params);
    return s;
  }
  auto absolute = [&](int relative) { return (relative + params.root) % p; };
  int mask = 1;
  while ((v & mask) == 0) mask <<= 1;
  const int subtree = std::min(mask, p - v);
  const Region input{Buffer::input, 0, c};
  if (subtree == 1) {
    s.send(absolute(v - mask), input);
    return s;
  }
  s.scratch_count = subtree * c;
  std::vector<std::uint32_t> gathered = {s.copy({Buffer::scratch, 0, c}, input)};
  for (int m = 1; m < mask && v + m < p; m <<= 1)
    gathered.push_back(s.recv(absolute(v + m), {Buffer::scratch, m * c, std::min(m, p - v - m) * c}));
  s.send(absolute(v - mask), {Buffer::scratch, 0, subtree * c}, gathered);
  return s;
}

Schedule scatter_binomial_tree(const Params& params) { return mirror(gather_binomial_tree(params)); }

}  // namespace tutti::schedule
