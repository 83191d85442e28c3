// The inline path of the direct collectives: a collective whose input fits in a signature slot
// publishes it there with its signature, and each rank computes its result from its peers' slots
// (see the top of direct.cpp, and carry_inline in shm.cpp).
#include <array>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include "core/copy.hpp"
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
  if (kind_ == Collective::alltoallv) return publish_alltoallv(signature);
  if (largest_publication(kind_, largest_, esize_, size()) > inline_bytes) return describe(signature);
  inline_ = true;
  wire_ = to_wire(signature);
  const Publication mine = publication(kind_, send_, recv_, count_, esize_, rank(), size(), root_);
  transport_.carry_inline(seq_, mine.data, mine.bytes, wire_);
}

// An alltoallv's blocks differ in size from rank to rank, so no rank can tell whether all its
// peers' inputs fit in their slots: each publishes what it can, and all decide from what all
// published, alike (alltoallv_from_slots); where some rank's did not fit, every rank goes on
// through the data set (run_exchange_phase).
void DirectRun::publish_alltoallv(const Signature& signature) {
  published_bytes_ = alltoallv_publication(published_.data(), send_, send_starts_, starts_, esize_);
  inline_ = true;
  wire_ = to_wire(signature);
  transport_.carry_inline(seq_, published_.data(), published_bytes_, wire_);
}

std::size_t alltoallv_publication(std::byte* out, const std::byte* send, std::span<const std::size_t> send_starts,
                                  std::span<const std::size_t> recv_starts, std::size_t esize) {
  const std::size_t p = send_starts.size() - 1, header = alltoallv_header_words(p) * sizeof(std::uint64_t);
  const std::size_t input = send_starts.back() * esize;
  auto* words = reinterpret_cast<std::uint64_t*>(out);
  words[0] = alltoallv_fits_inline(p, send_starts.back(), esize) ? 1 : 0;
  if (words[0] == 0) return sizeof(std::uint64_t);
  for (std::size_t q = 0; q <= p; ++q) words[1 + q] = send_starts[q], words[2 + p + q] = recv_starts[q];
  if (input > 0) core::copy(out + header, send, input);
  return header + input;
}

std::uint64_t take_alltoallv_header(const Segment& segment, int q, int r, const std::byte* from,
                                    std::span<const std::size_t> recv_starts, std::size_t room, bool flag_only,
                                    std::uint64_t* to) {
  const std::size_t up = recv_starts.size() - 1;
  std::memcpy(to, from, sizeof(std::uint64_t));  // the flag, read once; then the rest
  if (to[0] > 1) throw corrupt_segment(segment, q, "an alltoallv flag of " + std::to_string(to[0]));
  if (to[0] == 0 && flag_only) return 0;
  std::memcpy(to + 1, from + sizeof(std::uint64_t), (alltoallv_header_words(up) - 1) * sizeof(std::uint64_t));
  const std::uint64_t *sends = to + 1, *recvs = to + 2 + up;
  bool well_formed = sends[0] == 0 && recvs[0] == 0 && (to[0] == 0 || sends[up] <= room);
  for (std::size_t t = 0; t < up && well_formed; ++t)
    well_formed =
        sends[t] <= sends[t + 1] && recvs[t] <= recvs[t + 1] && (q != r || recvs[t + 1] == recv_starts[t + 1]);
  if (!well_formed) throw corrupt_segment(segment, q, "alltoallv displacements that do not fit its input or its call");
  return to[0];
}

// Every rank checks every pair in the same order, so that a disagreement fails every rank's call
// alike, before any result is written (and without a barrier to pass the error on).
void check_alltoallv_pairs(const std::uint64_t* all, int p, int r) {
  const auto up = static_cast<std::size_t>(p);
  const std::size_t words = alltoallv_header_words(up);
  const auto block = [&](int q, int t, std::size_t side) {  // side 1: sends, 2 + p: receives
    const std::uint64_t* starts = all + static_cast<std::size_t>(q) * words + side;
    return starts[t + 1] - starts[t];
  };
  for (int s = 0; s < p; ++s)
    for (int q = 0; q < p; ++q)
      if (const std::uint64_t sent = block(q, s, 1), expected = block(s, q, 2 + up); sent != expected)
        throw Error(ErrorCode::mismatch, "shm direct alltoallv on rank " + std::to_string(r) + ": rank " +
                                             std::to_string(q) + " sends " + std::to_string(sent) +
                                             " elements to rank " + std::to_string(s) + ", which expects " +
                                             std::to_string(expected) + " (recv_counts[" + std::to_string(q) + "])");
}

bool alltoallv_from_slots(const Segment& segment, std::uint64_t seq, int r, std::size_t esize, std::byte* recv,
                          std::span<const std::size_t> recv_starts, const std::byte* own) {
  const std::size_t up = recv_starts.size() - 1, words = alltoallv_header_words(up);
  const std::size_t header = words * sizeof(std::uint64_t), room = (slot_data_bytes - header) / esize;
  const int p = static_cast<int>(up);
  // This rank's own publication from its copy: its slot's first line is also rank 0's `arrivals`,
  // which the peers' arrivals take from this core (a miss that made an 8-byte alltoallv 0.8 of
  // OpenMPI's speed).
  const auto slot = [&](int q) -> const std::byte* { return q == r ? own : segment.signature_slot(q, seq).data; };
  AlltoallvHeaders all;  // each rank's header, copied once: a peer may change its slot
  all.place(up * words);
  for (int q = 0; q < p; ++q)
    if (take_alltoallv_header(segment, q, r, slot(q), recv_starts, room, true,
                              &all[static_cast<std::size_t>(q) * words]) == 0)
      return false;
  check_alltoallv_pairs(all.data(), p, r);
  // (This rank's own block too comes from its slot: in place, the result may overlap the input.)
  for (int q = 0; q < p; ++q) {
    const std::uint64_t* sends = &all[static_cast<std::size_t>(q) * words + 1];
    const auto ur = static_cast<std::size_t>(r);
    if (const std::size_t len = (sends[ur + 1] - sends[ur]) * esize; len > 0)
      core::copy(recv + recv_starts[static_cast<std::size_t>(q)] * esize, slot(q) + header + sends[ur] * esize, len);
  }
  return true;
}

bool DirectRun::progress_inline(bool arrange_wake) {
  try {
    // An alltoallv whose own input did not fit knows the way already: the data set, which every
    // rank takes once it sees this rank's slot (its phase 1 waits for every signature anyway).
    if (kind_ == Collective::alltoallv && published_bytes_ == sizeof(std::uint64_t)) return go_through_sets();
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
    // A rank's alltoallv input did not fit: every rank goes on through the data set, as every rank saw.
    if (kind_ == Collective::alltoallv &&
        !alltoallv_from_slots(segment_, seq_, rank(), esize_, recv_, starts_, published_.data()))
      return go_through_sets();
    if (kind_ != Collective::alltoallv) deliver_inline();
    deliver_staged();
    consumed_ = true;
    transport_.consumed_inline(seq_);
    return true;
  } catch (const Error& error) {
    fail(error);
  }
}

bool DirectRun::go_through_sets() {
  consumed_ = true, inline_ = false;
  transport_.consumed_inline(seq_);
  return progress_barriers();
}

void DirectRun::deliver_inline() {
  const int r = rank(), p = size();
  const std::byte* own = own_input(kind_, r, publication(kind_, send_, recv_, count_, esize_, r, p, root_), recv_,
                                   static_cast<std::size_t>(p) * elements() * esize_, input_of(r));
  combine_inline(kind_, send_, recv_, count_, starts_, type_, op_, root_, r, p,
                 [&](int q) { return q == r ? own : input_of(q); });
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
  if (!serves_natively(algorithm, kind)) return false;
  const std::size_t p = static_cast<std::size_t>(size_), esize = size_of(call.type);
  const bool reduces =
      kind == Collective::allreduce || kind == Collective::reduce_scatter || kind == Collective::reduce;
  const bool uneven = kind == Collective::allgatherv, v = kind == Collective::alltoallv;
  const std::size_t largest =
      uneven && !call.counts.empty() ? *std::max_element(call.counts.begin(), call.counts.end()) : call.count;
  if ((!v && (largest > inline_bytes || largest_publication(kind, largest, esize, size_) > inline_bytes)) ||
      (reduces && !call.op) ||
      (input_blocks(kind) && segment_->layout().direct_chunk / esize < p))  // start_direct's refusal
    return false;
  // An alltoallv input that does not fit its slot (alltoallv_publication's test) goes the general
  // way, which publishes that, and the data set serves.
  if (v && !alltoallv_fits_inline(p, std::accumulate(call.counts.begin(), call.counts.end(), std::size_t{0}), esize))
    return false;
  auto* recv = static_cast<std::byte*>(call.recv);
  // A broadcast has one buffer, which is its input on the root; no in-place form to map.
  const std::byte* send = kind == Collective::broadcast ? recv : map_in_place(call, rank_).input;
  Publication mine = publication(kind, send, recv, call.count, esize, rank_, size_, call.root);
  // Alltoallv: recv's blocks, and what it publishes (alltoallv_publication).
  BlockStarts starts, send_starts;
  if (uneven) place_block_starts(starts, call.counts);
  if (v) place_block_starts(starts, call.recv_counts), place_block_starts(send_starts, call.counts);
  std::array<std::byte, slot_data_bytes> own;
  if (v) {
    mine = {own.data(),
            alltoallv_publication(own.data(), static_cast<const std::byte*>(call.send), send_starts, starts, esize)};
  }
  const std::size_t elements = uneven ? starts.back() : call.count;
  // Whether this rank reads any peer's publication (a broadcast's root does not, nor does a
  // collective of no elements, see bind; an alltoallv reads every peer's, whose flags decide).
  const bool reads = v ? size_ > 1 : reads_any(kind, rank_, call.root, elements, size_);
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
        if (next != rank_ && (v || reads_from(kind, next, rank_, call.root, elements)) &&
            !inline_input(next, seq, wire, false))
          break;
    } catch (const Error&) {
      consumed();
      throw;
    }
    if (v && next == size_) {
      bool delivered = false;
      try {
        delivered = alltoallv_from_slots(*segment_, seq, rank_, esize, recv, starts, own.data());
      } catch (const Error& error) {
        abort(error, seq);
        consumed();
        throw;
      }
      if (!delivered) break;  // a rank's input did not fit: the data set, as below
      consumed();
      return true;
    }
    if (!reads || next == size_) {  // (a scatter's root still takes its own block)
      const std::byte* own = own_input(kind, rank_, mine, recv, p * (uneven ? elements : call.count) * esize,
                                       segment_->signature_slot(rank_, seq).data);
      combine_inline(kind, send, recv, call.count, starts, call.type, call.op.value_or(ReduceOp::sum), call.root, rank_,
                     size_, [&](int q) { return q == rank_ ? own : segment_->signature_slot(q, seq).data; });
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
  static_cast<DirectRun&>(*run).adopt_published(signature, wire, mine);
  transport::finish(*run, *this, signature, timeout);
  return true;
}

}  // namespace tutti::transport::shm
