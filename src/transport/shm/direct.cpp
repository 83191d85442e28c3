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
#include "transport/shm/direct.hpp"

#include <algorithm>
#include <cstdint>
#include <cstring>
#if defined(__x86_64__)
#include <emmintrin.h>
#endif
#include <string>
#include <utility>

#include "reduce/reduce.hpp"
#include "transport/shm/shm_transport.hpp"

namespace tutti::transport::shm {

namespace {

// Results of a large call (streaming_bytes) are written once and not read again soon: stores that
// bypass the cache spare the read-for-ownership of every destination line (a third of an
// out-of-place allreduce's memory traffic).
void copy_cached(std::byte* dst, const std::byte* src, std::size_t bytes) { std::memcpy(dst, src, bytes); }

// memcpy with non-temporal stores (SSE2, every x86-64) where the destination allows it.
void copy_streaming(std::byte* dst, const std::byte* src, std::size_t bytes) {
#if defined(__x86_64__)
  const std::size_t head = std::min(bytes, (16 - reinterpret_cast<std::uintptr_t>(dst) % 16) % 16);
  std::memcpy(dst, src, head);
  dst += head, src += head, bytes -= head;
  std::size_t i = 0;
  for (; i + 64 <= bytes; i += 64) {
    const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 16));
    const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 32));
    const __m128i d = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 48));
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i), a);
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i + 16), b);
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i + 32), c);
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i + 48), d);
  }
  std::memcpy(dst + i, src + i, bytes - i);
  _mm_sfence();  // the streamed stores are visible before the barrier that follows
#else
  std::memcpy(dst, src, bytes);
#endif
}

using clock = std::chrono::steady_clock;

// Up to this many bytes an allreduce is one step in which every rank reduces everything itself:
// a second barrier costs more than reducing a few KiB p times.
constexpr auto liveness_period = std::chrono::milliseconds(100);

// Elements [first, last) of `n` that rank `r` of `p` owns (balanced, contiguous).
std::pair<std::size_t, std::size_t> slice(std::size_t n, int p, int r) {
  const auto up = static_cast<std::size_t>(p);
  return {n * static_cast<std::size_t>(r) / up, n * static_cast<std::size_t>(r + 1) / up};
}

// The phases of one collective: a chunk is begun (inputs copied into the data set), then, for
// allreduce, reduced (each rank its slice), then finished (results read out). Phase k finishes
// chunk k-1 and begins chunk k, so a chunk's reads overlap the next chunk's writes.
class DirectRun final : public DirectCollective {
 public:
  DirectRun(ShmTransport& transport, Collective kind, const std::byte* send, std::byte* recv, std::size_t count,
            DataType type, ReduceOp op, int root, std::chrono::milliseconds timeout);
  /// The signature this rank announces for it: its seq is the one whose comparison the collective
  /// waits for (a collective run without one, by direct_collective, stays unchecked).
  void bind(const Signature& signature) override;
  bool progress() override { return inline_ ? progress_inline(true) : progress_barriers(); }
  bool poll() override { return inline_ ? progress_inline(false) : progress_barriers(); }
  std::vector<int> waiting_for() const override;
  ~DirectRun() override {
    if (inline_ && !consumed_) transport_.consumed_inline(seq_);
  }
  // One is made and destroyed on every direct call: each thread keeps a freed one for its next.
  static void* operator new(std::size_t bytes);
  static void operator delete(void* block, std::size_t bytes);
  /// The result goes to `staging` and is copied to `recv` at the end (reduce_scatter in place,
  /// whose result is the start of the buffer that holds the input).
  void deliver_to(std::byte* recv, std::unique_ptr<std::byte[]> staging) {
    deliver_ = recv;
    staging_ = std::move(staging);
  }

 private:
  int rank() const { return transport_.rank(); }
  int size() const { return transport_.size(); }
  std::byte* slot(std::size_t chunk, int q) const { return segment_.direct_slot(first_use_ + chunk, q); }
  std::size_t chunk_elems(std::size_t chunk) const { return std::min(per_chunk_, count_ - chunk * per_chunk_); }
  bool progress_barriers();
  bool progress_inline(bool arrange_wake);
  void deliver_inline();
  const std::byte* input_of(int q) const { return segment_.signature_slot(q, seq_).data; }
  /// Whether an inline collective needs rank q's publication: a broadcast only its own and the
  /// root's, one of no elements only its own (see bind), the others every rank's.
  bool needs(int q) const { return q == rank() || (count_ > 0 && (kind_ != Collective::broadcast || q == root_)); }
  /// dst = part(0) op part(1) op ... (n elements; avg divides), in the same order on every rank,
  /// so that ranks that each reduce everything get the same bits.
  template <typename Part>
  void reduce_parts(std::byte* dst, std::size_t n, const Part& part) const;
  /// The result of a staged call (deliver_to) into the caller's buffer.
  void deliver_staged();
  void run_phase(std::size_t phase);
  void begin(std::size_t chunk);
  void reduce_slice(std::size_t chunk);
  void finish(std::size_t chunk);
  void arrive();
  bool all_arrived() const;
  void check_deadline_and_liveness();
  bool signatures_compared();
  [[noreturn]] void fail(const Error& error);

  ShmTransport& transport_;
  Segment& segment_;
  Collective kind_;
  const std::byte* send_;
  std::byte* recv_;
  std::size_t count_, esize_;
  DataType type_;
  ReduceOp op_;
  int root_;
  std::chrono::milliseconds timeout_;
  clock::time_point deadline_{};  // timeout_ after the first wait (a call that never waits reads no clock)
  clock::time_point next_liveness_check_{};
  bool small_ = false;         // allreduce in one step: every rank reduces everything
  bool three_parts_ = false;   // allreduce in chunks: begin, reduce_slice, finish
  std::size_t per_chunk_ = 0;  // elements per chunk (per block for reduce_scatter)
  std::size_t chunks_ = 0;
  std::size_t phases_ = 0, phase_ = 0;
  std::uint64_t first_use_ = 0;  // the data-set use of chunk 0 (once reserved_)
  bool reserved_ = false;
  std::uint64_t round_ = 0;         // the barrier round this rank waits for (0: none)
  std::uint64_t seq_ = no_seq;      // see bind
  bool compared_ = false;           // every rank's signature was compared with ours
  bool awaits_signatures_ = false;  // waiting for that rather than for a barrier
  bool inline_ = false;             // runs inline (see the top of this file)
  bool consumed_ = false;           // inline: every peer's input read
  int next_peer_ = 0;               // inline: ranks below this have published
  WireSignature wire_{};            // inline: this rank's signature, which the peers' must equal
  // How results leave the data sets: with streaming stores when the ranks together write at least
  // streaming_bytes of results that they have not read (in place, begin() read them into the cache).
  void (*copy_out_)(std::byte*, const std::byte*, std::size_t) = copy_cached;
  std::byte* deliver_ = nullptr;  // see deliver_to
  std::unique_ptr<std::byte[]> staging_;
};

struct SpareRun {
  void* block = nullptr;
  bool closed = false;  // the thread is exiting: runs destroyed after this free their memory
  ~SpareRun() {
    ::operator delete(block, sizeof(DirectRun));
    block = nullptr, closed = true;
  }
};
thread_local SpareRun spare_run;

void* DirectRun::operator new(std::size_t bytes) {
  if (bytes != sizeof(DirectRun) || spare_run.block == nullptr) return ::operator new(bytes);
  return std::exchange(spare_run.block, nullptr);
}

void DirectRun::operator delete(void* block, std::size_t bytes) {
  if (bytes == sizeof(DirectRun) && spare_run.block == nullptr && !spare_run.closed)
    spare_run.block = block;
  else
    ::operator delete(block, bytes);
}

DirectRun::DirectRun(ShmTransport& transport, Collective kind, const std::byte* send, std::byte* recv,
                     std::size_t count, DataType type, ReduceOp op, int root, std::chrono::milliseconds timeout)
    : transport_(transport),
      segment_(transport.segment()),
      kind_(kind),
      send_(send),
      recv_(recv),
      count_(count),
      esize_(size_of(type)),
      type_(type),
      op_(op),
      root_(root),
      timeout_(timeout) {
  const std::size_t chunk_bytes = segment_.layout().direct_chunk, p = static_cast<std::size_t>(size());
  if (kind_ == Collective::allreduce && count * esize_ <= small_allreduce_bytes) {
    small_ = true, per_chunk_ = std::max<std::size_t>(count, 1);
  } else if (kind_ == Collective::allreduce) {
    three_parts_ = true, per_chunk_ = chunk_bytes / esize_;
  } else if (kind_ == Collective::reduce_scatter) {
    per_chunk_ = chunk_bytes / esize_ / p;
  } else if (kind_ == Collective::allgather) {
    per_chunk_ = chunk_bytes / esize_;
  } else {  // broadcast: the root writes a whole data set (the p parts are contiguous)
    per_chunk_ = chunk_bytes * p / esize_;
  }
  chunks_ = count == 0 ? 0 : (count + per_chunk_ - 1) / per_chunk_;
  phases_ = chunks_ == 0 ? 0 : (three_parts_ ? 2 * chunks_ + 1 : chunks_ + 1);
  const std::size_t written = (kind_ == Collective::allgather ? p : 1) * count * esize_;
  const bool cold = kind_ == Collective::allreduce   ? send != recv && !small_
                    : kind_ == Collective::allgather ? send != recv + static_cast<std::size_t>(rank()) * count * esize_
                                                     : kind_ == Collective::broadcast && rank() != root;
  if (cold && written * p >= streaming_bytes) copy_out_ = copy_streaming;
}

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

template <typename Part>
void DirectRun::reduce_parts(std::byte* dst, std::size_t n, const Part& part) const {
  const int p = size();
  if (p == 1) {
    if (dst != part(0)) std::memcpy(dst, part(0), n * esize_);
  } else {
    reduce::apply(op_, type_, dst, part(0), part(1), n);
    for (int q = 2; q < p; ++q) reduce::apply(op_, type_, dst, dst, part(q), n);
  }
  if (op_ == ReduceOp::avg) reduce::divide(type_, dst, n, p);
}

void DirectRun::deliver_staged() {
  if (!staging_) return;
  std::memcpy(deliver_, recv_, count_ * esize_);
  staging_.reset();
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
  if (inline_) {
    std::vector<int> ranks = transport_.unpublished_ranks(seq_);
    std::erase_if(ranks, [&](int q) { return !needs(q); });
    return ranks;
  }
  if (awaits_signatures_) return transport_.unpublished_ranks(seq_);
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
  const auto now = clock::now();
  if (deadline_ == clock::time_point{}) deadline_ = now + timeout_;
  if (now >= deadline_) {
    std::string ranks;
    for (int q : waiting_for()) ranks += (ranks.empty() ? "" : ", ") + std::to_string(q);
    fail(Error(ErrorCode::timeout, "shm direct " + std::string(to_string(kind_)) + " on rank " +
                                       std::to_string(rank()) + ": timed out waiting for rank(s) " + ranks +
                                       (awaits_signatures_ ? " to start it" : "")));
  }
  // Not at once: most waits end within microseconds, and looking costs system calls.
  if (next_liveness_check_ == clock::time_point{}) next_liveness_check_ = now + liveness_period;
  if (now < next_liveness_check_) return;
  next_liveness_check_ = now + liveness_period;
  for (int q : waiting_for())
    if (transport_.peer_has_died(q))
      fail(Error(ErrorCode::peer_failure, "shm direct " + std::string(to_string(kind_)) + " on rank " +
                                              std::to_string(rank()) + ": rank " + std::to_string(q) + " died"));
}

bool DirectRun::progress_barriers() {
  try {
    if (const auto failure = transport_.aborted()) throw failure->error;
    // Data-set uses are taken when a collective first runs (in issue order), not when it is made:
    // an inline one takes none, and a set may be written again only after a barrier that
    // follows its last reads (see the top of this file).
    if (!reserved_) {
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
    // An allgather's own block, out of place, in one copy once the peers' blocks are in: copied
    // chunk by chunk between the barriers it made every call at 1 MiB up to twice as long.
    if (kind_ == Collective::allgather && count_ > 0) {
      std::byte* own = recv_ + static_cast<std::size_t>(rank()) * count_ * esize_;
      if (own != send_) copy_out_(own, send_, count_ * esize_);
    }
    deliver_staged();
    return true;
  } catch (const Error& error) {
    fail(error);  // peers may be waiting at a barrier this rank will not reach
  }
}

void DirectRun::run_phase(std::size_t phase) {
  if (three_parts_ && phase % 2 == 1) return reduce_slice(phase / 2);
  const std::size_t chunk = three_parts_ ? phase / 2 : phase;
  if (chunk > 0) finish(chunk - 1);
  if (chunk < chunks_) begin(chunk);
}

void DirectRun::begin(std::size_t chunk) {
  const std::size_t done = chunk * per_chunk_, n = chunk_elems(chunk);
  const int r = rank();
  if (kind_ == Collective::reduce_scatter) {
    for (int q = 0; q < size(); ++q)  // the blocks the peers reduce (this rank's own: from send)
      if (q != r)
        std::memcpy(slot(chunk, r) + static_cast<std::size_t>(q) * n * esize_,
                    send_ + (static_cast<std::size_t>(q) * count_ + done) * esize_, n * esize_);
  } else if (kind_ == Collective::broadcast) {
    if (r == root_) std::memcpy(slot(chunk, 0), recv_ + done * esize_, n * esize_);
  } else if (three_parts_) {  // the slices the peers reduce; this rank reduces its own from send
    const auto [first, last] = slice(n, size(), r);
    std::memcpy(slot(chunk, r), send_ + done * esize_, first * esize_);
    std::memcpy(slot(chunk, r) + last * esize_, send_ + (done + last) * esize_, (n - last) * esize_);
  } else {
    std::memcpy(slot(chunk, r), send_ + done * esize_, n * esize_);
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
  bool reduced = false;
  for (int q = 0; q < p; ++q)
    if (q != r) reduce::apply(op_, type_, out, reduced ? out : in, slot(chunk, q) + offset, n), reduced = true;
  if (!reduced && out != in) std::memcpy(out, in, n * esize_);
  if (op_ == ReduceOp::avg) reduce::divide(type_, out, n, p);
  std::memcpy(slot(chunk, r) + offset, out, n * esize_);
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
  } else if (kind_ == Collective::allgather) {
    for (int q = 0; q < p; ++q)
      if (q != r)  // this rank's own block: from its input, at the end (see progress_barriers)
        copy_out_(recv_ + (static_cast<std::size_t>(q) * count_ + done) * esize_, slot(chunk, q), n * esize_);
  } else if (r != root_) {  // broadcast
    copy_out_(recv_ + done * esize_, slot(chunk, 0), n * esize_);
  }
}

ReduceOp required_op(Collective kind, std::optional<ReduceOp> op) {
  if (!op)
    throw Error(ErrorCode::invalid_argument,
                "shm direct " + std::string(to_string(kind)) + ": a reduction needs an op");
  return *op;
}

}  // namespace

std::unique_ptr<DirectCollective> start_direct(Transport& transport, Collective kind, const void* send, void* recv,
                                               std::size_t count, DataType type, std::optional<ReduceOp> op, int root,
                                               std::chrono::milliseconds timeout) {
  if (!is_shm(transport)) return nullptr;
  auto* shm = static_cast<ShmTransport*>(&transport);
  if (!serves(kind))
    throw Error(ErrorCode::unsupported, "shm direct: no direct algorithm for " + std::string(to_string(kind)));
  // A rank's part of a data set must hold one element of each of the p blocks.
  if (kind == Collective::reduce_scatter &&
      shm->segment().layout().direct_chunk / size_of(type) < std::size_t(shm->size()))
    throw Error(ErrorCode::unsupported, "shm direct reduce_scatter: too many ranks for the data area");
  if (kind == Collective::broadcast && (root < 0 || root >= shm->size()))
    throw Error(ErrorCode::invalid_argument, "shm direct broadcast: root " + std::to_string(root) +
                                                 " is out of range for size " + std::to_string(shm->size()));
  const bool reduces = kind == Collective::allreduce || kind == Collective::reduce_scatter;
  const ReduceOp reduce_op = reduces ? required_op(kind, op) : ReduceOp::sum;
  // The in-place forms, mapped onto the forms DirectRun takes.
  const auto* in = static_cast<const std::byte*>(send);
  auto* out = static_cast<std::byte*>(recv);
  const std::size_t block = static_cast<std::size_t>(shm->rank()) * count * size_of(type);
  std::unique_ptr<std::byte[]> staging;
  if (kind == Collective::allgather && send == recv) in = out + block;
  if (kind == Collective::reduce_scatter && send == recv && block != 0 && count > 0) {
    staging = std::make_unique_for_overwrite<std::byte[]>(count * size_of(type));
    out = staging.get();
  }
  auto run = std::make_unique<DirectRun>(*shm, kind, in, out, count, type, reduce_op, root, timeout);
  if (staging) run->deliver_to(static_cast<std::byte*>(recv), std::move(staging));
  return run;
}

bool serves(Collective kind) {
  return kind == Collective::allreduce || kind == Collective::reduce_scatter || kind == Collective::allgather ||
         kind == Collective::broadcast;
}

bool direct_collective(Transport& transport, Collective kind, const void* send, void* recv, std::size_t count,
                       DataType type, std::optional<ReduceOp> op, int root, std::chrono::milliseconds timeout) {
  auto run = start_direct(transport, kind, send, recv, count, type, op, root, timeout);
  if (!run) return false;
  Signature signature;  // for the errors only: nothing was announced
  signature.seq = no_seq;
  signature.collective = kind;
  signature.count = count;
  signature.type = type;
  signature.op = op;
  signature.root = root;
  signature.algorithm = Algorithm::direct;
  transport::finish(*run, transport, signature, timeout);
  return true;
}

bool ShmTransport::serves_natively(Algorithm algorithm, Collective collective) const {
  return algorithm == Algorithm::direct && serves(collective);
}

std::unique_ptr<NativeCollective> ShmTransport::start_native(Algorithm algorithm, const NativeCall& call,
                                                             std::chrono::milliseconds timeout) {
  if (!serves_natively(algorithm, call.collective)) return Transport::start_native(algorithm, call, timeout);
  return start_direct(*this, call.collective, call.send, call.recv, call.count, call.type, call.op, call.root, timeout);
}

// By name, not dynamic_cast: this is on every direct call's path.
bool is_shm(const Transport& transport) { return transport.name() == "shm"; }

}  // namespace tutti::transport::shm
