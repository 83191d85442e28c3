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
  if (seq_ == no_seq) return;
  // (Alltoallv never runs inline: its blocks' sizes are not known alike on every rank.)
  if (kind_ == Collective::alltoallv || largest_publication(kind_, largest_, esize_, size()) > inline_bytes)
    return describe(signature);
  inline_ = true;
  wire_ = to_wire(signature);
  const Publication mine = publication(kind_, send_, recv_, count_, esize_, rank(), size(), root_);
  transport_.carry_inline(seq_, mine.data, mine.bytes, wire_);
}

bool DirectRun::progress_inline(bool arrange_wake) {
  try {
    // Complete once every publication it needs is there (each compared with this rank's
    // signature), even if the communicator was aborted meanwhile: every rank did enter it, and the
    // abort (a later call's mismatch, another rank's error) is raised by this rank's next call.
    for (; next_peer_ < size(); ++next_peer_) {
      if (!needs(next_peer_)) continue;
      if (!transport_.inline_input(next_peer_, seq_, wire_, arrange_wake)) {
        if (const auto failure = transport_.aborted()) throw failure->error;
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
  combine_inline(kind_, send_, recv_, count_, starts_, type_, op_, root_, rank(), size(),
                 [&](int q) { return input_of(q); });
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
  if (algorithm != Algorithm::direct || !serves(kind) || kind == Collective::alltoallv) return false;
  const std::size_t p = static_cast<std::size_t>(size_), esize = size_of(call.type);
  const bool reduces =
      kind == Collective::allreduce || kind == Collective::reduce_scatter || kind == Collective::reduce;
  const bool uneven = kind == Collective::allgatherv;
  const std::size_t largest =
      uneven && !call.counts.empty() ? *std::max_element(call.counts.begin(), call.counts.end()) : call.count;
  if (largest > inline_bytes || largest_publication(kind, largest, esize, size_) > inline_bytes ||
      (reduces && !call.op) ||
      (input_blocks(kind) && segment_->layout().direct_chunk / esize < p))  // start_direct's refusal
    return false;
  auto* recv = static_cast<std::byte*>(call.recv);
  // A broadcast has one buffer, which is its input on the root; no in-place form to map.
  const std::byte* send = kind == Collective::broadcast ? recv : map_in_place(call, rank_).input;
  const Publication mine = publication(kind, send, recv, call.count, esize, rank_, size_, call.root);
  const std::vector<std::size_t> starts = uneven ? block_starts(call.counts) : std::vector<std::size_t>{};
  const std::size_t elements = uneven ? starts.back() : call.count;
  // Whether this rank reads any peer's publication (a broadcast's root does not, nor does a
  // collective of no elements, see bind).
  const bool reads = reads_any(kind, rank_, call.root, elements, size_);
  const std::uint64_t seq = signature.seq;
  const WireSignature wire = to_wire(signature);

  std::unique_lock lock(publication_mutex_);
  if (!unpublished_.empty() || !reading_.empty() || !carried_.empty() || !slot_free_locked(seq)) return false;
  announced_[seq % announced_.size()] = {seq, wire};
  if (reads) reading_.push_back(seq);
  publish_locked(seq, wire, mine.data, mine.bytes);
  const auto consumed = [&] {
    reading_.pop_back();
    store_consumed_locked();
  };
  int next = 0;  // ranks below have published
  // As DirectRun::progress_inline: done once every publication it needs is there; an abort
  // (a mismatch publish_locked found, or any rank's error) is raised only while it still waits.
  for (int spin = 0; spin < finish_spins; ++spin) {
    try {  // a peer's signature that differs aborts, and is raised (inline_input)
      for (; reads && next < size_; ++next)
        if (next != rank_ && reads_from(kind, next, rank_, call.root, elements) &&
            !inline_input(next, seq, wire, false))
          break;
    } catch (const Error&) {
      consumed();
      throw;
    }
    if (!reads || next == size_) {  // (a scatter's root still takes its own block)
      combine_inline(kind, send, recv, call.count, starts, call.type, call.op.value_or(ReduceOp::sum), call.root, rank_,
                     size_, [&](int q) { return segment_->signature_slot(q, seq).data; });
      if (reads) consumed();
      return true;
    }
    if (const auto failure = aborted()) {
      consumed();
      throw failure->error;
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
