// Folding a non-power-of-two group onto a power of two (Thakur, Rabenseifner & Gropp 2005):
// with p = pof2 + rest, the first 2·rest ranks pair up; each even one hands its data to its odd
// neighbour and sits out the power-of-two phase, and gets the result back at the end. The odd
// one of a pair and every rank ≥ 2·rest take part under a virtual rank in [0, pof2).
#pragma once

#include <bit>
#include <cstdint>
#include <vector>

#include "schedule/schedule.hpp"

namespace tutti::schedule {

struct Fold {
  int size = 1;      // p
  int pof2 = 1;      // largest power of two ≤ p
  int rest = 0;      // p - pof2
  int rank = 0;      // real rank
  int vrank = 0;     // virtual rank in [0, pof2), -1 for an even rank that sits out
  int partner = -1;  // the other rank of this rank's pair, -1 when not paired (rank ≥ 2·rest)
  int steps = 0;     // log2(pof2): rounds of the power-of-two phase

  bool folded() const { return rest > 0; }
  bool sits_out() const { return vrank < 0; }
  bool receives_fold() const { return partner >= 0 && vrank >= 0; }  // the odd rank of a pair
  /// The real rank that plays virtual rank v.
  int real(int v) const { return v < rest ? 2 * v + 1 : v + rest; }
  /// The first real rank whose data virtual rank v carries (v carries real ranks first(v)..first(v+1)-1).
  int first(int v) const { return v < rest ? 2 * v : v + rest; }
};

inline Fold fold(int rank, int size) {
  Fold f;
  f.size = size;
  f.rank = rank;
  f.pof2 = static_cast<int>(std::bit_floor(static_cast<unsigned>(size)));
  f.rest = size - f.pof2;
  f.steps = std::countr_zero(static_cast<unsigned>(f.pof2));
  if (rank < 2 * f.rest) {
    f.partner = rank % 2 == 0 ? rank + 1 : rank - 1;
    f.vrank = rank % 2 == 0 ? -1 : rank / 2;
  } else {
    f.vrank = rank - f.rest;
  }
  return f;
}

/// `x`'s low `bits` bits in reverse order: the position of virtual rank x where the rounds pair
/// the nearest ranks first (bit 0, then bit 1, ...) and the ranges they split stay contiguous.
inline int reversed(int x, int bits) {
  int out = 0;
  for (int i = 0; i < bits; ++i) out |= ((x >> i) & 1) << (bits - 1 - i);
  return out;
}

/// The power-of-two phase of an allreduce, run by every rank that does not sit out: `from`
/// (input, or output on a rank that received a fold) holds this rank's contribution after step
/// `ready` (no_step: at once). Returns the steps after which output holds the full sum (no_step
/// entries are dropped).
using PowerOfTwoPhase = std::vector<std::uint32_t> (*)(Schedule& s, const Fold& f, Region from, std::uint32_t ready);

/// An allreduce for any p from a phase that needs a power of two: a rank that sits out hands its
/// input to its partner and gets the result back; its partner reduces it in first and sends the
/// result back after `phase`. p = 1 or count = 0 is a local copy.
Schedule folded_allreduce(const Params& params, PowerOfTwoPhase phase);

}  // namespace tutti::schedule
