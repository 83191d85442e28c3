// Direct collectives over the segment's data area. Every chunk of an algorithm uses one of two
// data sets (alternately): each rank writes its part of the set, all meet at a barrier, then
// each reads what it needs. A set is written again two chunks later, after a barrier that every
// rank reaches only once done reading it, so the next chunk's writes overlap the slowest reads.
//
// An algorithm is a sequence of phases separated by barriers; `progress` runs phases until it
// reaches a barrier some rank has not, and returns. A rank arriving at a barrier stores the round
// in its DirectRound; the last to arrive rings every other rank's doorbell, which is what their
// waits (the queue's, the progress engine's) sleep on. Ranks run the same collectives in the same
// order, so their rounds advance together.
//
// A collective whose input fits in a signature slot (inline_bytes) runs inline instead: the input
// is published with the signature, and each rank computes its result from the slots of its peers
// once they are published (ShmTransport::carry_inline); no barrier, no data set.
//
// Ranks that disagree about a collective would still meet at barriers (rounds are counters), so
// a direct collective writes nothing into the caller's buffer, and does not finish, before the
// signature table has compared every rank's signature of it (ShmTransport::signature_checked;
// see announce in shm.cpp).
#include "core/copy.hpp"
#include "transport/shm/direct_run.hpp"

#include <algorithm>
#include <cstring>
#include <memory>
#include <string>
#include <utility>

namespace tutti::transport::shm {

// Results of a large call (streaming_bytes) are written once and not read again soon: stores that
// bypass the cache spare the read-for-ownership of every destination line (a third of an
// out-of-place allreduce's memory traffic).
void copy_cached(std::byte* dst, const std::byte* src, std::size_t bytes) { core::copy(dst, src, bytes); }

namespace {

struct SpareRun {
  void* block = nullptr;
  bool closed = false;  // the thread is exiting: runs destroyed after this free their memory
  ~SpareRun() {
    ::operator delete(block);
    block = nullptr, closed = true;
  }
};
thread_local SpareRun spare_run;

// The spare of Scratch: the last block a thread dropped, up to spare_scratch_bytes (above, a
// call's copying dwarfs what fresh memory costs, and the spare would hold that much for good).
constexpr std::size_t spare_scratch_bytes = std::size_t{64} << 20;

struct SpareScratch {
  std::unique_ptr<std::byte[]> block;
  std::size_t bytes = 0;
  bool closed = false;  // as SpareRun's
  ~SpareScratch() { block.reset(), bytes = 0, closed = true; }
};
thread_local SpareScratch spare_scratch;

}  // namespace

Scratch::Scratch(std::size_t bytes) {
  if (spare_scratch.block && spare_scratch.bytes >= bytes) {
    data_ = std::move(spare_scratch.block), capacity_ = std::exchange(spare_scratch.bytes, 0);
    return;
  }
  data_ = std::make_unique_for_overwrite<std::byte[]>(std::max<std::size_t>(bytes, 1)), capacity_ = bytes;
}

void Scratch::release() {
  if (!data_) return;
  // The larger of the two is kept: the next call of this size then needs no fresh memory.
  if (!spare_scratch.closed && capacity_ <= spare_scratch_bytes && capacity_ >= spare_scratch.bytes)
    spare_scratch.block = std::move(data_), spare_scratch.bytes = capacity_;
  data_.reset(), capacity_ = 0;
}

void* DirectRun::operator new(std::size_t bytes) {
  if (bytes != sizeof(DirectRun) || spare_run.block == nullptr) return ::operator new(bytes);
  return std::exchange(spare_run.block, nullptr);
}

void DirectRun::operator delete(void* block, std::size_t bytes) {
  if (bytes == sizeof(DirectRun) && spare_run.block == nullptr && !spare_run.closed)
    spare_run.block = block;
  else
    ::operator delete(block);
}

DirectRun::DirectRun(ShmTransport& transport, Collective kind, const std::byte* send, std::byte* recv,
                     std::size_t count, std::span<const std::size_t> counts, std::span<const std::size_t> recv_counts,
                     DataType type, ReduceOp op, int root, std::chrono::milliseconds timeout)
    : transport_(transport),
      segment_(transport.segment()),
      kind_(kind),
      send_(send),
      recv_(recv),
      count_(count),
      esize_(size_of(type)),
      largest_(count),
      type_(type),
      op_(op),
      root_(root),
      timeout_(timeout) {
  if (kind == Collective::alltoallv) {
    place_block_starts(send_starts_, counts);
    place_block_starts(starts_, recv_counts);
    return;
  }
  if (kind != Collective::allgatherv) return;
  place_block_starts(starts_, counts);
  for (std::size_t n : counts) largest_ = std::max(largest_, n);
}

// The chunks and phases of the barrier path, once it first runs (an inline call needs none).
void DirectRun::plan() {
  const std::size_t chunk_bytes = segment_.layout().direct_chunk, p = static_cast<std::size_t>(size());
  // Every rank makes the same choice: the segment's answer and the call's size are the same on all
  // (allgatherv: its largest block).
  const std::size_t count = largest_;
  const std::size_t bytes = count * esize_;
  if (kind_ == Collective::barrier) {  // one barrier, no data (a barrier runs inline unless unchecked)
    phases_ = 2;
    return;
  }
  if (kind_ == Collective::alltoallv) {  // one data-set use, for the displacements
    exchange_ = true, chunks_ = 1, phases_ = 3;
    return;
  }
  // Every rank's description, where this call reads them: whether every rank runs it in place, and
  // where their buffers lie (zero copy). An alltoall that every rank runs in place takes the data
  // sets below the limit. A rank out of place in an alltoall knows without reading them that not
  // every rank is (it lets the peers' slots go when it is done, as its own description may not be
  // published yet: consuming the call would drop it).
  const bool alltoall = kind_ == Collective::alltoall;
  const std::vector<Described> described = reads_descriptions() ? take_descriptions() : std::vector<Described>{};
  const bool every_in_place = !described.empty() && every_rank_in_place(described);
  const bool sets_in_place =
      alltoall && every_in_place && (segment_.crowded() || bytes * p < in_place_alltoall_single_copy_bytes);
  if (!described.empty() && !alltoall && plan_zero_copy(described)) return;
  // Allgather(v) (see single_copy_allgather_limit), alltoall, gather, scatter and a broadcast
  // (whose root writes a share where it pushes, else up to its limit) where the segment's probe
  // found single copy faster on this machine (Segment::single_copy_collectives); where ranks share
  // cores, only alltoall, gather and a large scatter. A gather's ranks write into the root's result
  // (pushes), so only in a bound run.
  const bool gather = kind_ == Collective::gather && pushes();
  const bool by_probe =
      segment_.single_copy_collectives() &&
      (segment_.crowded()
           ? (alltoall && !sets_in_place) || gather || (kind_ == Collective::scatter && bytes >= crowded_scatter_bytes)
           : (alltoall && !sets_in_place) || gather || kind_ == Collective::scatter ||
                 ((kind_ == Collective::allgather || kind_ == Collective::allgatherv) &&
                  (every_in_place || bytes * p < single_copy_allgather_limit)) ||
                 (kind_ == Collective::broadcast && (pushes() || bytes < single_copy_broadcast_limit)));
  if (by_probe && bytes >= single_copy_bytes && p > 1 && segment_.single_copy()) {
    single_copy_ = true, chunks_ = 0, phases_ = 3;
    if (alltoall && send_ == recv_) snapshot_blocks();
    return;
  }
  if (kind_ == Collective::allreduce && bytes <= small_allreduce_bytes) {
    small_ = true, per_chunk_ = std::max<std::size_t>(count, 1);
  } else if (kind_ == Collective::allreduce) {
    three_parts_ = true, per_chunk_ = chunk_bytes / esize_;
  } else if (input_blocks(kind_)) {
    per_chunk_ = chunk_bytes / esize_ / p;
  } else if (kind_ == Collective::broadcast) {  // the root writes a whole data set (the p parts are contiguous)
    per_chunk_ = chunk_bytes * p / esize_;
  } else {  // a block per rank's part; a scatter's root writes all p of them, the whole set
    per_chunk_ = chunk_bytes / esize_;
  }
  chunks_ = count == 0 ? 0 : (count + per_chunk_ - 1) / per_chunk_;
  phases_ = chunks_ == 0 ? 0 : (three_parts_ ? 2 * chunks_ + 1 : chunks_ + 1);
  choose_copy_out();
}

void DirectRun::choose_copy_out() {
  const std::size_t p = static_cast<std::size_t>(size());
  // What all ranks together write (the same on every rank).
  std::size_t written = (output_blocks(kind_) ? p : 1) * count_ * esize_ * p;
  if (kind_ == Collective::gather || kind_ == Collective::scatter) written = p * count_ * esize_;
  if (kind_ == Collective::allgatherv) written = elements() * esize_ * p;
  bool cold = false;  // whether this rank's results are written where it has not just read
  switch (kind_) {
    case Collective::allreduce:
      cold = send_ != recv_ && !small_;
      break;
    case Collective::alltoall:
    case Collective::alltoallv:
    case Collective::scatter:
      cold = true;
      break;
    case Collective::allgather:
    case Collective::allgatherv:
      cold = send_ != recv_ + block_offset(rank());
      break;
    case Collective::gather:  // only the root writes
      cold = true;
      break;
    case Collective::broadcast:
      cold = rank() != root_;
      break;
    default:
      break;
  }
  if (cold && written >= streaming_bytes) copy_out_ = core::copy_streaming;
}

std::string DirectRun::where() const {
  return "shm direct " + std::string(to_string(kind_)) + " on rank " + std::to_string(rank());
}

void DirectRun::deliver_staged() {
  if (!staging_) return;
  core::copy(deliver_, recv_, count_ * esize_);
  staging_ = Scratch();
}

bool DirectRun::signatures_compared() {
  if (compared_) return true;
  awaits_signatures_ = seq_ != no_seq && !transport_.signature_checked(seq_);
  if (awaits_signatures_) return false;
  if (const auto failure = transport_.aborted()) throw failure->error;  // a mismatch found meanwhile
  compared_ = true;
  return true;
}

void DirectRun::fail(const Error& error) {
  transport_.abort(error, no_seq);
  throw error;
}

std::vector<int> DirectRun::waiting_for() const {
  if (inline_ || awaits_signatures_) {
    std::vector<int> ranks = transport_.unpublished_ranks(seq_);
    if (inline_) std::erase_if(ranks, [&](int q) { return !needs(q); });
    // This rank's own publication still waits: for the ranks still reading its slot's last use.
    if (std::erase(ranks, rank()) > 0) {
      for (int q : transport_.holding_slot(seq_))
        if (std::find(ranks.begin(), ranks.end(), q) == ranks.end()) ranks.push_back(q);
      std::sort(ranks.begin(), ranks.end());
    }
    return ranks;
  }
  std::vector<int> ranks;
  if (round_ == 0) return ranks;
  for (int q = 0; q < size(); ++q)
    if (segment_.direct_round(q).round.load(std::memory_order_seq_cst) < round_) ranks.push_back(q);
  return ranks;
}

bool DirectRun::all_arrived() const {
  for (int q = 0; q < size(); ++q)
    if (segment_.direct_round(q).round.load(std::memory_order_seq_cst) < round_) return false;
  return true;
}

// seq_cst throughout. The rank whose store comes last in the total order sees every round
// arrived and rings everyone; a waiter reads its generation before the rounds (the queue's wait
// does), so it either sees that store or sleeps on a generation the ring bumps afterwards.
void DirectRun::arrive() {
  auto& mine = segment_.direct_round(rank()).round;
  round_ = mine.load(std::memory_order_relaxed) + 1;
  mine.store(round_, std::memory_order_seq_cst);
  if (all_arrived())
    for (int q = 0; q < size(); ++q)
      if (q != rank()) ring_doorbell(segment_.rank_block(q));
}

void DirectRun::check_deadline_and_liveness() {
  // A caller that spins (poll) reads the clock every 8th wait only: a read costs as much as a
  // small call's own work on some machines, and a wait past the deadline still ends within 8 polls.
  if (spinning_ && deadline_ != clock::time_point{} && ++unclocked_polls_ % 8 != 0) return;
  const auto now = clock::now();
  if (deadline_ == clock::time_point{}) deadline_ = now + timeout_;
  if (now >= deadline_) {
    std::string ranks;
    for (int q : waiting_for()) ranks += (ranks.empty() ? "" : ", ") + std::to_string(q);
    fail(Error(ErrorCode::timeout,
               where() + ": timed out waiting for rank(s) " + ranks + (awaits_signatures_ ? " to start it" : "")));
  }
  // Not at once: most waits end within microseconds, and looking costs system calls.
  if (next_liveness_check_ == clock::time_point{}) next_liveness_check_ = now + liveness_period;
  if (now < next_liveness_check_) return;
  next_liveness_check_ = now + liveness_period;
  for (int q : waiting_for())
    if (transport_.peer_has_died(q))
      fail(Error(ErrorCode::peer_failure, where() + ": rank " + std::to_string(q) + " died"));
}

bool DirectRun::progress_barriers() {
  try {
    if (const auto failure = transport_.aborted()) throw failure->error;
    // Data-set uses are taken when a collective first runs (in issue order), not when it is made:
    // an inline one takes none, and a set may be written again only after a barrier that
    // follows its last reads (see the top of this file).
    if (!reserved_) {
      // Zero copy is chosen from every rank's description, which comes with its signature (an
      // alltoall in place reads them too, see plan).
      if (reads_descriptions() && !signatures_compared()) {
        check_deadline_and_liveness();
        return false;
      }
      plan();
      first_use_ = transport_.reserve_direct_uses(chunks_);
      reserved_ = true;
    }
    while (phase_ < phases_) {
      // Phase 0 writes only into the segment; the later ones write the caller's buffer.
      if ((round_ != 0 && !all_arrived()) || (phase_ > 0 && !signatures_compared())) {
        check_deadline_and_liveness();
        return false;
      }
      run_phase(phase_++);
      if (phase_ < phases_) arrive();
    }
    if (!signatures_compared()) {
      check_deadline_and_liveness();
      return false;
    }
    if (!single_copy_ && !exchange_) copy_own_block();  // (single copy, alltoallv: in their reading phase)
    deliver_staged();
    return true;
  } catch (const Error& error) {
    fail(error);  // peers may be waiting at a barrier this rank will not reach
  }
}

// An allgather's own block, out of place, in one copy once the peers' blocks are in: copied chunk
// by chunk between the barriers it made every call at 1 MiB up to twice as long. The other
// gathers', an alltoall's and a scatter's root's likewise, from their block of the input.
void DirectRun::copy_own_block() {
  if (kind_ == Collective::alltoall && snapshot_) return;  // (snapshot_blocks left it in place)
  const int r = rank();
  const std::size_t bytes = block_elems(r) * esize_;
  if (bytes == 0) return;
  // (Offsets are added only to buffers this rank has: a gather's or reduce's other ranks may pass
  // no recv, a scatter's no send.)
  std::size_t from = 0, to = block_offset(r);
  switch (kind_) {
    case Collective::allgather:
    case Collective::allgatherv:
      break;
    case Collective::alltoallv:
      from = send_starts_[static_cast<std::size_t>(r)] * esize_;
      break;
    case Collective::alltoall:
      from = block_offset(r);
      break;
    case Collective::gather:
      if (r != root_) return;
      break;
    case Collective::scatter:
      if (r != root_) return;
      from = block_offset(r), to = 0;
      break;
    default:
      return;
  }
  if (recv_ + to != send_ + from) copy_out_(recv_ + to, send_ + from, bytes);
}

// Before this rank first arrives at a barrier, so before any peer may write into its buffer. The
// data sets need no snapshot: a chunk's blocks are copied into the set before that chunk's results
// are copied out over them, and the chunks are disjoint.
void DirectRun::snapshot_blocks() {
  const int p = size(), r = rank();
  snapshot_ = Scratch(static_cast<std::size_t>(p) * count_ * esize_);
  for (int q = 0; q < p; ++q)
    if (q != r) core::copy(snapshot_.data() + block_offset(q), send_ + block_offset(q), count_ * esize_);
  send_ = snapshot_.data();
}

void DirectRun::run_phase(std::size_t phase) {
  if (kind_ == Collective::barrier) return;  // its phases are the barrier itself
  if (exchange_) return run_exchange_phase(phase);
  if (single_copy_) return run_single_copy_phase(phase);
  if (zero_copy_) return run_zero_copy_phase(phase);
  if (three_parts_ && phase % 2 == 1) return reduce_slice(phase / 2);
  const std::size_t chunk = three_parts_ ? phase / 2 : phase;
  if (chunk > 0) finish(chunk - 1);
  if (chunk < chunks_) begin(chunk);
}

void DirectRun::begin(std::size_t chunk) {
  const std::size_t done = chunk * per_chunk_, n = chunk_elems(chunk);
  const int r = rank();
  if (input_blocks(kind_)) {
    for (int q = 0; q < size(); ++q)  // the blocks the peers reduce or take (this rank's own: from send)
      if (q != r)
        core::copy(slot(chunk, r) + static_cast<std::size_t>(q) * n * esize_,
                   send_ + (static_cast<std::size_t>(q) * count_ + done) * esize_, n * esize_);
  } else if (kind_ == Collective::broadcast) {
    if (r == root_) core::copy(slot(chunk, 0), recv_ + done * esize_, n * esize_);
  } else if (kind_ == Collective::scatter) {  // the root writes the other blocks' chunks, block q at q · n
    if (r == root_)
      for (int q = 0; q < size(); ++q)
        if (q != r)
          core::copy(slot(chunk, 0) + static_cast<std::size_t>(q) * n * esize_,
                     send_ + (static_cast<std::size_t>(q) * count_ + done) * esize_, n * esize_);
  } else if ((kind_ == Collective::gather || kind_ == Collective::reduce) && r == root_) {
    // Nothing: no rank reads the root's input (copy_own_block, finish).
  } else if (three_parts_) {  // the slices the peers reduce; this rank reduces its own from send
    const auto [first, last] = slice(n, size(), r);
    core::copy(slot(chunk, r), send_ + done * esize_, first * esize_);
    core::copy(slot(chunk, r) + last * esize_, send_ + (done + last) * esize_, (n - last) * esize_);
  } else if (const std::size_t mine = chunk_elems(chunk, r); mine > 0) {  // the gathers
    core::copy(slot(chunk, r), send_ + done * esize_, mine * esize_);
  }
}

// Allreduce in chunks: each rank reduces its slice of the chunk, from its own input and the
// peers' parts of the set, into its result, and publishes it in its own part of the set (where
// its input's copy of that slice would have been) for the peers to read.
void DirectRun::reduce_slice(std::size_t chunk) {
  const int p = size(), r = rank();
  const std::size_t done = chunk * per_chunk_;
  const auto [first, last] = slice(chunk_elems(chunk), p, r);
  const std::size_t n = last - first, offset = first * esize_;
  std::byte* out = recv_ + done * esize_ + offset;
  const std::byte* in = send_ + done * esize_ + offset;
  reduce_own_first(out, in, n, [&](int q) { return slot(chunk, q) + offset; });
  core::copy(slot(chunk, r) + offset, out, n * esize_);
}

void DirectRun::finish(std::size_t chunk) {
  const std::size_t done = chunk * per_chunk_, n = chunk_elems(chunk);
  const int p = size(), r = rank();
  if (small_) {
    reduce_parts(recv_ + done * esize_, n, [&](int q) { return slot(chunk, q); });
  } else if (kind_ == Collective::reduce_scatter) {
    const std::size_t offset = static_cast<std::size_t>(r) * n * esize_;
    const std::byte* own = send_ + (static_cast<std::size_t>(r) * count_ + done) * esize_;
    std::byte* dst = recv_ + done * esize_;
    // In place the result overwrites this rank's own block, which must then be read first.
    const int first = dst == own ? r : 0;
    reduce_parts(dst, n, [&](int i) {
      const int q = (first + i) % p;
      return q == r ? own : slot(chunk, q) + offset;
    });
  } else if (three_parts_) {
    for (int q = 0; q < p; ++q) {
      const auto [lo, hi] = slice(n, p, q);
      if (q != r) copy_out_(recv_ + (done + lo) * esize_, slot(chunk, q) + lo * esize_, (hi - lo) * esize_);
    }
  } else if (output_blocks(kind_)) {
    // Alltoall: block r of each peer's part of the set.
    const std::size_t offset = kind_ == Collective::alltoall ? static_cast<std::size_t>(r) * n * esize_ : 0;
    for (int q = 0; q < p; ++q)
      if (q != r)  // this rank's own block: from its input, at the end (see progress_barriers)
        copy_out_(recv_ + (static_cast<std::size_t>(q) * count_ + done) * esize_, slot(chunk, q) + offset, n * esize_);
  } else if (kind_ == Collective::gather || kind_ == Collective::allgatherv) {
    if (kind_ == Collective::gather && r != root_) return;
    for (int q = 0; q < p; ++q)
      if (const std::size_t m = chunk_elems(chunk, q); q != r && m > 0)
        copy_out_(recv_ + block_offset(q) + done * esize_, slot(chunk, q), m * esize_);
  } else if (kind_ == Collective::reduce) {  // the root: its own input, then the peers' parts
    if (r == root_) {
      const auto part = [&](int q) { return slot(chunk, q); };
      if (n * esize_ <= staged_reduce_bytes)
        reduce_staged(recv_ + done * esize_, send_ + done * esize_, n, part);
      else
        reduce_own_first(recv_ + done * esize_, send_ + done * esize_, n, part);
    }
  } else if (kind_ == Collective::scatter) {
    if (r != root_)
      copy_out_(recv_ + done * esize_, slot(chunk, 0) + static_cast<std::size_t>(r) * n * esize_, n * esize_);
  } else if (r != root_) {  // broadcast
    copy_out_(recv_ + done * esize_, slot(chunk, 0), n * esize_);
  }
}

}  // namespace tutti::transport::shm
