// The shared-memory segment of one communicator: its layout, how ranks attach to it, and the
// futex doorbells ranks sleep on. Everything here is plain memory shared by processes; the fields
// that more than one process writes are atomics (lock-free, hence address-free), and the rest is
// published through them with release/acquire ordering.
//
// Layout (offsets computed by Layout, the same in every process):
//   Header        magic, geometry, comm id, secret, attached count, abort record
//   RankBlock[p]  pid, futex doorbell (generation), sleeper count, signatures published
//   SignatureSlot[p][signature_slots]   the collectives each rank announced, by seq, each with
//                                       room for a small collective's input (slot_data_bytes)
//   Ring[p][p]    ring i->j: RingHeader (data head/tail, acks j->i), then `slots` chunk slots
//   DirectRound[p]                     barrier round each rank has reached (direct algorithms)
//   direct data[direct_sets][p]        `direct_chunk` bytes per rank per set; the sets are used in
//                                      turn (Segment::direct_slot: all of them, or two where the
//                                      ranks outnumber the cores)
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "transport/shm/shm.hpp"
#include "transport/transport.hpp"

namespace tutti::transport::shm {

// Atomics in shared memory must not hide a lock in this process: they have to be lock-free.
static_assert(std::atomic<std::uint64_t>::is_always_lock_free && std::atomic<std::uint32_t>::is_always_lock_free &&
              std::atomic<std::int32_t>::is_always_lock_free);

inline constexpr std::uint64_t ready_magic = 0x38736974747574ull;  // "tuttis8", set once initialized
// Announced signatures kept per rank. A rank short of slots waits until slot_slack of them are
// free (so that it meets its peers once per slot_slack collectives, not at every one); with the
// rest, a rank whose collectives complete without its peers (a broadcast's root) can always run
// run_ahead collectives past the slowest rank's reading before it waits (see shm.cpp).
inline constexpr std::size_t run_ahead = 64;
inline constexpr std::size_t slot_slack = 32;
inline constexpr std::size_t signature_slots = run_ahead + slot_slack;
inline constexpr std::size_t ack_entries = 1024;  // acknowledgements in flight per pair
inline constexpr std::size_t chunk_header_bytes = 128;
/// A point-to-point message from this size travels by reference where the segment allows single
/// copy: one chunk carries the address of its bytes in the sender, the receiver reads them from
/// there (process_vm_readv) once it matched the message, and only then acks it, which completes
/// the send. One copy instead of two, and no ring slots. From probed_reference_bytes instead where
/// the segment's probe found single copy faster than the data sets (Segment::reference_from).
inline constexpr std::size_t reference_bytes = 4 * 1024 * 1024;
inline constexpr std::size_t probed_reference_bytes = 8 * 1024;
/// A point-to-point message of up to this many bytes is eager: one chunk, complete for its sender
/// once it is in the ring, and never acknowledged (a receiver that expected another size fails its
/// receive, which aborts the communicator). Within every layout's chunk payload (at least 4 KiB).
inline constexpr std::size_t eager_bytes = 4096;
inline constexpr std::size_t abort_text_bytes = 1024;
inline constexpr std::size_t secret_bytes = 32;
/// Bytes of input a signature slot carries for a small direct collective (4 KiB, and 16 more that
/// share the signature's cache line): such a collective is one publication and one read per peer,
/// no barrier. From 1 to 4 KiB that measured 1.2-2x faster than the data sets' copy in, barrier,
/// copy out (docs/performance.md, 2026-12-03, later).
inline constexpr std::size_t inline_bytes = 4112;
/// A signature slot's room for input: inline_bytes, and 256 more, so that an alltoallv of up to
/// inline_bytes of input carries its displacements beside it (its header, alltoallv_header_words:
/// 56 bytes at p = 2, 248 at p = 14, the most ranks for which it fits beside all 4112) and still
/// runs inline. At p = 2 a 4 KiB alltoallv through
/// the data sets took about 1.6 us against 0.7 us inline for 2 KiB (docs/performance.md).
inline constexpr std::size_t slot_data_bytes = inline_bytes + 256;

/// First error of the communicator; the first writer wins (state 0 -> 1 by CAS, then 2 once written).
struct AbortRecord {
  std::atomic<std::uint32_t> state;
  std::int32_t code;
  std::int32_t rank;  // who wrote it
  std::uint64_t seq;
  std::uint32_t length;
  char text[abort_text_bytes];
};

struct Header {
  std::atomic<std::uint64_t> magic;
  std::uint64_t total_bytes;
  std::uint64_t comm_id;
  std::int32_t size;
  std::uint32_t slots;
  std::uint32_t payload;
  std::uint8_t secret[secret_bytes];  // random, from the creator: names of split communicators derive from it
  alignas(64) std::atomic<std::uint32_t> attached;
  alignas(64) AbortRecord abort;
};

struct alignas(64) RankBlock {
  std::atomic<std::int32_t> pid;
  // Single-copy transfers (Segment::single_copy): the address of a word of this rank's memory
  // that peers try to read, written before attaching; then what this rank found when it tried
  // its peers' (0: not yet, 1: could read every peer, 2: could not, or TUTTI_SHM_SINGLE_COPY=0).
  std::atomic<std::uint64_t> probe_address;
  std::atomic<std::uint32_t> reads_peers;
  // The copy probe (Segment::decide_collective_copy), between ranks 0 and 1 as they attach: the
  // step each has reached, rank 0's probe buffer and the cpu it ran its last step on, and rank
  // 1's verdict (0: not yet, 1: collectives single copy, 2: through the data sets, 3: probing,
  // rank 0 to join, 4: single copy as forced).
  std::atomic<std::uint32_t> probe_step;
  std::atomic<std::uint32_t> collective_copy;
  std::atomic<std::int32_t> probe_cpu;
  std::atomic<std::uint64_t> probe_buffer;
  alignas(64) std::atomic<std::uint32_t> generation;  // the futex word
  std::atomic<std::uint32_t> sleepers;                // ranks' threads in FUTEX_WAIT on it
  // One past the highest seq whose signature this rank published and compared, and one past the
  // highest below which it reads no peer's inline input any more (see shm.cpp). Written by this
  // rank at every collective; read by the others rarely.
  alignas(64) std::atomic<std::uint64_t> published;
  std::atomic<std::uint64_t> consumed;
  // Nonzero: ring this rank's doorbell on publishing or consuming. Written rarely, read by every
  // publication, so on a line of its own.
  alignas(64) std::atomic<std::uint32_t> awaits_publication;
  // Nonzero: this rank waits for a free signature slot, which it gets once every rank's `consumed`
  // reaches this value: a rank whose `consumed` reaches it rings this rank's doorbell (and no
  // other consumption does). Written once per wait, so on the same quiet line.
  std::atomic<std::uint64_t> wake_at_consumed;
};

/// One announced signature, written under a seqlock: tag = seq + 1 when valid, busy while written.
/// `data` holds the input of a small direct collective (written before the tag, see shm.cpp).
///
/// `arrivals` is used in rank 0's slots only, outside the seqlock: which ranks have published
/// collective seq (ShmTransport::arrive). Each rank publishing seq adds itself with one atomic
/// read-modify-write and compares its signature with the slots of the ranks that were there
/// before it, so that every pair of ranks is compared once, by the later of the two, and the
/// earlier never reads a slot its peer is about to write. It sits on the line of rank 0's tag,
/// which a rank reading rank 0's input reads anyway.
struct alignas(64) SignatureSlot {
  static constexpr std::uint64_t busy = ~std::uint64_t{0};
  std::atomic<std::uint64_t> tag;
  std::atomic<std::uint64_t> words[4];  // the signature but its seq (which the tag says)
  std::atomic<std::uint64_t> arrivals;  // (seq + 1) mod 2^32 above, below: a mask of ranks, or a count
  std::byte data[slot_data_bytes];
};
static_assert(sizeof(WireSignature) == 5 * sizeof(std::uint64_t) && offsetof(WireSignature, seq) == 0);
// The first line holds 16 bytes of input: two ranks' blocks of 8 bytes (a scatter's at p = 2).
static_assert(offsetof(SignatureSlot, data) == 48);
static_assert(sizeof(SignatureSlot) % 64 == 0);

/// Asks for the lines of `slot` that a publication of `bytes` of input writes, in the exclusive
/// state (PREFETCHW on x86; a hint, never a fault): the peers that read them last give them up
/// while this rank still computes, rather than when it writes and then fences.
inline void prefetch_for_write(const SignatureSlot& slot, std::size_t bytes) {
  const auto* first = reinterpret_cast<const char*>(&slot);
  const auto* end = reinterpret_cast<const char*>(slot.data) + bytes;
  for (const char* line = first; line < end; line += 64) {
#if defined(__x86_64__) || defined(__i386__)
    asm volatile("prefetchw %0" : : "m"(*line));
#else
    __builtin_prefetch(line, 1, 3);
#endif
  }
}

/// Reads the signature `slot` holds for collective `seq` (seqlock: false while it holds another
/// seq or is being written; see write_slot in shm.cpp).
inline bool read_slot(const SignatureSlot& slot, std::uint64_t seq, WireSignature& out) {
  const std::uint64_t tag = slot.tag.load(std::memory_order_acquire);
  if (tag != seq + 1) return false;
  std::uint64_t words[5] = {seq};
  for (int i = 0; i < 4; ++i) words[i + 1] = slot.words[i].load(std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_acquire);
  if (slot.tag.load(std::memory_order_relaxed) != tag) return false;
  std::memcpy(&out, words, sizeof words);
  return true;
}

/// Precedes the payload of each chunk slot. Written by the producer before it publishes `head`.
struct ChunkHeader {
  std::uint64_t seq;
  std::uint64_t total;   // bytes of the whole message
  std::uint64_t offset;  // of this chunk in the message
  std::uint32_t index;
  std::uint32_t bytes;  // of this chunk
  std::uint8_t channel;
  std::uint8_t has_signature;
  std::uint8_t by_reference;  // the payload is the address of the whole message in the sender (see reference_bytes)
  std::uint8_t eager;         // the whole message, not acknowledged (see eager_bytes)
  // Slot n's chunk is complete once this reads stamp_for(n) (stored last, with release, before the
  // head): a consumer that polls the slot's first line learns of a chunk and reads it with one
  // transfer of that line instead of two (the head's, then the chunk's). The head stays the
  // producer's word of record: a slot without its stamp is read when the head says so.
  std::uint32_t stamp;
  WireSignature signature;  // the sender's collective (has_signature)
};
static_assert(sizeof(ChunkHeader) <= chunk_header_bytes);
static_assert(offsetof(ChunkHeader, stamp) % alignof(std::uint32_t) == 0 && offsetof(ChunkHeader, stamp) < 64);
inline constexpr std::uint32_t stamp_for(std::uint64_t n) { return static_cast<std::uint32_t>(n + 1); }
inline std::atomic_ref<std::uint32_t> stamp_of(ChunkHeader& chunk) {
  return std::atomic_ref<std::uint32_t>(chunk.stamp);
}
/// An eager message of up to this many bytes without a signature (a point-to-point one) travels in
/// its chunk header's first cache line, after the fields, where a collective's signature would be:
/// one line carries the whole message.
inline constexpr std::size_t header_payload_bytes = 24;
inline constexpr std::size_t header_fields_bytes = offsetof(ChunkHeader, signature);
static_assert(header_fields_bytes + header_payload_bytes <= 64);

/// Receiver's answer to a message's first chunk: matched (ok) or the size it expected.
struct Ack {
  std::uint64_t seq;
  std::uint64_t expected;
  std::uint32_t index;
  std::uint8_t channel;
  std::uint8_t ok;
};

/// Ring i->j: the data ring (producer i, consumer j) and the ack ring (producer j, consumer i).
struct RingHeader {
  alignas(64) std::atomic<std::uint64_t> head;
  alignas(64) std::atomic<std::uint64_t> tail;
  // Nonzero: the producer found the ring full and waits for room; the consumer, having freed
  // slots, clears it and rings the producer's doorbell (waiters do not poll their own rings' tails:
  // doorbell_token). On the tail's line, which the consumer writes anyway.
  std::atomic<std::uint32_t> wants_room;
  alignas(64) std::atomic<std::uint64_t> ack_head;
  alignas(64) std::atomic<std::uint64_t> ack_tail;
  alignas(64) Ack acks[ack_entries];
};

/// Barrier rounds a rank has entered in direct algorithms (written by that rank only).
struct alignas(64) DirectRound {
  std::atomic<std::uint64_t> round;
  // A single-copy collective's input, in this rank's address space: written before the round
  // that publishes it, read by the peers after it (DirectRun, single_copy_).
  std::atomic<std::uint64_t> address;
};

/// Where everything lies in a segment for `size` ranks.
struct Layout {
  int size = 0;
  std::uint32_t slots = 0;    // chunk slots per ring
  std::uint32_t payload = 0;  // bytes of data per chunk (a multiple of 64)
  std::size_t rank_blocks = 0, signatures = 0, rings = 0, ring_stride = 0, slot_stride = 0, total = 0;
  std::size_t direct_rounds = 0, direct_data = 0;
  std::size_t direct_chunk = 0;  // bytes per rank per data slot (a multiple of 4096)
  std::size_t direct_sets = 0;   // data sets the area holds (Segment::direct_sets uses them)
  /// The geometry for `size` ranks: 8 x 64 KiB per ring, smaller when p^2 rings would pass ~96 MB;
  /// a direct data area of 4 sets of p x 256 KiB, the chunk smaller where two sets would pass
  /// 16 MiB (tmpfs pages are taken only where written: two sets where ranks outnumber cores).
  static Layout for_size(int size);
};

/// One rank's mapping of a segment. Not copyable; unmaps on destruction.
class Segment {
 public:
  /// Creates (rank 0) or opens (others) the segment "/<name>", registers this rank's pid and
  /// waits until all `size` ranks have attached; the last one to attach unlinks the name.
  /// Rank 0 creates it exclusively (O_EXCL), mode 0600; every rank checks, after opening, that
  /// it belongs to this user and grants nothing beyond 0600.
  /// Throws Error(timeout) if not all attached before `deadline` (the name is unlinked then),
  /// Error(system) if a system call fails or the segment (or a name taken before rank 0 could
  /// create it) belongs to another user or has a wider mode, naming its owner and mode;
  /// Error(invalid_argument) for a bad rank or size.
  static std::unique_ptr<Segment> attach(const std::string& name, int rank, int size, std::uint64_t comm_id,
                                         std::chrono::steady_clock::time_point deadline);
  ~Segment();
  Segment(const Segment&) = delete;
  Segment& operator=(const Segment&) = delete;

  const std::string& name() const { return name_; }
  const Layout& layout() const { return layout_; }
  Header& header() const { return *reinterpret_cast<Header*>(base_); }
  RankBlock& rank_block(int rank) const { return reinterpret_cast<RankBlock*>(base_ + layout_.rank_blocks)[rank]; }
  SignatureSlot& signature_slot(int rank, std::uint64_t seq) const {
    auto* slots = reinterpret_cast<SignatureSlot*>(base_ + layout_.signatures);
    return slots[static_cast<std::size_t>(rank) * signature_slots + seq % signature_slots];
  }
  RingHeader& ring(int from, int to) const { return *reinterpret_cast<RingHeader*>(ring_base(from, to)); }
  /// Slot `n` (a running count, taken modulo the ring's slots) of ring from->to.
  ChunkHeader& chunk(int from, int to, std::uint64_t n) const {
    return *reinterpret_cast<ChunkHeader*>(slot_base(from, to, n));
  }
  std::byte* payload(int from, int to, std::uint64_t n) const { return slot_base(from, to, n) + chunk_header_bytes; }
  /// Where the payload of slot n's chunk lies, by its header's `eager`, `has_signature` and `bytes`:
  /// in the header (header_payload_bytes), or after it.
  std::byte* payload(int from, int to, std::uint64_t n, bool eager, bool has_signature, std::size_t bytes) const {
    return eager && !has_signature && bytes <= header_payload_bytes ? slot_base(from, to, n) + header_fields_bytes
                                                                    : payload(from, to, n);
  }
  DirectRound& direct_round(int rank) const {
    return reinterpret_cast<DirectRound*>(base_ + layout_.direct_rounds)[rank];
  }
  /// Whether every rank can read every other rank's memory (process_vm_readv, which needs the
  /// permission to ptrace it: the same user, and no Yama or seccomp rule against it), as every
  /// rank found when it attached and before attach returned; the same answer on every rank.
  bool single_copy() const { return single_copy_; }
  /// Whether the collectives that move whole blocks read the peers' buffers (single copy) rather
  /// than copy through the data sets: where single copy is allowed, ranks 0 and 1 time both ways
  /// of moving 128 KiB between them as they attach (decide_collective_copy);
  /// TUTTI_SHM_COLLECTIVE_COPY=single or sets (on rank 1) decides instead. The same answer on
  /// every rank. Which collectives follow it depends on crowded() (DirectRun::plan).
  bool single_copy_collectives() const { return single_copy_collectives_; }
  /// Whether the probe chose single copy and the ranks outnumber the cores
  /// (ranks_outnumber_cores): then single copy serves only some of the collectives that move
  /// whole blocks (DirectRun::plan, docs/algorithms.md); with a core per rank, or where
  /// TUTTI_SHM_COLLECTIVE_COPY=single forces it, every one. The same answer on every rank.
  bool crowded() const { return crowded_; }
  /// The size from which a point-to-point message travels by reference (where single_copy()):
  /// probed_reference_bytes where the probe chose single copy, else reference_bytes.
  std::size_t reference_from() const { return single_copy_collectives_ ? probed_reference_bytes : reference_bytes; }
  /// How many data sets the direct collectives use in turn, the same on every rank: all the
  /// layout's (4) where each rank has a core, 2 where the ranks outnumber the cores. A set is
  /// written again only `direct_sets()` chunks after it was read, so that a rank writing its part
  /// finds the lines its peers read out of their caches by then: with two sets at p = 2 the
  /// writer's stores waited on those lines (a 1 MiB reduce took about 80 us, 35 with four; docs/
  /// performance.md, 2026-12-05). Where ranks share cores the lines they read are in the same
  /// caches, and the larger footprint measured slower.
  std::size_t direct_sets() const { return direct_sets_; }
  /// Rank `rank`'s part of data set `use` (taken modulo direct_sets()); the parts of one set are
  /// contiguous.
  std::byte* direct_slot(std::uint64_t use, int rank) const {
    const std::size_t index =
        (use % direct_sets_) * static_cast<std::size_t>(layout_.size) + static_cast<std::size_t>(rank);
    return base_ + layout_.direct_data + index * layout_.direct_chunk;
  }

 private:
  Segment(std::string name, Layout layout, std::byte* base) : name_(std::move(name)), layout_(layout), base_(base) {}
  void decide_single_copy(int rank, std::chrono::steady_clock::time_point deadline);
  void decide_collective_copy(int rank, std::chrono::steady_clock::time_point deadline);
  std::byte* ring_base(int from, int to) const {
    return base_ + layout_.rings + (static_cast<std::size_t>(from) * layout_.size + to) * layout_.ring_stride;
  }
  std::byte* slot_base(int from, int to, std::uint64_t n) const {
    return ring_base(from, to) + sizeof(RingHeader) + (n % layout_.slots) * layout_.slot_stride;
  }
  std::string name_;
  Layout layout_;
  std::byte* base_;
  bool single_copy_ = false;
  bool single_copy_collectives_ = false;
  bool crowded_ = false;
  std::size_t direct_sets_ = 2;
};

/// Reads `bytes` at `remote` in process `pid` into `local` (process_vm_readv, looping over
/// partial reads). Returns 0, or the errno of the failure.
int read_process_memory(std::int32_t pid, std::byte* local, std::uint64_t remote, std::size_t bytes);
/// Writes `bytes` from `local` at `remote` in process `pid` (process_vm_writev, which the same
/// permission allows). Returns 0, or the errno of the failure.
int write_process_memory(std::int32_t pid, std::uint64_t remote, const std::byte* local, std::size_t bytes);

// Reading what peers wrote. A peer, buggy or hostile, may write anything into the segment at any
// time. Every record that we then use as a length, an offset or an index is read through one of
// these: it is copied out of shared memory once, checked, and only the copy is used. A bad field
// throws Error(peer_failure) naming the segment, the rank that wrote it and the field.

/// The header of chunk slot `n` of ring from->to (written by `from`): its bytes must be what the
/// sender's chunking gives for its offset and total, its channel and flags valid.
ChunkHeader read_chunk(const Segment& segment, int from, int to, std::uint64_t n);
/// Entry `n` of the ack ring of ring from->to (written by `to`).
Ack read_ack(const Segment& segment, int from, int to, std::uint64_t n);
/// head - tail of the `kind` ("data" or "ack") ring from rank `from` to rank `to`, which holds
/// `capacity` entries; one of the indices was written by rank `writer`. At most `capacity`.
std::uint64_t ring_fill(const Segment& segment, std::uint64_t head, std::uint64_t tail, std::uint64_t capacity,
                        int writer, std::string_view kind, int from, int to);
/// The communicator's first error, once recorded; a corrupt record gives Error(peer_failure) naming it.
std::optional<Failure> read_abort(const Segment& segment);
/// Error(peer_failure): rank `writer` wrote `what` into the segment.
Error corrupt_segment(const Segment& segment, int writer, const std::string& what);

/// The name of the segment of split communicator `id` of `parent`: the parent's name (which
/// starts with "tutti-<job id>-") and a keyed hash of `id` under the parent's secret, which only
/// the parent's ranks can read, so that no other user can predict it and take it first.
std::string split_segment_name(const Segment& parent, std::uint64_t id);

/// Bumps `rank`'s generation and wakes its sleepers (a FUTEX_WAKE only when some sleep).
void ring_doorbell(RankBlock& block);

/// A rank's own side of its doorbell, in its process's memory: what one of its threads finds for
/// another (a completion, more to drain, a wake-up) bumps `generation` here, a line no peer
/// writes, and rings the shared doorbell only while one of its threads sleeps on it.
struct LocalBell {
  alignas(64) std::atomic<std::uint32_t> generation{0};
  std::atomic<std::uint32_t> sleepers{0};
};
void ring_local(LocalBell& bell, RankBlock& block);

/// Rings `to`'s doorbell for what this rank wrote into or freed in the rings between them, but
/// only while one of its threads sleeps: a waiter that spins polls the rings (doorbell_token).
/// The caller has stored the rings' counters before (a seq_cst fence orders them before the
/// sleeper count read here; sleep_on_doorbell orders its count before its reads of the rings).
void ring_if_sleeping(Segment& segment, int to);

/// What a waiter of rank `rank` compares while it waits: its local bell's generation (high half)
/// and, in the low half, its doorbell's, plus with `rings` every counter its peers move for it in
/// the rings (data heads toward it, ack heads of its rings toward them, ack tails of theirs):
/// these only grow, so their sum changes whenever one of them does. Not the tails of its own
/// rings, which move at every message its peers take: a producer short of room asks to be rung
/// instead (RingHeader::wants_room).
std::uint64_t doorbell_token(const Segment& segment, int rank, const LocalBell& bell, bool rings);
/// Sleeps while doorbell_token equals `seen`, at most `timeout` (FUTEX_WAIT on the shared
/// doorbell, process-shared).
void sleep_on_doorbell(Segment& segment, int rank, LocalBell& bell, std::uint64_t seen, bool rings,
                       std::chrono::nanoseconds timeout);

}  // namespace tutti::transport::shm
