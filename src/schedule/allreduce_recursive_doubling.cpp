// Recursive-doubling allreduce: log2(p) rounds in which partners v and v^2^k exchange their whole
// partial sums, so every rank holds the full sum after the last round. Non-powers of two fold
// (fold.hpp): the first 2·rest ranks pair up, the even one's input is reduced into its odd
// neighbour first and the result is sent back to it at the end (two extra rounds).
//
// A round cannot reduce into the buffer it is sending from (the send would read what the
// receive writes, and ordering them would deadlock the pair), so rounds alternate between
// output and scratch, chosen backwards so that the last round writes output. The first round
// never writes output, which in place is the input it reads from.
#include "schedule/algorithms.hpp"
#include "schedule/fold.hpp"

namespace tutti::schedule {

namespace {

// The region round k reduces into (rounds = f.steps), per the alternation above: output and
// scratch[0, count) alternate; round 0 of an odd count of rounds takes scratch[count, 2count)
// instead of output (scratch[0, count) for a single round).
Region round_target(int k, int rounds, std::size_t count) {
  const bool to_output = (rounds - 1 - k) % 2 == 0;
  if (k == 0 && to_output) return Region{Buffer::scratch, rounds > 1 ? count : 0, count};
  return to_output ? Region{Buffer::output, 0, count} : Region{Buffer::scratch, 0, count};
}

std::size_t scratch_for(int rounds, std::size_t count) { return (rounds % 2 == 1 && rounds > 1 ? 2 : 1) * count; }

// The log2(pof2) exchanges (a PowerOfTwoPhase).
std::vector<std::uint32_t> exchange(Schedule& s, const Fold& f, Region from, std::uint32_t ready) {
  const std::size_t count = from.count;
  s.scratch_count = scratch_for(f.steps, count);
  std::uint32_t sent = no_step, reduced = ready;
  for (int k = 0; k < f.steps; ++k) {
    const int peer = f.real(f.vrank ^ (1 << k));
    const Region to = round_target(k, f.steps, count);
    const std::uint32_t send = s.send(peer, from, deps_of({reduced}));
    // After the previous send too: `to` is what that round read, two rounds back.
    reduced = s.recv_reduce(peer, to, from, deps_of({reduced, sent}));
    sent = send;
    from = to;
  }
  if (from.buffer == Buffer::output) return {reduced};
  return {s.copy(Region{Buffer::output, 0, count}, from, deps_of({reduced, sent}))};  // one round: p = 2 or 3
}

}  // namespace

Schedule allreduce_recursive_doubling(const Params& params) { return folded_allreduce(params, exchange); }

}  // namespace tutti::schedule
