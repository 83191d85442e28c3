// Linear scatter: the root sends every other rank its block directly. One round of latency but
// p-1 messages out of one rank: for small p or large blocks. Any p, any root.
#include "schedule/algorithms.hpp"

namespace tutti::schedule {

Schedule scatter_linear(const Params& params) {
  Schedule s;
  const std::size_t c = params.count;
  if (c == 0) return s;
  const Region output{Buffer::output, 0, c};
  if (params.rank != params.root) {
    s.recv(params.root, output);
    return s;
  }
  for (int j = 0; j < params.size; ++j) {
    const Region slot{Buffer::input, j * c, c};
    if (j == params.root)
      s.copy(output, slot);  // elided in place (output is this slot)
    else
      s.send(j, slot);
  }
  return s;
}

}  // namespace tutti::schedule
