// Binomial-tree reduce to Params::root: ceil(log2 p) rounds of whole-buffer messages, for small
// and medium messages. Relative rank v (rank - root mod p) reduces its children v + m (powers of
// two m < lowbit(v), v + m < p; any p works) into an accumulator, smallest subtree first since it
// is ready first, then sends the accumulator to its parent v - lowbit(v).
// Non-roots have no output buffer, so they accumulate in scratch; a leaf sends its input as is.
// The root accumulates in output; its first reduction reads input, which keeps input == output
// (in place) correct.
#include "schedule/algorithms.hpp"

namespace tutti::schedule {

Schedule reduce_binomial_tree(const Params& params) {
  Schedule s;
  const int p = params.size;
  const std::size_t n = params.count;
  if (n == 0) return s;
  const int v = (params.rank - params.root + p) % p;
  auto absolute = [&](int relative) { return (relative + params.root) % p; };
  const Region input{Buffer::input, 0, n};
  const Region acc{v == 0 ? Buffer::output : Buffer::scratch, 0, n};

  Region operand = input;
  std::vector<std::uint32_t> reduced;
  int mask = 1;
  for (; mask < p && (v & mask) == 0; mask <<= 1) {
    if (v + mask >= p) continue;
    reduced = {s.recv_reduce(absolute(v + mask), acc, operand, reduced)};
    operand = acc;
  }
  if (v == 0) {
    if (reduced.empty()) s.copy(acc, input);  // p == 1: nobody to reduce with
    return s;
  }
  if (!reduced.empty()) s.scratch_count = n;
  s.send(absolute(v - mask), reduced.empty() ? input : acc, reduced);
  return s;
}

}  // namespace tutti::schedule
