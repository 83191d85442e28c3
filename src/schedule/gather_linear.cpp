// Linear gather: every rank sends its block straight to the root, which receives p-1 messages
// into their slots. One round of latency but p-1 messages into one rank: for small p or for
// large blocks where the root's link is the bottleneck anyway. Any p, any root.
// Linear scatter is its mirror: the root sends every other rank its block directly.
#include "schedule/algorithms.hpp"

namespace tutti::schedule {

Schedule gather_linear(const Params& params) {
  Schedule s;
  const std::size_t c = params.count;
  if (c == 0) return s;
  const Region input{Buffer::input, 0, c};
  if (params.rank != params.root) {
    s.send(params.root, input);
    return s;
  }
  for (int j = 0; j < params.size; ++j) {
    const Region slot{Buffer::output, j * c, c};
    if (j == params.root)
      s.copy(slot, input);  // elided in place (input is this slot)
    else
      s.recv(j, slot);
  }
  return s;
}

Schedule scatter_linear(const Params& params) { return mirror(gather_linear(params)); }

}  // namespace tutti::schedule
