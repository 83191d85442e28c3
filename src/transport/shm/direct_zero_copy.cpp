// The zero-copy path of the direct collectives: the buffers the peers read are SharedBuffer
// memory, which each rank maps from its peers, so that an allreduce reduces its slice straight
// from every rank's input and copies the rest of the result straight from the peers' results, a
// reduce_scatter reduces its block from every input, and an allgather or a broadcast copies the
// peers' blocks or the root's buffer straight into its result (see direct.hpp, zero_copy_bytes,
// and DirectRun::describe).
#include <algorithm>
#include <cstring>
#include <string>

#include "transport/shm/direct_run.hpp"

namespace tutti::transport::shm {

// Called by bind for a collective too large to run inline. The description travels in the
// signature slot as an inline input would (and, like one, keeps the peers' slots of this seq
// from being reused until plan_zero_copy has read them). Whether a call describes its buffers
// depends only on what every rank agrees on (the compared signature, the segment), so every
// rank publishes one or none.
void DirectRun::describe(const Signature& signature) {
  // An alltoall where single copy may serve it says whether it runs in place: where every rank
  // does, the data sets may serve it instead (plan, in_place_alltoall_single_copy_bytes); an
  // allgather says so too, where single copy may serve it past single_copy_allgather_limit.
  if (kind_ == Collective::allgather) described_.in_place = send_ == recv_ + block_offset(rank()) ? 1 : 0;
  if (kind_ == Collective::alltoall) {
    if (size() < 2 || count_ * esize_ < single_copy_bytes || !segment_.single_copy() ||
        !segment_.single_copy_collectives())
      return;
    described_.in_place = send_ == recv_ ? 1 : 0;
    return publish_description(signature);
  }
  // No zero-copy path: single copy or the data sets.
  if (kind_ != Collective::allreduce && kind_ != Collective::reduce_scatter && kind_ != Collective::allgather &&
      kind_ != Collective::broadcast)
    return;
  const std::size_t p = static_cast<std::size_t>(size());
  const std::size_t input = (input_blocks(kind_) ? p : 1) * count_ * esize_;
  const std::size_t output = (output_blocks(kind_) ? p : 1) * count_ * esize_;
  if (std::max(input, output) < zero_copy_bytes || p < 2 || !segment_.single_copy()) return;
  if (kind_ != Collective::broadcast)
    if (auto where = core::locate_shared(send_, input)) described_.send = *where;
  if (auto where = core::locate_shared(recv_, output)) described_.recv = *where;
  publish_description(signature);
}

void DirectRun::publish_description(const Signature& signature) {
  describes_ = true;
  wire_ = to_wire(signature);
  transport_.carry_inline(seq_, reinterpret_cast<const std::byte*>(&described_), sizeof described_, wire_);
}

std::vector<DirectRun::Described> DirectRun::take_descriptions() {
  std::vector<Described> all(static_cast<std::size_t>(size()));
  for (int q = 0; q < size(); ++q) std::memcpy(&all[static_cast<std::size_t>(q)], input_of(q), sizeof(Described));
  consumed_ = true;
  transport_.consumed_inline(seq_);
  return all;
}

bool DirectRun::every_rank_in_place(const std::vector<Described>& all) const {
  bool every = true;
  for (std::size_t q = 0; q < all.size(); ++q) {
    if (all[q].in_place > 1)
      throw corrupt_segment(segment_, static_cast<int>(q), "an in-place flag of " + std::to_string(all[q].in_place));
    every = every && all[q].in_place == 1;
  }
  return every;
}

bool DirectRun::plan_zero_copy(const std::vector<Described>& all) {
  const int p = size(), r = rank();
  const std::size_t bytes = count_ * esize_;
  // What the peers read of each rank: its input (and for allreduce its result), or the root's buffer.
  const bool reads_send = kind_ != Collective::broadcast, reads_recv = kind_ == Collective::allreduce;
  const auto read = [&](int q, bool recv) {
    return kind_ == Collective::broadcast ? recv && q == root_ : recv ? reads_recv : reads_send;
  };
  for (int q = 0; q < p; ++q)
    for (bool recv : {false, true}) {
      const Described& d = all[static_cast<std::size_t>(q)];
      if (read(q, recv) && (recv ? d.recv : d.send).id == 0) return false;
    }
  const std::size_t send_bytes = (input_blocks(kind_) ? static_cast<std::size_t>(p) : 1) * bytes;
  peers_.resize(static_cast<std::size_t>(p));
  for (int q = 0; q < p; ++q) {
    if (q == r) continue;
    const int pid = segment_.rank_block(q).pid.load(std::memory_order_relaxed);
    const auto map = [&](const core::SharedLocation& at, std::size_t length, const char* which) {
      if (at.offset > at.region_bytes || length > at.region_bytes - at.offset)
        throw Error(ErrorCode::system, where() + ": rank " + std::to_string(q) + " described its " + which +
                                           " buffer as " + std::to_string(length) + " bytes at offset " +
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
    const Described& d = all[static_cast<std::size_t>(q)];
    if (read(q, false)) std::tie(peer.send_region, peer.send) = map(d.send, send_bytes, "send");
    if (read(q, true)) std::tie(peer.recv_region, peer.recv) = map(d.recv, bytes, "receive");
  }
  zero_copy_ = true, chunks_ = 0, phases_ = kind_ == Collective::allreduce ? 4 : 3;
  choose_copy_out();
  return true;
}

void DirectRun::run_zero_copy_phase(std::size_t phase) {
  const int p = size(), r = rank();
  const std::size_t bytes = count_ * esize_;
  const auto peer = [&](int q) -> const Peer& { return peers_[static_cast<std::size_t>(q)]; };
  if (phase == 1) {
    switch (kind_) {
      case Collective::allreduce:
        return reduce_own_slice();
      case Collective::reduce_scatter: {  // as the two-copy path orders the parts (see finish)
        const std::byte* own = send_ + static_cast<std::size_t>(r) * bytes;
        const int first = recv_ == own ? r : 0;
        return reduce_parts(recv_, count_, [&](int i) {
          const int q = (first + i) % p;
          return (q == r ? send_ : peer(q).send) + static_cast<std::size_t>(r) * bytes;
        });
      }
      case Collective::allgather:  // this rank's own block: at the end (see progress_barriers)
        for (int i = 1; i < p; ++i) {
          const int q = (r + i) % p;
          copy_out_(recv_ + static_cast<std::size_t>(q) * bytes, peer(q).send, bytes);
        }
        return;
      default:  // broadcast
        if (r != root_) copy_out_(recv_, peer(root_).recv, bytes);
        return;
    }
  }
  if (phase != 2 || kind_ != Collective::allreduce) return;
  for (int i = 1; i < p; ++i) {  // each rank starts with a different peer
    const int q = (r + i) % p;
    const auto [first, last] = slice(count_, p, q);
    copy_out_(recv_ + first * esize_, peer(q).recv + first * esize_, (last - first) * esize_);
  }
}

// In the order of the two-copy path (reduce_own_first). A result written with streaming stores is
// reduced piece by piece into a scratch piece that stays in the cache, then streamed out.
void DirectRun::reduce_own_slice() {
  constexpr std::size_t piece_bytes = 64 * 1024;
  const int p = size(), r = rank();
  const auto [first, last] = slice(count_, p, r);
  const auto input = [&](int q, std::size_t element) {
    return (q == r ? send_ : peers_[static_cast<std::size_t>(q)].send) + element * esize_;
  };
  const auto reduce_into = [&](std::byte* dst, std::size_t element, std::size_t n) {
    reduce_own_first(dst, input(r, element), n, [&](int q) { return input(q, element); });
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
