// The inline path of the direct collectives: a collective whose input fits in a signature slot
// publishes it there with its signature, and each rank computes its result from its peers' slots
// (see the top of direct.cpp, and carry_inline in shm.cpp).
#include "transport/in_place.hpp"
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
  const std::size_t input = (input_blocks(kind_) ? p : 1) * count_ * esize_;
  if (seq_ == no_seq) return;
  if (input > inline_bytes) return describe(signature);
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
  combine_inline(kind_, send_, recv_, count_, type_, op_, root_, rank(), size(), [&](int q) { return input_of(q); });
  deliver_staged();
}

// The short way of a blocking small direct collective on an idle communicator: what bind,
// announce, progress_inline and consumed_inline do over a DirectRun, here under one lock and
// without one. Declines (nothing done) unless this rank has no other collective announced or
// reading and the signature slot is free; then publishes the input with the signature, and reads
// its peers' inputs while they arrive within the spin a DirectRun would spin too. A late peer:
// a DirectRun takes over, in the state its announce would have left (published, reading), and
// waits as any does (timeouts, wake-ups, dead peers). A mismatch aborts, as inline_input does.
bool ShmTransport::run_now(Algorithm algorithm, const NativeCall& call, const Signature& signature,
                           std::chrono::milliseconds timeout) {
  const Collective kind = call.collective;
  if (algorithm != Algorithm::direct || !serves(kind)) return false;
  const std::size_t p = static_cast<std::size_t>(size_), esize = size_of(call.type);
  const std::size_t bytes = call.count * esize;
  const bool scatters = input_blocks(kind), broadcast = kind == Collective::broadcast;
  const bool reduces = kind == Collective::allreduce || kind == Collective::reduce_scatter;
  if (call.count > inline_bytes || (scatters ? p : 1) * bytes > inline_bytes || (reduces && !call.op) ||
      (scatters && segment_->layout().direct_chunk / esize < p))  // start_direct's refusal
    return false;
  auto* recv = static_cast<std::byte*>(call.recv);
  // A broadcast has one buffer, which is its input on the root; no in-place form to map.
  const std::byte* send = broadcast ? recv : map_in_place(call, rank_).input;
  const std::byte* input = broadcast ? (rank_ == call.root ? recv : nullptr) : send;
  const std::size_t input_bytes = input ? (scatters ? p : 1) * bytes : 0;
  // A broadcast's root needs no peer, nor does a collective of no elements (see bind).
  const bool reads = call.count > 0 && (!broadcast || rank_ != call.root);
  const std::uint64_t seq = signature.seq;
  const WireSignature wire = to_wire(signature);

  std::unique_lock lock(publication_mutex_);
  if (!unpublished_.empty() || !reading_.empty() || !carried_.empty() || !slot_free_locked(seq)) return false;
  announced_[seq % announced_.size()] = {seq, wire};
  if (reads) reading_.push_back(seq);
  publish_locked(seq, wire, input, input_bytes);
  const auto consumed = [&] {
    reading_.pop_back();
    store_consumed_locked();
  };
  int next = 0;  // ranks below have published
  for (int spin = 0; spin < finish_spins; ++spin) {
    if (const auto failure = aborted()) {  // a mismatch publish_locked found, or any rank's error
      if (reads) consumed();
      throw failure->error;
    }
    if (!reads) return true;
    try {  // a peer's signature that differs aborts, and is raised (inline_input)
      for (; next < size_; ++next)
        if (next != rank_ && (!broadcast || next == call.root) && !inline_input(next, seq, wire, false)) break;
    } catch (const Error&) {
      consumed();
      throw;
    }
    if (next == size_) {
      combine_inline(kind, send, recv, call.count, call.type, call.op.value_or(ReduceOp::sum), call.root, rank_, size_,
                     [&](int q) { return segment_->signature_slot(q, seq).data; });
      consumed();
      return true;
    }
    relax();
  }
  lock.unlock();
  auto run = start_direct(*this, call, timeout);
  static_cast<DirectRun&>(*run).adopt_published(signature, wire);
  transport::finish(*run, *this, signature, timeout);
  return true;
}

}  // namespace tutti::transport::shm
