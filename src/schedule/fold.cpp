#include "schedule/fold.hpp"

#include "schedule/algorithms.hpp"

namespace tutti::schedule {

Schedule folded_allreduce(const Params& params, PowerOfTwoPhase phase) {
  Schedule s;
  const std::size_t c = params.count;
  const Region input{Buffer::input, 0, c}, output{Buffer::output, 0, c};
  if (params.size == 1 || c == 0) {
    if (c > 0) s.copy(output, input);
    return s;
  }
  const Fold f = fold(params.rank, params.size);
  if (f.sits_out()) {
    const std::uint32_t sent = s.send(f.partner, input);
    s.recv(f.partner, output, {sent});  // in place, output is the input just sent
    return s;
  }
  const std::uint32_t ready = f.receives_fold() ? s.recv_reduce(f.partner, output, input) : no_step;
  auto complete = phase(s, f, f.receives_fold() ? output : input, ready);
  std::erase(complete, no_step);
  if (f.receives_fold()) s.send(f.partner, output, complete);
  return s;
}

}  // namespace tutti::schedule
