// The shared-memory transport's signature table: every collective's signature published and
// compared (a mismatch caught however many collectives are outstanding), a small collective's
// input carried in its slot, and the slots' reuse. The rest of the transport is in shm.cpp.
#include <algorithm>
#include <cassert>
#include <cstring>

#include "transport/shm/shm_transport.hpp"

namespace tutti::transport::shm {

namespace {

// Seqlock write: readers that overlap it see the busy tag (or a changed one) and ignore the slot.
// The inline input goes in before the tag that publishes it.
void write_slot(SignatureSlot& slot, std::uint64_t seq, const WireSignature& signature, const std::byte* input,
                std::size_t bytes) {
  std::uint64_t words[5];
  std::memcpy(words, &signature, sizeof words);
  slot.tag.store(SignatureSlot::busy, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_release);
  assert(words[0] == seq);  // the tag says it
  for (int i = 0; i < 4; ++i) slot.words[i].store(words[i + 1], std::memory_order_relaxed);
  if (bytes > 0) std::memcpy(slot.data, input, bytes);
  slot.tag.store(seq + 1, std::memory_order_release);
}

// The `consumed` every rank must reach before this rank publishes collective `seq` once it is
// short of slots (publish_ready_locked); 0 while seq has never been short.
std::uint64_t consumed_needed(std::uint64_t seq) { return seq < signature_slots ? 0 : seq - run_ahead + 1; }

}  // namespace

// Catching a mismatch however many collectives are outstanding.
//
// Each rank publishes the signature of every collective it starts in its row of the signature
// table (signature_slots slots per rank, seq modulo the slots, each tagged with its seq) and then
// compares it with the slot of that seq of every rank that published it before (arrive: one
// atomic read-modify-write per rank on a word of rank 0's slot orders them), so every pair of
// ranks is compared once both published, by the later of the two, if the earlier one's slot
// still holds that seq.
// Two rules make that so, and make every collective wait for the comparison before it counts:
//
//  1. No slot is overwritten before every rank has compared it. A rank publishes seq s only when
//     every rank's `published` (one past the highest seq it published, stored after comparing)
//     is past s - signature_slots, the seq the slot held. Until then the signature waits in
//     `unpublished_`, in order, and is published by a later progress or check; a rank that
//     waits sets `awaits_publication`, and every publication rings the doorbells of such ranks.
//     Submission never blocks: a rank may run any number of collectives ahead of the others.
//     (With inline inputs the wait is for `consumed`, below, and for slot_slack slots at once.)
//  2. No collective completes before its comparison. A direct collective (which exchanges no
//     messages) waits for signature_checked(seq) before it first writes the caller's buffer and
//     before it finishes: every rank has published seq, so a mismatch has aborted the
//     communicator by then. Collectives made of messages carry the sender's signature in their
//     first chunk, which the receiver compares before it takes a byte (accept in
//     shm_messages.cpp); a receive that could not compare it (a signature no longer remembered,
//     with more than announced_.size() collectives outstanding) completes only once
//     signature_checked(seq).
// Neither rule can deadlock: the rank with the lowest `published` can always publish its next
// seq, and every collective below it has been published by all ranks.
//
// A small direct collective's input travels in its signature slot (carry_inline): it is published
// with the signature, and every peer reads it from there, compares the signature and is done; one
// cache line each way for a few bytes, no barrier. So that no slot is overwritten before every
// peer has read its input too, rule 1 waits for every rank's `consumed` rather than `published`:
// one past the highest seq below which the rank reads no input any more (its `published` when it
// reads none, else its oldest collective still reading). A rank that waits for it states the
// value it needs in its `wake_at_consumed`, and only the rank whose `consumed` reaches that value
// rings it. Still no deadlock: every collective below the lowest `published` has been published
// by all ranks, so every rank can read (consume) every input below it.
void ShmTransport::carry_inline(std::uint64_t seq, const std::byte* input, std::size_t bytes,
                                const WireSignature& wire) {
  pending_carry_ = PendingCarry{{seq, input, bytes}, wire};
}

const std::byte* ShmTransport::inline_input(int rank, std::uint64_t seq, const WireSignature& mine, bool arrange_wake) {
  SignatureSlot& slot = segment_->signature_slot(rank, seq);
  if (rank == rank_) {
    if (slot.tag.load(std::memory_order_acquire) != seq + 1) {  // still deferred by rule 1
      std::lock_guard lock(publication_mutex_);
      publish_ready_locked(arrange_wake);
      if (slot.tag.load(std::memory_order_acquire) != seq + 1) return nullptr;
    }
    return slot.data;
  }
  WireSignature theirs;
  if (!read_slot(slot, seq, theirs)) {
    if (!arrange_wake) return nullptr;
    std::lock_guard lock(publication_mutex_);
    publish_ready_locked();  // this rank's deferred signatures may be what the peer waits for
    awaiting_inline_ = true;
    update_await_flag_locked();
    if (!read_slot(slot, seq, theirs)) return nullptr;  // else published in between
  }
  if (theirs != mine) {
    const Error error = collective_mismatch(named(rank), from_wire(theirs), named(rank_), from_wire(mine));
    abort(error, seq);
    throw error;
  }
  return slot.data;
}

void ShmTransport::consumed_inline(std::uint64_t seq) {
  std::lock_guard lock(publication_mutex_);
  // In order, so almost always the oldest.
  if (!reading_.empty() && reading_.front() == seq)
    reading_.pop_front();
  else if (const auto it = std::find(reading_.begin(), reading_.end(), seq); it != reading_.end())
    reading_.erase(it);
  if (const auto it = std::find_if(carried_.begin(), carried_.end(), [&](const Carried& c) { return c.seq == seq; });
      it != carried_.end())
    carried_.erase(it);  // never published (the collective failed first)
  awaiting_inline_ = false;
  update_await_flag_locked();
  store_consumed_locked();
}

void ShmTransport::store_consumed_locked() {
  const std::uint64_t consumed = reading_.empty() ? published_ : std::min(published_, reading_.front());
  if (consumed == self_.consumed.load(std::memory_order_relaxed)) return;
  self_.consumed.store(consumed, std::memory_order_seq_cst);
  // seq_cst on both sides (here and in wake_when_consumed_locked): either the waiter sees our
  // `consumed`, or we see its threshold.
  for (int r = 0; r < size_; ++r) {
    if (r == rank_) continue;
    RankBlock& block = segment_->rank_block(r);
    const std::uint64_t wake_at = block.wake_at_consumed.load(std::memory_order_seq_cst);
    if (wake_at != 0 && consumed >= wake_at) ring_doorbell(block);
  }
}

void ShmTransport::wake_when_consumed_locked(std::uint64_t consumed) {
  if (consumed == wake_at_) return;
  wake_at_ = consumed;
  self_.wake_at_consumed.store(consumed, std::memory_order_seq_cst);
}

void ShmTransport::ring_awaiting_ranks() {
  for (int r = 0; r < size_; ++r)
    if (r != rank_ && segment_->rank_block(r).awaits_publication.load(std::memory_order_seq_cst) != 0)
      ring_doorbell(segment_->rank_block(r));
}

void ShmTransport::announce(const Signature& signature) {
  const bool carries = pending_carry_ && pending_carry_->carried.seq == signature.seq;
  const WireSignature mine = carries ? pending_carry_->wire : to_wire(signature);
  announced_[signature.seq % announced_.size()] = {signature.seq, mine};
  std::lock_guard lock(publication_mutex_);
  if (carries) {
    carried_.push_back(pending_carry_->carried);
    reading_.push_back(signature.seq);
  }
  pending_carry_.reset();
  unpublished_.emplace_back(signature.seq, mine);
  publish_ready_locked();
}

std::uint64_t ShmTransport::lowest_published() const {
  std::uint64_t lowest = no_seq;
  for (int r = 0; r < size_; ++r)
    lowest = std::min(lowest, segment_->rank_block(r).published.load(std::memory_order_seq_cst));
  return lowest;
}

std::uint64_t ShmTransport::lowest_consumed() const {
  std::uint64_t lowest = no_seq;
  for (int r = 0; r < size_; ++r)
    lowest = std::min(lowest, segment_->rank_block(r).consumed.load(std::memory_order_seq_cst));
  return lowest;
}

void ShmTransport::await_publication_locked(bool awaiting) {
  awaiting_publication_ = awaiting;
  update_await_flag_locked();
}

void ShmTransport::update_await_flag_locked() {
  const bool awaiting = awaiting_publication_ || awaiting_inline_;
  if (awaiting == await_flag_) return;
  await_flag_ = awaiting;
  self_.awaits_publication.store(awaiting ? 1 : 0, std::memory_order_seq_cst);
}

void ShmTransport::publish_ready_locked(bool arrange_wake) {
  while (!unpublished_.empty()) {
    // Named, not a structured binding: clang before 16 cannot capture those in a lambda.
    const std::uint64_t seq = unpublished_.front().first;
    const WireSignature& mine = unpublished_.front().second;
    // The slot held seq - signature_slots (or less): every rank must be past it (and have read
    // its input). What was seen consumed stays so: most publications need not look. A rank short
    // of slots (one running ahead of its peers, as a broadcast's root can) waits until slot_slack
    // of them are free, so that it and its peers meet once per slot_slack collectives rather than
    // at every one; that is, until every rank has consumed consumed_needed(seq): it never waits
    // while within run_ahead collectives of the slowest rank's reading. With a core per rank, a
    // caller that polls looks only at every 16th poll (each look pulls the peers' `consumed` lines
    // away from them while they work); where ranks outnumber cores, each poll yields the core, and
    // a look that finds the slot free must not wait 16 of them. Checked again after setting our
    // threshold, so that a consumption between the two is not missed.
    const bool known_free = slot_known_free_locked(seq);
    if (!arrange_wake && !known_free && !wait_policy_.yield && ++short_polls_ % 16 != 0) return;
    if (!known_free && !slot_free_locked(seq)) {
      if (!arrange_wake) return;  // a caller that polls: a threshold would only make peers ring
      wake_when_consumed_locked(consumed_needed(seq));
      if (!slot_free_locked(seq)) return;
    }
    while (!carried_.empty() && carried_.front().seq < seq) carried_.pop_front();  // (none: announced in order)
    const bool carries = !carried_.empty() && carried_.front().seq == seq;
    publish_locked(seq, mine, carries ? carried_.front().input : nullptr, carries ? carried_.front().bytes : 0);
    if (carries) carried_.pop_front();
    unpublished_.pop_front();
  }
  wake_when_consumed_locked(0);
  await_publication_locked(false);
}

bool ShmTransport::slot_known_free_locked(std::uint64_t seq) const {
  return seq < signature_slots || consumed_below_ > seq - signature_slots;
}

bool ShmTransport::slot_free_locked(std::uint64_t seq) {
  if (slot_known_free_locked(seq)) return true;
  const std::uint64_t lowest = lowest_consumed();
  if (lowest < consumed_needed(seq)) return false;  // the stale value stays: look again next time
  consumed_below_ = lowest;
  return true;
}

void ShmTransport::publish_locked(std::uint64_t seq, const WireSignature& mine, const std::byte* input,
                                  std::size_t bytes) {
  write_slot(segment_->signature_slot(rank_, seq), seq, mine, input, bytes);
  // Of two ranks publishing the same seq, the later to arrive compares (arrive orders them).
  const std::uint64_t earlier = size_ > 1 ? arrive(seq) : 0;
  for (int r = 0; r < size_; ++r) {
    WireSignature theirs;
    if (r == rank_ || (earlier >> (r % 64) & 1) == 0 || !read_slot(segment_->signature_slot(r, seq), seq, theirs))
      continue;
    if (theirs != mine) {
      abort(collective_mismatch(named(r), from_wire(theirs), named(rank_), from_wire(mine)), seq);
      break;
    }
  }
  // After the abort (if any): a rank that sees every rank past seq then sees the abort too.
  published_ = seq + 1;
  self_.published.store(published_, std::memory_order_seq_cst);
  store_consumed_locked();
  ring_awaiting_ranks();
  // The next publication most likely carries as much: its lines come while this one is used, so
  // that its fence need not wait for them (it would wait for each peer that read them to let go).
  prefetch_for_write(segment_->signature_slot(rank_, seq + 1), bytes);
}

std::uint64_t ShmTransport::arrive(std::uint64_t seq) {
  // The word holds (seq + 1) mod 2^32 in its upper half; a value for another seq is the previous
  // use of the slot (signature_slots collectives ago), which every rank has passed: every rank
  // has consumed beyond it before anyone publishes into the slot again (slot_free_locked).
  // Below: up to 32 ranks, a mask of those there; beyond, a count, and a rank that is not
  // the first compares with every peer whose slot holds seq (one that publishes later compares
  // with this rank). The read-modify-write is sequentially consistent: it orders the arrivals,
  // and makes each arriving rank's slot visible to the ranks that arrive after it.
  std::atomic<std::uint64_t>& word = segment_->signature_slot(0, seq).arrivals;
  const std::uint64_t tag = ((seq + 1) & 0xffffffffu) << 32;
  const bool masks = size_ <= 32;
  const std::uint64_t me = masks ? std::uint64_t{1} << rank_ : 1;
  std::uint64_t old = word.load(std::memory_order_relaxed);
  std::uint64_t there = 0;
  do {
    there = (old & ~std::uint64_t{0xffffffffu}) == tag ? old & 0xffffffffu : 0;
  } while (!word.compare_exchange_weak(old, tag | (masks ? there | me : there + me), std::memory_order_seq_cst,
                                       std::memory_order_relaxed));
  return masks || there == 0 ? there : ~std::uint64_t{0};
}

bool ShmTransport::signature_checked(std::uint64_t seq) {
  std::lock_guard lock(publication_mutex_);
  publish_ready_locked();
  if (seq < verified_below_) return true;
  verified_below_ = lowest_published();
  if (seq < verified_below_) return true;
  await_publication_locked(true);  // then look again: a publication in between rings us
  verified_below_ = lowest_published();
  return seq < verified_below_;
}

std::vector<int> ShmTransport::holding_slot(std::uint64_t seq) const {
  std::vector<int> ranks;
  const std::uint64_t needed = consumed_needed(seq);
  for (int r = 0; r < size_; ++r)
    if (segment_->rank_block(r).consumed.load(std::memory_order_acquire) < needed) ranks.push_back(r);
  return ranks;
}

std::vector<int> ShmTransport::unpublished_ranks(std::uint64_t seq) const {
  std::vector<int> ranks;
  for (int r = 0; r < size_; ++r)
    if (segment_->rank_block(r).published.load(std::memory_order_acquire) <= seq) ranks.push_back(r);
  return ranks;
}

}  // namespace tutti::transport::shm
