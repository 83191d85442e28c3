// The inline path of the direct collectives: a collective whose input fits in a signature slot
// publishes it there with its signature, and each rank computes its result from its peers' slots
// (see the top of direct.cpp, and carry_inline in shm.cpp).
#include "transport/shm/direct_run.hpp"

namespace tutti::transport::shm {

// The input a rank publishes: all of it (reduce_scatter: every block), the root's for broadcast.
// A broadcast waits for no rank but the root: the root is done once its input is published, a
// receiver once it has the root's. A collective of no elements waits for no rank: it is done once
// its signature is published (as MPI returns from one at once, but compared all the same). Their signatures are
// compared all the same, by whichever of each pair publishes later; a mismatch found after a rank's broadcast returned
// aborts the communicator, and that rank's next call raises it (nothing was written into its buffer from a mismatched
// call: a receiver compared the root's signature before it copied).
void DirectRun::bind(const Signature& signature) {
  seq_ = signature.seq;
  const std::size_t p = static_cast<std::size_t>(size());
  const std::size_t input = (kind_ == Collective::reduce_scatter ? p : 1) * count_ * esize_;
  if (seq_ == no_seq || input > inline_bytes) return;
  inline_ = true;
  wire_ = to_wire(signature);
  const bool publishes = kind_ != Collective::broadcast || rank() == root_;
  transport_.carry_inline(seq_, publishes ? (kind_ == Collective::broadcast ? recv_ : send_) : nullptr,
                          publishes ? input : 0, wire_);
}

bool DirectRun::progress_inline(bool arrange_wake) {
  try {
    if (const auto failure = transport_.aborted()) throw failure->error;
    for (; next_peer_ < size(); ++next_peer_) {
      if (!needs(next_peer_)) continue;
      if (!transport_.inline_input(next_peer_, seq_, wire_, arrange_wake)) {
        if (arrange_wake) check_deadline_and_liveness();
        return false;
      }
    }
    deliver_inline();
    consumed_ = true;
    transport_.consumed_inline(seq_);
    return true;
  } catch (const Error& error) {
    fail(error);
  }
}

void DirectRun::deliver_inline() {
  const int p = size(), r = rank();
  const std::size_t bytes = count_ * esize_;
  if (bytes == 0) return;
  if (kind_ == Collective::allreduce || kind_ == Collective::reduce_scatter) {
    const std::size_t offset = kind_ == Collective::reduce_scatter ? static_cast<std::size_t>(r) * bytes : 0;
    reduce_parts(recv_, count_, [&](int q) { return input_of(q) + offset; });
  } else if (kind_ == Collective::allgather) {
    const bool in_place = send_ == recv_ + static_cast<std::size_t>(r) * bytes;
    for (int q = 0; q < p; ++q)
      if (q != r || !in_place) std::memcpy(recv_ + static_cast<std::size_t>(q) * bytes, input_of(q), bytes);
  } else if (r != root_) {  // broadcast
    std::memcpy(recv_, input_of(root_), bytes);
  }
  deliver_staged();
}

}  // namespace tutti::transport::shm
