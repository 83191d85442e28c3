// Allreduce as a binomial-tree reduce to rank 0 followed by a binomial-tree broadcast from 0:
// 2·ceil(log2 p) rounds of whole-buffer messages, for small messages on any p.
#include "schedule/algorithms.hpp"

namespace tutti::schedule {

Schedule allreduce_binomial_tree(const Params& params) {
  Params reduce = params;
  reduce.collective = Collective::reduce;
  reduce.root = 0;
  Schedule s = reduce_binomial_tree(reduce);
  // In allreduce every rank owns an output buffer, so the non-roots' reduce accumulator (its
  // only scratch, [0, count)) moves into output: no scratch, and the broadcast overwrites it
  // only after the reduce phase has sent it.
  for (Step& step : s.steps) {
    if (step.region.buffer == Buffer::scratch) step.region.buffer = Buffer::output;
    if (step.operand.buffer == Buffer::scratch) step.operand.buffer = Buffer::output;
  }
  s.scratch_count = 0;

  Params broadcast = params;
  broadcast.collective = Collective::broadcast;
  broadcast.root = 0;
  append(s, broadcast_binomial_tree(broadcast), sinks(s));
  return s;
}

}  // namespace tutti::schedule
