// The zero-copy path of the direct allreduce: every rank's buffers are SharedBuffer memory, which
// each rank maps from its peers, so that a rank reduces its slice straight from every rank's input
// and copies the rest of the result straight from the peers' results (see direct.hpp,
// zero_copy_bytes, and DirectRun::describe).
#include <string>

#include "transport/shm/direct_run.hpp"

namespace tutti::transport::shm {

// Called by bind for a collective too large to run inline. The description travels in the
// signature slot as an inline input would (and, like one, keeps the peers' slots of this seq
// from being reused until plan_zero_copy has read them). Whether a call describes its buffers
// depends only on what every rank agrees on (the compared signature, the segment), so every
// rank publishes one or none.
void DirectRun::describe(const Signature& signature) {
  const std::size_t bytes = count_ * esize_;
  if (kind_ != Collective::allreduce || bytes < zero_copy_bytes || size() < 2 || !segment_.single_copy()) return;
  if (auto where = core::locate_shared(send_, bytes)) described_.send = *where;
  if (auto where = core::locate_shared(recv_, bytes)) described_.recv = *where;
  describes_ = true;
  wire_ = to_wire(signature);
  transport_.carry_inline(seq_, reinterpret_cast<const std::byte*>(&described_), sizeof described_, wire_);
}

bool DirectRun::plan_zero_copy() {
  const int p = size(), r = rank();
  const std::size_t bytes = count_ * esize_;
  std::vector<Described> all(static_cast<std::size_t>(p));
  bool shared = true;
  for (int q = 0; q < p; ++q) {
    std::memcpy(&all[static_cast<std::size_t>(q)], input_of(q), sizeof(Described));
    shared = shared && all[static_cast<std::size_t>(q)].send.id != 0 && all[static_cast<std::size_t>(q)].recv.id != 0;
  }
  consumed_ = true;
  transport_.consumed_inline(seq_);
  if (!shared) return false;
  peers_.resize(static_cast<std::size_t>(p));
  for (int q = 0; q < p; ++q) {
    if (q == r) continue;
    const int pid = segment_.rank_block(q).pid.load(std::memory_order_relaxed);
    const auto map = [&](const core::SharedLocation& at, const char* which) {
      if (at.offset > at.region_bytes || bytes > at.region_bytes - at.offset)
        throw Error(ErrorCode::system, where() + ": rank " + std::to_string(q) + " described its " + which +
                                           " buffer as " + std::to_string(bytes) + " bytes at offset " +
                                           std::to_string(at.offset) + " of a shared buffer of " +
                                           std::to_string(at.region_bytes));
      try {
        auto region = core::map_peer_region(pid, at);
        return std::pair{region, region->base() + at.offset};
      } catch (const Error& error) {
        throw Error(error.code(), where() + ": rank " + std::to_string(q) + "'s " + which + " buffer: " + error.what());
      }
    };
    Peer& peer = peers_[static_cast<std::size_t>(q)];
    std::tie(peer.send_region, peer.send) = map(all[static_cast<std::size_t>(q)].send, "send");
    std::tie(peer.recv_region, peer.recv) = map(all[static_cast<std::size_t>(q)].recv, "receive");
  }
  zero_copy_ = true, chunks_ = 0, phases_ = 4;
  if (send_ != recv_ && bytes * static_cast<std::size_t>(p) >= streaming_bytes) copy_out_ = copy_streaming;
  return true;
}

void DirectRun::run_zero_copy_phase(std::size_t phase) {
  const int p = size(), r = rank();
  if (phase == 1) return reduce_own_slice();
  if (phase != 2) return;
  for (int i = 1; i < p; ++i) {  // each rank starts with a different peer
    const int q = (r + i) % p;
    const auto [first, last] = slice(count_, p, q);
    copy_out_(recv_ + first * esize_, peers_[static_cast<std::size_t>(q)].recv + first * esize_,
              (last - first) * esize_);
  }
}

// In the order of the two-copy path (reduce_slice): this rank's input, then the peers' in rank
// order, so that either path gives the same bits. A result written with streaming stores is
// reduced piece by piece into a scratch piece that stays in the cache, then streamed out.
void DirectRun::reduce_own_slice() {
  constexpr std::size_t piece_bytes = 64 * 1024;
  const int p = size(), r = rank();
  const auto [first, last] = slice(count_, p, r);
  const auto input = [&](int q, std::size_t element) {
    return (q == r ? send_ : peers_[static_cast<std::size_t>(q)].send) + element * esize_;
  };
  const auto reduce_into = [&](std::byte* dst, std::size_t element, std::size_t n) {
    bool reduced = false;
    for (int q = 0; q < p; ++q)
      if (q != r)
        reduce::apply(op_, type_, dst, reduced ? dst : input(r, element), input(q, element), n), reduced = true;
    if (op_ == ReduceOp::avg) reduce::divide(type_, dst, n, p);
  };
  if (copy_out_ == copy_cached) return reduce_into(recv_ + first * esize_, first, last - first);
  const std::size_t piece = std::max<std::size_t>(piece_bytes / esize_, 1);
  auto scratch = std::make_unique_for_overwrite<std::byte[]>(piece * esize_);
  for (std::size_t at = first; at < last; at += piece) {
    const std::size_t n = std::min(piece, last - at);
    reduce_into(scratch.get(), at, n);
    copy_out_(recv_ + at * esize_, scratch.get(), n * esize_);
  }
}

}  // namespace tutti::transport::shm
