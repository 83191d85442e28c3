// One direct collective in progress on this rank, as DirectRun: internal to the shared-memory
// direct algorithms. direct.cpp holds the barrier path (chunks through the data sets) and the
// run's life, direct_inline.cpp the inline path (inputs in the signature slots),
// direct_single_copy.cpp the paths that read the peers' buffers (single copy, alltoallv's
// exchange), direct_zero_copy.cpp the zero-copy path, direct_start.cpp the entry points
// (start_direct, ShmTransport::start_native).
#pragma once

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <span>
#include <utility>
#include <vector>

#include "core/copy.hpp"
#include "core/inline_array.hpp"
#include "core/shared_memory.hpp"
#include "reduce/reduce.hpp"
#include "transport/shm/direct.hpp"
#include "transport/shm/shm_transport.hpp"

namespace tutti::transport::shm {

/// core::copy as a function (DirectRun::copy_out_'s default; core::copy_streaming is the other).
void copy_cached(std::byte* dst, const std::byte* src, std::size_t bytes);

// Elements [first, last) of `n` that rank `r` of `p` owns (balanced, contiguous).
inline std::pair<std::size_t, std::size_t> slice(std::size_t n, int p, int r) {
  const auto up = static_cast<std::size_t>(p);
  return {n * static_cast<std::size_t>(r) / up, n * static_cast<std::size_t>(r + 1) / up};
}

/// dst = part(0) op part(1) op ... (n elements of p ranks; avg divides), in the same order on
/// every rank, so that ranks that each reduce everything get the same bits.
template <typename Part>
void reduce_parts(ReduceOp op, DataType type, int p, std::byte* dst, std::size_t n, const Part& part) {
  if (p == 1) {
    if (dst != part(0)) core::copy(dst, part(0), n * size_of(type));
  } else {
    reduce::apply(op, type, dst, part(0), part(1), n);
    for (int q = 2; q < p; ++q) reduce::apply(op, type, dst, dst, part(q), n);
  }
  if (op == ReduceOp::avg) reduce::divide(type, dst, n, p);
}

/// The bytes of its input that rank r publishes for a direct collective, and where they are: all
/// of its input (reduce_scatter's and alltoall's p blocks), a broadcast's root its buffer, a
/// scatter's root its p blocks; a broadcast's or scatter's other ranks and a barrier nothing.
struct Publication {
  const std::byte* data = nullptr;
  std::size_t bytes = 0;
};
inline Publication publication(Collective kind, const std::byte* send, const std::byte* recv, std::size_t count,
                               std::size_t esize, int r, int p, int root) {
  const std::size_t bytes = count * esize, all = static_cast<std::size_t>(p) * bytes;
  switch (kind) {
    case Collective::broadcast:
      return r == root ? Publication{recv, bytes} : Publication{};
    case Collective::scatter:
      return r == root ? Publication{send, all} : Publication{};
    case Collective::barrier:
      return {};
    default:
      return {send, input_blocks(kind) ? all : bytes};
  }
}

/// Where rank r reads its own input back in inline collective `kind` (combine_inline): its
/// publication in place (the caller's buffer) where that lies apart from its result, or where its
/// result overwrites it only after reading it (a reduction's parts 0 and 1, which reduce_parts
/// reads before it writes, so ranks 0 and 1; an alltoall's own block, which stays where it is);
/// else its slot's copy. Rank 0's slot shares its first line with `arrivals`, which the peers'
/// arrivals take from its core: read back from there, an 8-byte alltoallv ran at 0.8 of
/// OpenMPI's speed.
inline const std::byte* own_input(Collective kind, int r, const Publication& mine, const std::byte* recv,
                                  std::size_t recv_bytes, const std::byte* slot) {
  if (mine.data == nullptr) return slot;
  const auto in = reinterpret_cast<std::uintptr_t>(mine.data), out = reinterpret_cast<std::uintptr_t>(recv);
  const bool apart = recv == nullptr || in + mine.bytes <= out || out + recv_bytes <= in;
  const bool reduces =
      kind == Collective::allreduce || kind == Collective::reduce_scatter || kind == Collective::reduce;
  return apart || (reduces && r <= 1) || kind == Collective::alltoall ? mine.data : slot;
}

/// The most that any rank publishes (see publication), the same on every rank: whether the
/// collective runs inline (at most inline_bytes). `largest`: the call's count, or allgatherv's
/// largest count.
inline std::size_t largest_publication(Collective kind, std::size_t largest, std::size_t esize, int p) {
  if (kind == Collective::barrier) return 0;
  return (input_blocks(kind) || kind == Collective::scatter ? static_cast<std::size_t>(p) : 1) * largest * esize;
}

/// What an alltoallv publishes with its signature (every alltoallv tries inline: no rank can
/// tell whether its peers' inputs fit): [1, its p + 1 send displacements, its p + 1 receive
/// displacements, its input] where that fits in a slot (slot_data_bytes), else [0]. Written into
/// `out` (slot_data_bytes); returns its size.
std::size_t alltoallv_publication(std::byte* out, const std::byte* send, std::span<const std::size_t> send_starts,
                                  std::span<const std::size_t> recv_starts, std::size_t esize);
inline constexpr std::size_t alltoallv_header_words(std::size_t p) { return 3 + 2 * p; }
/// Whether an alltoallv input of `elements` on p ranks fits its slot after its header (what
/// alltoallv_publication publishes inline).
inline bool alltoallv_fits_inline(std::size_t p, std::size_t elements, std::size_t esize) {
  return alltoallv_header_words(p) * sizeof(std::uint64_t) + elements * esize <= slot_data_bytes;
}
/// Rank q's alltoallv header ([whether its input follows, its p + 1 send displacements, its p + 1
/// receive displacements]) copied from `from` to `to` (once: a peer may change it) and checked:
/// a flag of 0 or 1, displacements that start at 0 and grow, an input that follows of at most
/// `room` elements, and on rank r its own call's receive displacements. Throws the error of a
/// corrupt segment naming q. Returns the flag; `flag_only`: a header of flag 0 is that word alone.
std::uint64_t take_alltoallv_header(const Segment& segment, int q, int r, const std::byte* from,
                                    std::span<const std::size_t> recv_starts, std::size_t room, bool flag_only,
                                    std::uint64_t* to);
/// Every pair of ranks' alltoallv counts (p headers, as take_alltoallv_header left them), checked
/// alike on every rank: throws Error(mismatch) naming the first pair that disagrees.
void check_alltoallv_pairs(const std::uint64_t* all, int p, int r);
/// Rank r's result of inline alltoallv `seq` from every rank's slot, into `recv` (block q at
/// recv_starts[q]), after checking every pair of ranks' counts alike on every rank. False, and
/// nothing written, where some rank's input did not fit (the data set serves then, on every
/// rank). Throws Error(mismatch) for counts that disagree, or the error of a corrupt slot.
bool alltoallv_from_slots(const Segment& segment, std::uint64_t seq, int r, std::size_t esize, std::byte* recv,
                          std::span<const std::size_t> recv_starts, const std::byte* own);

/// Memory a run needs for the call (an in-place alltoall's snapshot, an in-place reduce_scatter's
/// staged result), taken from the calling thread's spare where it is large enough and given back
/// to the spare of the thread that drops it (see direct.cpp): an in-place call repeats at one
/// size, and fresh memory costs its first touches every time.
class Scratch {
 public:
  Scratch() = default;
  explicit Scratch(std::size_t bytes);
  Scratch(Scratch&& other) noexcept : data_(std::move(other.data_)), capacity_(std::exchange(other.capacity_, 0)) {}
  Scratch& operator=(Scratch&& other) noexcept {
    if (this != &other) {
      release();
      data_ = std::move(other.data_), capacity_ = std::exchange(other.capacity_, 0);
    }
    return *this;
  }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  ~Scratch() { release(); }
  std::byte* data() const { return data_.get(); }
  explicit operator bool() const { return data_ != nullptr; }

 private:
  void release();
  std::unique_ptr<std::byte[]> data_;
  std::size_t capacity_ = 0;
};

/// Ranks whose per-call arrays (block starts, alltoallv headers) live inside the run or on the
/// stack: a call of up to this many ranks allocates none.
inline constexpr std::size_t inline_ranks = 16;
using BlockStarts = core::InlineArray<std::size_t, inline_ranks + 1>;
/// allgatherv's (alltoallv's) blocks: block q is elements [starts[q], starts[q + 1]) of the result
/// (p + 1 entries), placed into `starts` (a fresh one).
inline void place_block_starts(BlockStarts& starts, std::span<const std::size_t> counts) {
  starts.place(counts.size() + 1);
  starts[0] = 0;
  for (std::size_t q = 0; q < counts.size(); ++q) starts[q + 1] = starts[q] + counts[q];
}
/// Every rank's alltoallv header (alltoallv_header_words each), copied once from its slot.
using AlltoallvHeaders = core::InlineArray<std::uint64_t, inline_ranks * alltoallv_header_words(inline_ranks)>;

/// An inline collective's result on rank r of p from the inputs the ranks published (input(q):
/// rank q's signature slot data, this rank's own_input), into `recv` (reduce_scatter: this rank's
/// block; allgather(v) in place, `send` already in its block: that block is left alone; alltoall:
/// block q from block r of rank q's input, in place too, since the peers' inputs are read from
/// their slots and its own block stays where it is; allgatherv: block q
/// at `starts[q]`, the counts' prefix sums; gather and reduce: at the root only; scatter: block r
/// of the root's). The same on whichever path (DirectRun, ShmTransport::run_now) each rank takes.
template <typename Input>
void combine_inline(Collective kind, const std::byte* send, std::byte* recv, std::size_t count,
                    std::span<const std::size_t> starts, DataType type, ReduceOp op, int root, int r, int p,
                    const Input& input) {
  const std::size_t esize = size_of(type), bytes = count * esize;
  const auto at = [](std::size_t q, std::size_t block) { return q * block; };
  if (kind == Collective::allgatherv) {
    for (int q = 0; q < p; ++q) {
      const auto u = static_cast<std::size_t>(q);
      std::byte* dst = recv + starts[u] * esize;
      const std::size_t len = (starts[u + 1] - starts[u]) * esize;
      if (len > 0 && (q != r || send != dst)) core::copy(dst, input(q), len);
    }
    return;
  }
  if (bytes == 0) return;
  const auto ur = static_cast<std::size_t>(r);
  if (kind == Collective::allreduce || kind == Collective::reduce_scatter ||
      (kind == Collective::reduce && r == root)) {
    const std::size_t offset = kind == Collective::reduce_scatter ? at(ur, bytes) : 0;
    reduce_parts(op, type, p, recv, count, [&](int q) { return input(q) + offset; });
  } else if (kind == Collective::alltoall) {
    for (int q = 0; q < p; ++q) {
      std::byte* dst = recv + at(static_cast<std::size_t>(q), bytes);
      const std::byte* src = input(q) + at(ur, bytes);
      if (dst != src) core::copy(dst, src, bytes);  // (in place, its own block stays)
    }
  } else if (kind == Collective::allgather || (kind == Collective::gather && r == root)) {
    const bool in_place = send == recv + at(ur, bytes);
    for (int q = 0; q < p; ++q)
      if (q != r || !in_place) core::copy(recv + at(static_cast<std::size_t>(q), bytes), input(q), bytes);
  } else if (kind == Collective::scatter) {
    const std::byte* block = (r == root ? send : input(root)) + at(ur, bytes);
    if (block != recv) core::copy(recv, block, bytes);
  } else if (kind == Collective::broadcast && r != root) {
    core::copy(recv, input(root), bytes);
  }
}

// The phases of one collective: a chunk is begun (inputs copied into the data set), then, for
// allreduce, reduced (each rank its slice), then finished (results read out). Phase k finishes
// chunk k-1 and begins chunk k, so a chunk's reads overlap the next chunk's writes.
class DirectRun final : public DirectCollective {
 public:
  using clock = std::chrono::steady_clock;
  /// `counts`: allgatherv's, one per rank (`count` is this rank's); alltoallv's send counts, with
  /// `recv_counts`; empty for the others.
  DirectRun(ShmTransport& transport, Collective kind, const std::byte* send, std::byte* recv, std::size_t count,
            std::span<const std::size_t> counts, std::span<const std::size_t> recv_counts, DataType type, ReduceOp op,
            int root, std::chrono::milliseconds timeout);
  /// The signature this rank announces for it: its seq is the one whose comparison the collective
  /// waits for (a collective run without one stays unchecked).
  void bind(const Signature& signature) override;
  /// Takes over an inline collective that ShmTransport::run_now published (and files as reading)
  /// but whose peers were late: it goes on as a bound one would after its announce.
  void adopt_published(const Signature& signature, const WireSignature& wire, const Publication& mine) {
    seq_ = signature.seq;
    wire_ = wire;
    inline_ = true;
    if (kind_ != Collective::alltoallv) return;  // (its own header and blocks are read from its copy)
    std::memcpy(published_.data(), mine.data, mine.bytes);
    published_bytes_ = mine.bytes;
  }
  bool progress() override {
    spinning_ = false;
    return inline_ ? progress_inline(true) : progress_barriers();
  }
  bool poll() override {
    spinning_ = true;
    return inline_ ? progress_inline(false) : progress_barriers();
  }
  std::vector<int> waiting_for() const override;
  ~DirectRun() override {
    if ((inline_ || describes_) && !consumed_) transport_.consumed_inline(seq_);
  }
  // One is made and destroyed on every direct call: each thread keeps a freed one for its next.
  static void* operator new(std::size_t bytes);
  static void operator delete(void* block, std::size_t bytes);
  /// The result goes to `staging` and is copied to `recv` at the end (reduce_scatter in place,
  /// whose result is the start of the buffer that holds the input).
  void deliver_to(std::byte* recv, Scratch staging) {
    deliver_ = recv;
    staging_ = std::move(staging);
  }
  /// The input is `snapshot` (alltoallv in place, whose result overwrites input still to be
  /// read), which the run keeps until it ends. (An alltoall in place takes its own where it needs
  /// one: see snapshot_blocks.)
  void keep_input(Scratch snapshot) { snapshot_ = std::move(snapshot); }

 private:
  struct Described {  // what describe publishes: where send and recv lie (id 0: not shared)
    core::SharedLocation send, recv;
    std::uint64_t in_place = 0;  // an alltoall, an allgather: 1 where this rank runs it in place (see plan)
  };

  int rank() const { return transport_.rank(); }
  int size() const { return transport_.size(); }
  std::byte* slot(std::size_t chunk, int q) const { return segment_.direct_slot(first_use_ + chunk, q); }
  /// Elements of a block in chunk `chunk` (allgatherv: of rank q's block, 0 past its end).
  std::size_t chunk_elems(std::size_t chunk) const {
    const std::size_t done = chunk * per_chunk_;
    return count_ > done ? std::min(per_chunk_, count_ - done) : 0;
  }
  std::size_t chunk_elems(std::size_t chunk, int q) const {
    if (starts_.empty()) return chunk_elems(chunk);
    const std::size_t n = block_elems(q), done = chunk * per_chunk_;
    return n > done ? std::min(per_chunk_, n - done) : 0;
  }
  std::size_t block_elems(int q) const {
    return starts_.empty() ? count_ : starts_[static_cast<std::size_t>(q) + 1] - starts_[static_cast<std::size_t>(q)];
  }
  /// Where block q of the result starts, in bytes (allgather, alltoall, gather: q · count).
  std::size_t block_offset(int q) const {
    return (starts_.empty() ? static_cast<std::size_t>(q) * count_ : starts_[static_cast<std::size_t>(q)]) * esize_;
  }
  /// This rank's own block of the result, from its input, once every peer's is in (see progress_barriers).
  void copy_own_block();
  /// Alltoall in place by single copy: this rank's blocks for its peers into a snapshot, which
  /// becomes the input (the peers write into this buffer, or this rank into it, while blocks
  /// still to be sent are there); its own block stays where it is.
  void snapshot_blocks();
  bool progress_barriers();
  bool progress_inline(bool arrange_wake);
  void deliver_inline();
  /// Alltoallv's inline attempt (see alltoallv_publication), and its way on where some rank's
  /// input did not fit.
  void publish_alltoallv(const Signature& signature);
  bool go_through_sets();
  const std::byte* input_of(int q) const { return segment_.signature_slot(q, seq_).data; }
  /// Whether an inline collective needs rank q's publication: its own, and what reads_from says
  /// (alltoallv: every rank's, whose flag decides the way for all).
  bool needs(int q) const {
    return q == rank() || kind_ == Collective::alltoallv || reads_from(kind_, q, rank(), root_, elements());
  }
  /// The call's elements on all ranks together (allgatherv: the sum of its counts), 0 for none.
  std::size_t elements() const { return starts_.empty() ? count_ : starts_.back(); }
  /// shm::reduce_parts with this run's op, type and ranks.
  template <typename Part>
  void reduce_parts(std::byte* dst, std::size_t n, const Part& part) const;
  /// The result of a staged call (deliver_to) into the caller's buffer.
  void deliver_staged();
  void plan();
  /// Streaming stores for results when the ranks write at least streaming_bytes they have not read.
  void choose_copy_out();
  void run_phase(std::size_t phase);
  /// Single copy: phase 0 publishes this rank's input address, phase 1 reads the peers' inputs
  /// (straight into the result; reduce_scatter through a scratch piece it reduces from), phase 2
  /// (after every rank's reads) lets the inputs go.
  void run_single_copy_phase(std::size_t phase);
  void read_input(int q, std::size_t offset, std::byte* dst, std::size_t bytes);
  void write_result(int q, std::size_t offset, const std::byte* src, std::size_t bytes);
  /// The address rank q published for this run, plus `offset`.
  std::uint64_t published_at(int q, std::size_t offset) const;
  /// Fails the run for a read from (or write into) rank q that returned errno `failure`.
  [[noreturn]] void peer_copy_failed(int q, int failure, bool write, std::size_t bytes);
  /// Whether single copy writes each block into the rank that receives it (gather, allgather,
  /// alltoall, alltoallv's inputs out of the set) rather than has that rank read it: a gather's
  /// root then copies only its own block while the others write theirs, and an alltoall or
  /// allgather measured 1.0-1.3x faster than reading from 256 KiB at p = 2. A broadcast's root
  /// writes a share of its buffer into every receiver while they read the rest
  /// (direct_single_copy.cpp, root_share). Only in a bound run, whose counts every rank compared
  /// before any rank writes into another.
  bool pushes() const {
    return seq_ != no_seq &&
           (kind_ == Collective::gather || kind_ == Collective::allgather || kind_ == Collective::alltoall ||
            kind_ == Collective::alltoallv || kind_ == Collective::broadcast);
  }
  /// Alltoallv: phase 0 writes this rank's send displacements into its part of a data set, and
  /// its whole input after them when it fits (else publishes its address for single copy);
  /// phase 1 takes block r of every peer's input, from its part of the set or straight from its
  /// buffer; phase 2 (after every rank's reads) lets the inputs go.
  void run_exchange_phase(std::size_t phase);
  /// Zero copy (zero_copy_bytes): bind publishes where this rank's buffers lie in shared memory
  /// (describe); once every rank's signature is compared, plan_zero_copy reads every rank's
  /// description and maps the peers' buffers if all that are read are shared (allreduce: every
  /// input and result; allgather and reduce_scatter: every input; broadcast: the root's buffer).
  /// Phase 0 waits for every rank to have finished its earlier collectives (whose last writes may
  /// be into this one's inputs); phase 1 reads the peers' buffers (allreduce: reduces this rank's
  /// slice from every input into its result; reduce_scatter: its block; allgather, broadcast:
  /// copies the peers' blocks or the root's buffer into its result); for allreduce, phase 2 copies
  /// the other slices from the peers' results; the last phase (after every rank's reads) lets the
  /// buffers go.
  void describe(const Signature& signature);
  /// Publishes described_ with the signature (as an inline input is carried).
  void publish_description(const Signature& signature);
  bool plan_zero_copy(const std::vector<Described>& all);
  /// Every rank's description of this call, copied out of the slots (which are then consumed).
  std::vector<Described> take_descriptions();
  /// Whether every rank's description says it runs the call in place (an alltoall, an allgather).
  bool every_rank_in_place(const std::vector<Described>& all) const;
  /// Whether this call chooses its way from every rank's description, read once every signature
  /// is compared: zero copy, and an alltoall in place (see plan).
  bool reads_descriptions() const { return describes_ && (kind_ != Collective::alltoall || send_ == recv_); }
  void run_zero_copy_phase(std::size_t phase);
  void reduce_own_slice();
  /// "shm direct <collective> on rank <r>", the start of this run's error texts.
  std::string where() const;
  void begin(std::size_t chunk);
  void reduce_slice(std::size_t chunk);
  /// dst = own, then every peer's part (peer(q) for q != rank()) in rank order, reduced (and
  /// divided for avg): the order of both allreduce paths, two copies and zero copy, so that either
  /// gives the same bits.
  template <typename Peer>
  void reduce_own_first(std::byte* dst, const std::byte* own, std::size_t n, const Peer& peer) const {
    const int r = rank();
    reduce_parts(dst, n, [&](int i) -> const std::byte* { return i == 0 ? own : peer(i <= r ? i - 1 : i); });
  }
  /// reduce_own_first, but each peer's part is first copied, piece by piece, into a scratch
  /// buffer on this core and reduced from there (staged_reduce_bytes).
  template <typename Peer>
  void reduce_staged(std::byte* dst, const std::byte* own, std::size_t n, const Peer& peer) const {
    constexpr std::size_t piece_bytes = 16 * 1024;
    const std::size_t bytes = n * esize_, piece = std::min(bytes, piece_bytes / esize_ * esize_);
    auto scratch = std::make_unique_for_overwrite<std::byte[]>(piece);
    for (std::size_t offset = 0; offset < bytes; offset += piece) {
      const std::size_t len = std::min(piece, bytes - offset);
      reduce_own_first(dst + offset, own + offset, len / esize_, [&](int q) {
        core::copy(scratch.get(), peer(q) + offset, len);
        return static_cast<const std::byte*>(scratch.get());
      });
    }
  }
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
  BlockStarts starts_;       // allgatherv, alltoallv: block q is elements [starts_[q], starts_[q + 1]) of recv
  BlockStarts send_starts_;  // alltoallv: rank q's block is elements [send_starts_[q], ...) of send
  std::size_t largest_ = 0;  // the largest block of the call in elements (allgatherv's differ)
  DataType type_;
  ReduceOp op_;
  int root_;
  std::chrono::milliseconds timeout_;
  clock::time_point deadline_{};  // timeout_ after the first wait (a call that never waits reads no clock)
  clock::time_point next_liveness_check_{};
  bool spinning_ = false;              // progressed by poll: the caller spins (see check_deadline_and_liveness)
  std::uint32_t unclocked_polls_ = 0;  // polls that did not read the clock
  bool small_ = false;                 // allreduce in one step: every rank reduces everything
  bool three_parts_ = false;           // allreduce in chunks: begin, reduce_slice, finish
  bool single_copy_ = false;           // blocks move straight between the ranks' buffers (see plan)
  bool exchange_ = false;              // alltoallv: displacements (and small inputs) through the data set (see plan)
  bool describes_ = false;             // this rank published a Described (see describe)
  bool zero_copy_ = false;             // and every rank's buffers are shared: runs zero copy
  Described described_{};
  struct Peer {  // zero copy: a peer's buffers, mapped here
    std::shared_ptr<const core::PeerRegion> send_region, recv_region;
    const std::byte* send = nullptr;
    const std::byte* recv = nullptr;
  };
  std::vector<Peer> peers_;
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
  // Alltoallv: what it publishes (see publish_alltoallv), published_bytes_ of it (left
  // uninitialised: a run is made on every call).
  std::array<std::byte, slot_data_bytes> published_;  // NOLINT(cppcoreguidelines-pro-type-member-init)
  std::size_t published_bytes_ = 0;
  // How results leave the data sets: with streaming stores when the ranks together write at least
  // streaming_bytes of results that they have not read (in place, begin() read them into the cache).
  void (*copy_out_)(std::byte*, const std::byte*, std::size_t) = copy_cached;
  std::byte* deliver_ = nullptr;  // see deliver_to
  Scratch staging_;
  Scratch snapshot_;  // see keep_input and snapshot_blocks
};

template <typename Part>
void DirectRun::reduce_parts(std::byte* dst, std::size_t n, const Part& part) const {
  shm::reduce_parts(op_, type_, size(), dst, n, part);
}

}  // namespace tutti::transport::shm
