// The shared-memory transport of one rank. Messages travel through the segment's per-pair rings
// in chunks (see segment.hpp); both copies (into the ring, out of it) are made by `progress`,
// under the owning queue's lock, by the sender and by the receiver respectively.
//
// Protocol of one message i->j:
//   - i copies chunk after chunk into ring i->j as slots free up, messages to j in posting order;
//     each chunk names its message (channel, seq, index), the total size and the sender's
//     collective signature.
//   - a chunk is published by its slot's stamp (written last, release), then the head. j takes
//     every chunk whose stamp is there without reading the head (one line crosses per small
//     message, not the head's and then the chunk's); where no stamp is there the head decides,
//     checked as i's word where it is ahead of j's tail.
//   - j drains ring i->j whenever it progresses: a chunk of a posted receive goes straight into
//     the user's buffer (or is reduced from the slot); otherwise into heap memory (unexpected),
//     which a later receive consumes, so one unmatched message never blocks those behind it.
//   - when j matches the message (first chunk, or post of its receive) it answers with an Ack
//     in ring i->j's ack ring: ok, or the size it expected. The send completes once all chunks
//     are in the ring and the ack said ok; a size disagreement fails both sides.
//   - a point-to-point message of reference_bytes or more, where the segment allows single copy,
//     is one chunk that carries the address of its bytes in i; j reads them from there when it
//     matches the message, before the ack (segment.hpp).
//   - waking: a waiting rank first spins on the counters its peers move in the rings (data
//     heads toward it and the stamps of the slots it reads next, tails and ack heads of its own
//     rings, doorbell_token), then sleeps on its futex doorbell. A round that wrote into or
//     freed a peer's rings rings that peer's doorbell only if one of its threads sleeps (a
//     seq_cst fence between the counters and the sleeper count on our side, the count before
//     the counters on the sleeper's), so a spinning peer pays no contended write per message.
//     Where ranks outnumber cores (polls_rings false) the waiter watches its doorbell alone and
//     every such round rings it. Our own completions bump a local bell (segment.hpp).
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <unordered_map>
#include <vector>

#include "transport/matching.hpp"
#include "transport/shm/segment.hpp"
#include "transport/transport.hpp"

namespace tutti::transport::shm {

/// Peers are checked for death at most this often (kill(pid, 0) per peer): by the transport's
/// waits and by a direct collective that waits.
inline constexpr auto liveness_period = std::chrono::milliseconds(100);

class ShmTransport final : public Transport {
 public:
  /// Takes over an attached segment; `attach_timeout` bounds the attach of split communicators.
  ShmTransport(std::unique_ptr<Segment> segment, int rank, std::chrono::milliseconds attach_timeout);
  ~ShmTransport() override;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::uint64_t id() const override { return comm_id_; }
  std::string_view name() const override { return "shm"; }
  Kind kind() const override { return Kind::shm; }
  std::unique_ptr<Transport> split(std::uint64_t id, const std::vector<int>& ranks, int new_rank) override;
  bool detects_every_mismatch() const override { return true; }  // signature slots in the segment
  void announce(const Signature& signature) override;
  void post_send(int peer, const MessageKey& key, const void* data, std::size_t bytes, Completion* done) override;
  void post_recv(int peer, const MessageKey& key, void* data, std::size_t bytes, Completion* done) override;
  bool post_recv_reduce(int peer, const MessageKey& key, void* dst, const void* operand, std::size_t count,
                        DataType type, ReduceOp op, Completion* done) override;
  void cancel(Completion* done) override;
  bool withdraw_recv(Completion* done) override;
  std::uint64_t generation() const override;
  void wait(std::uint64_t seen, std::chrono::steady_clock::time_point deadline) override;
  void wait_in_background(std::uint64_t seen, std::chrono::steady_clock::time_point deadline) override;
  void wake() override;
  void relax() override;
  void progress() override;
  std::optional<Failure> aborted() const override;
  void abort(const Error& error, std::uint64_t seq) override;
  /// Algorithm::direct (direct.cpp).
  bool serves_natively(Algorithm algorithm, Collective collective) const override;
  std::unique_ptr<NativeCollective> start_native(Algorithm algorithm, const NativeCall& call,
                                                 std::chrono::milliseconds timeout) override;
  /// A small direct collective (its input fits a signature slot) with nothing else outstanding:
  /// published, read and combined here under one lock, or handed to a DirectRun when a peer is
  /// late (direct_inline.cpp).
  bool run_now(Algorithm algorithm, const NativeCall& call, const Signature& signature,
               std::chrono::milliseconds timeout) override;

  // For the direct algorithms (direct.cpp), which work on the segment itself.
  Segment& segment() const { return *segment_; }
  /// Whether `peer`'s process has terminated (always false for a peer that is this process).
  bool peer_has_died(int peer) const;
  /// Names the ranks in error texts as `names[r]` instead of r: the ranks of a larger
  /// communicator whose messages to this host's ranks travel here (routed). Before the first post.
  void set_rank_names(std::vector<int> names) { names_ = std::move(names); }
  /// Makes waits and relax() give the core up between polls rather than pause on it, for a rank
  /// whose completions also come from a thread of its own process (routed: the TCP I/O thread),
  /// which spinning would keep from running where cores are few.
  void yield_while_waiting() { wait_policy_.yield = true; }
  /// Whether waits give the core up between polls (yield_while_waiting, or ranks_outnumber_cores).
  bool yields_while_waiting() const { return wait_policy_.yield; }
  /// Has wait() call `hook(true)` between its polls and `hook(false)` before it sleeps (routed:
  /// the TCP half polled by the waiting thread too); null: none.
  void poll_while_waiting(std::function<void(bool)> hook) { wait_hook_ = std::move(hook); }
  /// Reserves the data-set uses (taken modulo 2) of the next `n` chunks of direct algorithms and
  /// returns the first; every rank counts alike.
  std::uint64_t reserve_direct_uses(std::uint64_t n) {
    const std::uint64_t first = direct_uses_;
    direct_uses_ += n;
    return first;
  }
  /// The data-set uses reserved so far (none by a call that moves its blocks by single copy).
  std::uint64_t direct_uses() const { return direct_uses_; }
  /// Whether every rank has published its signature of collective `seq` (and so every pair of
  /// ranks compared theirs, a mismatch having aborted the communicator first). Publishes this
  /// rank's deferred signatures first. Thread-safe. While false, a peer's publication rings
  /// this rank's doorbell.
  bool signature_checked(std::uint64_t seq);
  /// The ranks that have not yet published their signature of collective `seq`.
  std::vector<int> unpublished_ranks(std::uint64_t seq) const;
  /// The ranks whose reading keeps this rank from publishing collective `seq` (see
  /// publish_ready_locked in shm.cpp).
  std::vector<int> holding_slot(std::uint64_t seq) const;
  /// The input (`bytes` <= inline_bytes) that collective `seq`, a small direct collective, carries
  /// in its signature slot: copied there when its signature is published, and read from there by
  /// every rank (see shm.cpp). Call on the thread that announces `seq`, just before; `input` stays
  /// valid and unchanged until then. consumed_inline(seq) must follow, whatever happens to the
  /// collective. `wire` is seq's signature, which announce then need not encode again.
  void carry_inline(std::uint64_t seq, const std::byte* input, std::size_t bytes, const WireSignature& wire);
  /// `rank`'s inline input of collective `seq` (this rank's too), or null while not published.
  /// Throws (and aborts) with the mismatch if that rank's signature differs from `mine`. With
  /// `arrange_wake`, a null answer also makes that rank's publication ring this rank's doorbell
  /// (until consumed_inline); without it the caller must poll.
  const std::byte* inline_input(int rank, std::uint64_t seq, const WireSignature& mine, bool arrange_wake);
  /// This rank reads no more inline input of collective `seq` (done, or failed).
  void consumed_inline(std::uint64_t seq);

  /// A message as the receiver files it: sender (or destination, for sends) and key.
  using Key = MatchKey;

  /// How long wait() polls before it sleeps on the futex, and whether it yields the core between polls.
  struct WaitPolicy {
    std::chrono::steady_clock::duration budget;
    bool yield;
  };

 private:
  struct SendOp {
    MessageKey key;
    const std::byte* data = nullptr;
    std::size_t bytes = 0;
    std::size_t offset = 0;  // bytes already in the ring
    Completion* done = nullptr;
    bool has_signature = false;
    WireSignature signature;
    bool written = false;  // every chunk is in the ring
    bool acked = false;    // the receiver matched it, sizes agree
  };
  struct RecvOp {
    std::byte* dst = nullptr;
    const std::byte* operand = nullptr;  // recv_reduce: dst = operand op incoming
    std::size_t bytes = 0;
    std::size_t received = 0;
    bool reduce = false;
    DataType type = DataType::u8;
    ReduceOp op = ReduceOp::sum;
    Completion* done = nullptr;
    bool unchecked = false;  // a collective's message whose signature could not be compared
  };
  struct Unexpected {
    std::unique_ptr<std::byte[]> data;  // null: the message fits `small`
    std::size_t capacity = 0;           // grows with what arrives, up to total (a peer's total is not trusted)
    std::array<std::byte, 64> small;    // a small message, without an allocation
    std::byte* bytes() { return data ? data.get() : small.data(); }
    const std::byte* bytes() const { return data ? data.get() : small.data(); }
    std::size_t total = 0;
    std::size_t received = 0;
    bool has_signature = false;
    WireSignature signature;
    std::uint64_t reference = 0;  // by reference: the address of its `total` bytes in the sender
    bool by_reference = false;
    bool eager = false;  // not to be acknowledged
  };

  void post_recv_op(int peer, const MessageKey& key, RecvOp op);
  bool accept(const Key& key, RecvOp& op, std::size_t total, bool has_signature, const WireSignature& theirs,
              bool eager);
  void deliver(RecvOp& op, std::size_t offset, const std::byte* data, std::size_t bytes);
  /// Reads a message sent by reference (the whole of op.bytes) from `src`'s memory at `address`
  /// into the receive. False: the communicator was aborted meanwhile, so the sender may have let
  /// the bytes go while they were read; the receive stays posted and fails with the abort.
  bool read_reference(int src, RecvOp& op, std::uint64_t address);
  void finish(Completion* done, Completion::State state, std::string error = {});
  void complete_recv(const Key& key, RecvOp& op);
  void release_held();
  void end_round();
  void end_round_wakes();  // end_round's doorbells (wake_peer_)
  /// Rings r's doorbell at the end of this round (where one of its threads sleeps).
  void wake_peer(int r) {
    wake_peer_[static_cast<std::size_t>(r)] = 1;
    wakes_ = true;
  }
  void handle_chunk(int src, const ChunkHeader& header, const std::byte* payload);
  void drain(int src);
  void drain_acks(int dst);
  void handle_ack(int dst, const Ack& ack);
  void flush_acks(int src);
  void push_sends(int dst);
  /// Writes the next chunk of `op` (n bytes of it, or its address) into slot `head` of our ring
  /// toward `dst`, and advances `op.offset`; the caller publishes the head.
  void write_chunk(int dst, std::uint64_t head, SendOp& op, bool by_reference, bool eager);
  /// Sends a small point-to-point message eagerly when nothing waits before it and its ring has
  /// room: written now, complete now, never acknowledged. False: it takes the ordinary way.
  bool send_eager(int dst, SendOp& op);
  /// Free slots in this rank's ring to dst for a head of `head`, by the tail last read while that
  /// showed room (no miss); else read again, and where still none, dst is asked to ring this rank
  /// once it frees one (RingHeader::wants_room).
  std::uint64_t free_slots(int dst, std::uint64_t head);
  bool room_asked(int r);
  void check_peers();
  bool waits_on(int peer) const;
  void corrupted(const Error& error);
  // Signature publication (shm.cpp); all under publication_mutex_.
  /// Publishes the deferred signatures whose slots are free; with `arrange_wake`, a rank that
  /// must wait raises its flag, so that the publications it waits for ring it.
  void publish_ready_locked(bool arrange_wake = true);
  /// Whether seq's signature slot is free (every rank consumed what it held): known from an
  /// earlier look; or by looking at every rank's `consumed` now (see publish_ready_locked).
  bool slot_known_free_locked(std::uint64_t seq) const;
  bool slot_free_locked(std::uint64_t seq);
  /// Publishes seq's signature (with `bytes` of inline input) and compares it with the peers'.
  void publish_locked(std::uint64_t seq, const WireSignature& mine, const std::byte* input, std::size_t bytes);
  /// Counts this rank in among those that published collective `seq` (SignatureSlot::arrivals)
  /// and returns which ranks did before it: bit r for rank r (all bits set where ranks are over 32
  /// and any was there first).
  std::uint64_t arrive(std::uint64_t seq);
  std::uint64_t lowest_published() const;
  std::uint64_t lowest_consumed() const;
  void await_publication_locked(bool awaiting);
  /// Sets self_.wake_at_consumed (0: not waiting for a slot).
  void wake_when_consumed_locked(std::uint64_t consumed);
  void update_await_flag_locked();
  /// Stores this rank's `consumed` (see shm.cpp) and rings the ranks whose threshold it reaches.
  void store_consumed_locked();
  void ring_awaiting_ranks();
  bool peer_dead(int peer, std::int32_t pid) const;
  /// Whether waiters poll the rings' counters, so that peers ring only sleepers (doorbell_token):
  /// where every rank has a core of its own. Where ranks outnumber cores, a waiter yields between
  /// polls and every round rings: polling p rings between yields cost more than the rings saved.
  bool polls_rings() const { return !wait_policy_.yield; }
  /// Rank r as error texts name it (set_rank_names).
  int named(int r) const { return names_.empty() ? r : names_[static_cast<std::size_t>(r)]; }

  std::unique_ptr<Segment> segment_;
  int rank_;
  int size_;
  std::uint64_t comm_id_;
  std::chrono::milliseconds attach_timeout_;
  RankBlock& self_;
  LocalBell bell_;  // this rank's own completions wake its other threads here (segment.hpp)

  // The recent collectives of this rank, by seq modulo the size (a fixed ring: no allocation).
  struct Announced {
    std::uint64_t seq = no_seq;
    WireSignature signature;
  };
  std::array<Announced, 1024> announced_{};
  /// This rank's signature of collective `seq`, if still remembered.
  const WireSignature* announced(std::uint64_t seq) const {
    const Announced& a = announced_[seq % announced_.size()];
    return a.seq == seq ? &a.signature : nullptr;
  }
  MatchTable<std::unique_ptr<SendOp>> sends_;  // peer = destination
  std::vector<std::deque<SendOp*>> outbox_;    // per destination, posting order
  MatchTable<RecvOp> recvs_;                   // peer = source
  MatchTable<Unexpected> unexpected_;
  std::vector<std::deque<Ack>> pending_acks_;                // per source, when its ack ring is full
  std::vector<std::pair<std::uint64_t, Completion*>> held_;  // unchecked receives, by seq (see announce)
  std::vector<std::uint64_t> tail_seen_;  // per destination: its ring's tail as last read (free_slots)
  std::vector<std::uint8_t> wake_peer_;   // doorbells to ring at the end of this progress
  bool wakes_ = false;                    // one of wake_peer_ is set
  bool acks_waiting_ = false;             // one of pending_acks_ holds an ack
  bool completed_ = false;                // a completion changed: ring our own doorbell
  std::chrono::steady_clock::time_point next_liveness_check_{};
  std::uint32_t liveness_rounds_ = 0;  // progress rounds: the clock is read every 16th (check_peers)
  std::atomic<bool> slept_{false};     // a wait slept since: the next round reads the clock
  std::vector<int> pidfds_;            // per peer process, -1 where unavailable (or a thread of ours)
  std::uint64_t direct_uses_ = 0;
  WaitPolicy wait_policy_;               // how wait() passes the time before it sleeps
  std::function<void(bool)> wait_hook_;  // poll_while_waiting
  bool corrupt_ = false;                 // a peer wrote garbage into the rings: they are no longer read
  std::vector<int> names_;               // set_rank_names; empty: ranks are named by their own numbers

  // Signatures announced but not yet published (their table slot still holds one that some rank
  // has not compared yet), in seq order; and what is known published by every rank.
  mutable std::mutex publication_mutex_;
  std::deque<std::pair<std::uint64_t, WireSignature>> unpublished_;
  std::uint64_t verified_below_ = 0;   // every rank has published every seq below this
  std::uint64_t consumed_below_ = 0;   // every rank has consumed every seq below this
  std::uint64_t published_ = 0;        // this rank's `published`
  bool awaiting_publication_ = false;  // signature_checked waits for the peers' publications
  bool awaiting_inline_ = false;       // an inline collective waits for a peer's publication
  bool await_flag_ = false;            // self_.awaits_publication
  std::uint64_t wake_at_ = 0;          // self_.wake_at_consumed
  unsigned short_polls_ = 0;           // polls that found no free slot (see publish_ready_locked)
  // Inline inputs to publish, and the collectives still reading their peers' (carry_inline), by seq.
  struct Carried {
    std::uint64_t seq;
    const std::byte* input;
    std::size_t bytes;
  };
  std::deque<Carried> carried_;
  std::deque<std::uint64_t> reading_;
  // What carry_inline handed over for the next announce, which files it under its own lock (both
  // run on the issuing thread, one right after the other: no lock of their own).
  struct PendingCarry {
    Carried carried;
    WireSignature wire;
  };
  std::optional<PendingCarry> pending_carry_;
};

}  // namespace tutti::transport::shm
