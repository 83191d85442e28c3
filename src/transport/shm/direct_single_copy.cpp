// The direct collectives that read or write their peers' buffers: single copy (process_vm_readv
// straight from a peer's input into this rank's result, or process_vm_writev into a peer's) and
// alltoallv's exchange (displacements, and inputs that fit, through a data set; larger blocks read
// from the peer). See direct.hpp, single_copy_bytes, and DirectRun::plan.
#include <cerrno>
#include <cstring>
#include <string>
#include <vector>

#include "transport/shm/direct_run.hpp"

namespace tutti::transport::shm {

// The bytes at the end of a broadcast's buffer of `bytes` that its root writes into each of the
// p - 1 receivers (where it pushes), whole pages: a 1/p share, so that the root's p - 1 writes
// take as long as each receiver's read of the rest; none below shared_broadcast_bytes.
namespace {
std::size_t root_share(std::size_t bytes, int p) {
  constexpr std::size_t page = 4096;
  return bytes < shared_broadcast_bytes ? 0 : bytes / static_cast<std::size_t>(p) / page * page;
}
}  // namespace

// (Which collectives single copy, and when: DirectRun::plan.)
void DirectRun::run_single_copy_phase(std::size_t phase) {
  const int p = size(), r = rank();
  if (phase == 0) {
    if (pushes()) {  // where the others write: this rank's result (a gather's: the root's)
      if (kind_ != Collective::gather || r == root_)
        segment_.direct_round(r).address.store(reinterpret_cast<std::uintptr_t>(recv_), std::memory_order_relaxed);
      return;
    }
    // What this rank's peers read: its input (all blocks), or the root's buffer.
    const Publication mine = publication(kind_, send_, recv_, count_, esize_, r, p, root_);
    if (mine.data != nullptr)
      segment_.direct_round(r).address.store(reinterpret_cast<std::uintptr_t>(mine.data), std::memory_order_relaxed);
    return;
  }
  if (phase != 1) return;
  // This rank's own block (the allgathers, alltoall, a gather's or scatter's root) in this phase,
  // not after the last barrier: a scatter's root copies it while the others read theirs.
  copy_own_block();
  const std::size_t bytes = count_ * esize_;
  switch (kind_) {
    case Collective::broadcast: {
      // The root writes the last share of its buffer into every receiver while they read the rest
      // of it (where it pushes): each rank then moves (p - 1) / p of the buffer, at once.
      const std::size_t share = pushes() ? root_share(bytes, p) : 0;
      if (r != root_)
        read_input(root_, 0, recv_, bytes - share);
      else if (share > 0)
        for (int i = 1; i < p; ++i) {
          const int q = (r + i) % p;
          write_result(q, bytes - share, recv_ + (bytes - share), share);
        }
      return;
    }
    case Collective::scatter:  // block r of the root's input
      if (r != root_) read_input(root_, block_offset(r), recv_, bytes);
      return;
    case Collective::gather:  // each of the others writes its input into its block of the root's result
      if (r != root_) write_result(root_, block_offset(r), send_, bytes);
      return;
    default:
      break;
  }
  if (pushes()) {  // alltoall writes its block q into rank q's result, allgather its input into every one
    for (int i = 1; i < p; ++i) {
      const int q = (r + i) % p;  // each rank starts with a different peer
      write_result(q, block_offset(r), send_ + (kind_ == Collective::alltoall ? block_offset(q) : 0), bytes);
    }
    return;
  }
  // Alltoall reads block r of each peer's input; the allgathers the whole input, into block q.
  const std::size_t offset = kind_ == Collective::alltoall ? block_offset(r) : 0;
  for (int i = 1; i < p; ++i) {
    const int q = (r + i) % p;  // each rank starts with a different peer
    if (const std::size_t len = block_elems(q) * esize_; len > 0) read_input(q, offset, recv_ + block_offset(q), len);
  }
}

void DirectRun::run_exchange_phase(std::size_t phase) {
  const int p = size(), r = rank();
  const auto up = static_cast<std::size_t>(p);
  // A rank's part of the set: its header (take_alltoallv_header: whether its input follows, its
  // p + 1 send and p + 1 receive displacements), then its input.
  const std::size_t words = alltoallv_header_words(up), header = words * sizeof(std::uint64_t);
  const std::size_t input = send_starts_.back() * esize_;
  if (phase == 0) {
    auto* mine = reinterpret_cast<std::uint64_t*>(slot(0, r));
    // Read in place instead where it fits too, but the probe found single copy faster and every
    // rank has a core (each rank decides for its own input, and says which in mine[0]).
    const bool inline_input =
        header + input <= segment_.layout().direct_chunk &&
        !(segment_.single_copy_collectives() && !segment_.crowded() && input >= single_copy_bytes);
    mine[0] = inline_input ? 1 : 0;
    for (std::size_t q = 0; q <= up; ++q) mine[1 + q] = send_starts_[q], mine[2 + up + q] = starts_[q];
    if (inline_input && input > 0) core::copy(slot(0, r) + header, send_, input);
    // Where its input stays out of the set, a bound run writes its blocks into the receivers'
    // results (pushes), which every rank publishes; an unbound one has its peers read its input.
    if (pushes() || !inline_input) {
      const std::byte* published = pushes() ? recv_ : send_;
      segment_.direct_round(r).address.store(reinterpret_cast<std::uintptr_t>(published), std::memory_order_relaxed);
    }
    return;
  }
  if (phase != 1) return;
  // Every pair's counts are checked, alike on every rank, before any block is read. Where every
  // input is in the set, no rank reads another's buffer: the run ends after these reads, without
  // the last barrier (the set is written again only after the next run's barrier), as every rank
  // sees the same flags.
  AlltoallvHeaders all;
  all.place(up * words);
  bool every_input_in_set = true;
  try {
    for (int q = 0; q < p; ++q)
      every_input_in_set &=
          take_alltoallv_header(segment_, q, r, slot(0, q), starts_, (segment_.layout().direct_chunk - header) / esize_,
                                false, &all[static_cast<std::size_t>(q) * words]) == 1;
    check_alltoallv_pairs(all.data(), p, r);
  } catch (const Error& error) {
    fail(error);
  }
  if (every_input_in_set) phases_ = 2;
  // This rank's own block here, as single copy does, not after the last barrier: the peers copy
  // theirs meanwhile (the counts agree, so no peer writes where it goes).
  copy_own_block();
  const auto ur = static_cast<std::size_t>(r);
  const bool writes = pushes() && all[ur * words] == 0;  // this rank's input is out of the set
  for (int i = 1; i < p; ++i) {
    const int q = (r + i) % p;  // each rank starts with a different peer
    const std::uint64_t* theirs = &all[static_cast<std::size_t>(q) * words];
    if (const std::size_t len = block_elems(q) * esize_; len > 0) {  // q's block for this rank
      const std::size_t offset = theirs[1 + ur] * esize_;
      if (theirs[0] == 1)
        copy_out_(recv_ + block_offset(q), slot(0, q) + header + offset, len);
      else if (!pushes())
        read_input(q, offset, recv_ + block_offset(q), len);
    }
    // This rank's block for q, at q's receive displacement for it (the counts agree: checked).
    const auto uq = static_cast<std::size_t>(q);
    if (const std::size_t len = (send_starts_[uq + 1] - send_starts_[uq]) * esize_; writes && len > 0)
      write_result(q, theirs[2 + up + ur] * esize_, send_ + send_starts_[uq] * esize_, len);
  }
}

// Bytes [offset, offset + bytes) of rank q's published input, into dst.
void DirectRun::read_input(int q, std::size_t offset, std::byte* dst, std::size_t bytes) {
  const int failure = read_process_memory(segment_.rank_block(q).pid.load(std::memory_order_relaxed), dst,
                                          published_at(q, offset), bytes);
  if (failure != 0) peer_copy_failed(q, failure, false, bytes);
}

// `bytes` from src into [offset, offset + bytes) of rank q's published result.
void DirectRun::write_result(int q, std::size_t offset, const std::byte* src, std::size_t bytes) {
  const int failure = write_process_memory(segment_.rank_block(q).pid.load(std::memory_order_relaxed),
                                           published_at(q, offset), src, bytes);
  if (failure != 0) peer_copy_failed(q, failure, true, bytes);
}

std::uint64_t DirectRun::published_at(int q, std::size_t offset) const {
  return segment_.direct_round(q).address.load(std::memory_order_relaxed) + offset;
}

void DirectRun::peer_copy_failed(int q, int failure, bool write, std::size_t bytes) {
  if (failure == ESRCH) fail(Error(ErrorCode::peer_failure, where() + ": rank " + std::to_string(q) + " died"));
  fail(Error(ErrorCode::system, where() + (write ? ": writing into rank " : ": reading rank ") + std::to_string(q) +
                                    (write ? "'s result (" : "'s input (") + std::to_string(bytes) +
                                    " bytes) failed: " + std::strerror(failure)));
}

}  // namespace tutti::transport::shm
