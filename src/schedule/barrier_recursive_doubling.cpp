// Recursive-doubling barrier (Algorithm::recursive_doubling): in round k rank v exchanges a signal
// with v ^ 2^k, each round after the previous one, so after log2 p rounds every rank has heard,
// through its partners, from every rank. It pairs the nearest ranks first: where ranks lie in
// blocks of a power of two on hosts, the first rounds stay within each host and only the last
// ones cross (2 hosts x 2 ranks: one round across, where dissemination's two rounds both carry a
// message between the hosts). Non-powers of two fold (fold.hpp): an even rank of the first
// 2·rest signals its odd neighbour, which enters the power-of-two phase once it has, and
// releases it after: two more messages on the rank that folds.
#include "schedule/algorithms.hpp"
#include "schedule/fold.hpp"

namespace tutti::schedule {

Schedule barrier_recursive_doubling(const Params& params) {
  Schedule s;
  const Fold f = fold(params.rank, params.size);
  const Region signal{Buffer::scratch, 0, 0};  // messages carry no data
  if (f.sits_out()) {
    const std::uint32_t entered = s.send(f.partner, signal);
    s.recv(f.partner, signal, deps_of({entered}));
    return s;
  }
  std::vector<std::uint32_t> previous;
  if (f.receives_fold()) previous = {s.recv(f.partner, signal)};
  for (int k = 0; k < f.steps; ++k) {
    const int peer = f.real(f.vrank ^ (1 << k));
    const std::uint32_t sent = s.send(peer, signal, previous);
    const std::uint32_t heard = s.recv(peer, signal, previous);
    previous = {sent, heard};
  }
  if (f.receives_fold()) s.send(f.partner, signal, previous);
  return s;
}

}  // namespace tutti::schedule
