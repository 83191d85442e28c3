// The shared-memory transport's life cycle, collective signatures, sleeping, aborts and the
// liveness of peers. Moving messages is in shm_messages.cpp.
#include "transport/shm/shm.hpp"

#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cassert>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <thread>

#include "bootstrap/auth.hpp"
#include "bootstrap/store.hpp"
#include "core/deadline.hpp"
#include "transport/shm/shm_transport.hpp"

namespace tutti::transport::shm {

namespace {

using clock = std::chrono::steady_clock;

// A sleeping rank wakes at least this often, so that its caller progresses and checks peers.
constexpr auto longest_sleep = std::chrono::milliseconds(100);

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

}  // namespace

std::unique_ptr<Transport> open(const std::string& name, int rank, int size, std::uint64_t comm_id,
                                std::chrono::milliseconds timeout) {
  auto segment = Segment::attach(name, rank, size, comm_id, clock::now() + timeout);
  return std::make_unique<ShmTransport>(std::move(segment), rank, timeout);
}

std::string world_segment_name(const std::string& job_id, const std::string& nonce) {
  return "tutti-" + job_id + "-world-" + nonce;
}

std::unique_ptr<Transport> open_world(bootstrap::Store& store, const std::string& key, const std::string& job_id,
                                      int rank, int size, std::uint64_t comm_id, std::chrono::milliseconds timeout) {
  const auto deadline = clock::now() + timeout;
  const auto left = [&] { return core::left_until(deadline); };
  std::string nonce;
  if (rank == 0) {
    nonce = bootstrap::random_hex(12);
    store.set(key, nonce);
  } else {
    // A store used before by a job with the same id may still hold that job's nonce: until a
    // segment of that name exists, read the key again (rank 0 overwrites it when it starts).
    for (;;) {
      nonce = store.get(key, left());
      if (nonce.size() != 24 || nonce.find_first_not_of("0123456789abcdef") != std::string::npos)
        throw Error(ErrorCode::invalid_argument, "shm: the segment nonce under store key '" + key + "' is malformed");
      const int fd = shm_open(("/" + world_segment_name(job_id, nonce)).c_str(), O_RDONLY, 0);
      if (fd >= 0) close(fd);
      if (fd >= 0 || errno != ENOENT || clock::now() >= deadline) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
  return open(world_segment_name(job_id, nonce), rank, size, comm_id, left());
}

namespace {

// The `consumed` every rank must reach before this rank publishes collective `seq` once it is
// short of slots (publish_ready_locked); 0 while seq has never been short.
std::uint64_t consumed_needed(std::uint64_t seq) { return seq < signature_slots ? 0 : seq - run_ahead + 1; }

// How a wait passes the time before it sleeps. A futex sleep and wake-up costs several
// microseconds, more than a whole small collective. With a core per rank we spin about as long as
// a small collective takes. With more ranks than cores, spinning would steal the very core the
// peer needs, so we yield it instead (the peer runs, and we need no wake-up when it answers soon).
ShmTransport::WaitPolicy wait_policy(int ranks) {
  if (!ranks_outnumber_cores(ranks)) return {std::chrono::microseconds(50), false};
  return {std::chrono::microseconds(200), true};
}

}  // namespace

ShmTransport::ShmTransport(std::unique_ptr<Segment> segment, int rank, std::chrono::milliseconds attach_timeout)
    : segment_(std::move(segment)),
      rank_(rank),
      size_(segment_->layout().size),
      comm_id_(segment_->header().comm_id),
      attach_timeout_(attach_timeout),
      self_(segment_->rank_block(rank)),
      outbox_(static_cast<std::size_t>(size_)),
      pending_acks_(static_cast<std::size_t>(size_)),
      tail_seen_(static_cast<std::size_t>(size_), 0),
      wake_peer_(static_cast<std::size_t>(size_), 0),
      pidfds_(static_cast<std::size_t>(size_), -1),
      wait_policy_(wait_policy(size_)) {
  // Every pid is registered once attach returns. A pidfd (opened now, before the pid could be
  // reused) also reports a dead child its parent has not reaped yet, which kill(pid, 0) does not.
  const auto me = static_cast<std::int32_t>(getpid());
  for (int r = 0; r < size_; ++r) {
    const std::int32_t pid = segment_->rank_block(r).pid.load(std::memory_order_relaxed);
    if (r == rank_ || pid <= 0 || pid == me) continue;
#ifdef SYS_pidfd_open
    pidfds_[static_cast<std::size_t>(r)] = static_cast<int>(syscall(SYS_pidfd_open, pid, 0));
#endif
  }
}

// The queue fails (and so cancels) every operation before the transport goes; the mapping stays
// valid for the peers until each of them unmaps it.
ShmTransport::~ShmTransport() {
  for (int fd : pidfds_)
    if (fd >= 0) close(fd);
}

std::unique_ptr<Transport> ShmTransport::split(std::uint64_t id, const std::vector<int>& ranks, int new_rank) {
  auto segment = Segment::attach(split_segment_name(*segment_, id), new_rank, static_cast<int>(ranks.size()), id,
                                 clock::now() + attach_timeout_);
  return std::make_unique<ShmTransport>(std::move(segment), new_rank, attach_timeout_);
}

// Catching a mismatch however many collectives are outstanding.
//
// Each rank publishes the signature of every collective it starts in its row of the signature
// table (signature_slots slots per rank, seq modulo the slots, each tagged with its seq) and then
// compares it with the slot of that seq of every other rank. Of two ranks publishing the same
// seq, the later one sees the earlier one's slot (each writes, fences, then reads), so every
// pair of ranks is compared once both published, if the earlier one's slot still holds that seq.
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

std::uint64_t ShmTransport::generation() const { return doorbell_token(*segment_, rank_, bell_, polls_rings()); }

void ShmTransport::wait(std::uint64_t seen, clock::time_point deadline) {
  // A peer that answers within a few microseconds is cheaper to catch spinning than sleeping;
  // where ranks outnumber cores, the peer may need this very core, so each poll yields it.
  for (int i = 0; i < (wait_policy_.yield ? 0 : 64); ++i) {
    if (generation() != seen) return;
    cpu_relax();
  }
  for (const auto until = std::min(deadline, clock::now() + wait_policy_.budget); clock::now() < until;) {
    for (int i = 0; i < 32; ++i) {
      if (generation() != seen) return;
      if (wait_hook_) wait_hook_(true);
      relax();
    }
  }
  if (wait_hook_) wait_hook_(false);
  wait_in_background(seen, deadline);
}

void ShmTransport::wait_in_background(std::uint64_t seen, clock::time_point deadline) {
  const auto now = clock::now();
  slept_.store(true, std::memory_order_relaxed);
  if (now < deadline)
    sleep_on_doorbell(*segment_, rank_, bell_, seen, polls_rings(),
                      std::min<clock::duration>(deadline - now, longest_sleep));
}

void ShmTransport::wake() { ring_local(bell_, self_); }

void ShmTransport::relax() {
  if (wait_policy_.yield)
    sched_yield();
  else
    cpu_relax();
}

std::optional<Failure> ShmTransport::aborted() const {
  if (segment_->header().abort.state.load(std::memory_order_acquire) != 2) return std::nullopt;  // on every call
  return read_abort(*segment_);
}

void ShmTransport::abort(const Error& error, std::uint64_t seq) {
  AbortRecord& record = segment_->header().abort;
  std::uint32_t expected = 0;
  if (record.state.compare_exchange_strong(expected, 1, std::memory_order_acq_rel)) {
    const std::size_t length = std::min(std::strlen(error.what()), abort_text_bytes);
    record.code = static_cast<std::int32_t>(error.code());
    record.rank = rank_;
    record.seq = seq;
    std::memcpy(record.text, error.what(), length);
    record.length = static_cast<std::uint32_t>(length);
    record.state.store(2, std::memory_order_release);
  }
  for (int r = 0; r < size_; ++r) ring_doorbell(segment_->rank_block(r));
}

// A peer wrote garbage into the rings: every rank fails with the error naming it, and this rank
// reads the rings no more (their indices can no longer be trusted).
void ShmTransport::corrupted(const Error& error) {
  corrupt_ = true;
  abort(error, no_seq);
}

bool ShmTransport::waits_on(int peer) const {
  if (!outbox_[static_cast<std::size_t>(peer)].empty()) return true;
  for (const auto& [key, op] : sends_)
    if (key.peer == peer) return true;
  for (const auto& [key, op] : recvs_)
    if (key.peer == peer) return true;
  return false;
}

bool ShmTransport::peer_dead(int peer, std::int32_t pid) const {
  const int fd = pidfds_[static_cast<std::size_t>(peer)];
  if (fd >= 0) {
    pollfd ready{fd, POLLIN, 0};
    return poll(&ready, 1, 0) > 0;  // readable once the process has terminated
  }
  return kill(pid, 0) != 0 && errno == ESRCH;
}

bool ShmTransport::peer_has_died(int peer) const {
  const std::int32_t pid = segment_->rank_block(peer).pid.load(std::memory_order_relaxed);
  if (peer == rank_ || pid <= 0 || pid == static_cast<std::int32_t>(getpid())) return false;
  return peer_dead(peer, pid);
}

// A dead peer is an error only for a rank that still needs it: a peer that finished its part and
// exited normally has left everything it sent in the rings, which we drain before deciding.
// Reading the clock costs as much as a small message's own work: a caller that polls looks at it
// every 16th round, and at the first round after a sleep (a sleep may have lasted longest_sleep).
void ShmTransport::check_peers() {
  if ((++liveness_rounds_ & 15) != 0 &&
      !(slept_.load(std::memory_order_relaxed) && slept_.exchange(false, std::memory_order_relaxed)))
    return;  // (the load first: an exchange is a locked instruction, in every round)
  const auto now = clock::now();
  if (now < next_liveness_check_) return;
  next_liveness_check_ = now + liveness_period;
  const auto me = static_cast<std::int32_t>(getpid());
  for (int r = 0; r < size_; ++r) {
    const std::int32_t pid = segment_->rank_block(r).pid.load(std::memory_order_relaxed);
    if (r == rank_ || pid <= 0 || pid == me || !peer_dead(r, pid)) continue;
    drain(r);
    if (!waits_on(r)) continue;
    abort(
        Error(ErrorCode::peer_failure, "rank " + std::to_string(named(r)) + " (pid " + std::to_string(pid) + ") died"),
        no_seq);
    return;
  }
}

}  // namespace tutti::transport::shm
