// The sending side of the rings: room in a peer's ring, chunks written into it (eager or as slots
// free up), and the acknowledgements both ways. The protocol is described in shm_transport.hpp.
#include <algorithm>
#include <cstring>

#include "core/copy.hpp"
#include "transport/shm/shm_transport.hpp"

namespace tutti::transport::shm {

// Whether rank r, whose ring to this rank was full, asked to be rung once it has room (which this
// round may have made): answered once. The flag is on the tail's line, which this rank writes.
bool ShmTransport::room_asked(int r) {
  std::atomic<std::uint32_t>& asked = segment_->ring(r, rank_).wants_room;
  return asked.load(std::memory_order_relaxed) != 0 && asked.exchange(0, std::memory_order_relaxed) != 0;
}

std::uint64_t ShmTransport::free_slots(int dst, std::uint64_t head) {
  const std::uint64_t slots = segment_->layout().slots;
  std::uint64_t& tail = tail_seen_[static_cast<std::size_t>(dst)];
  if (head - tail < slots) return slots - (head - tail);  // room by the tail last read: no miss
  RingHeader& ring = segment_->ring(rank_, dst);
  tail = ring.tail.load(std::memory_order_acquire);
  std::uint64_t fill = ring_fill(*segment_, head, tail, slots, dst, "data", rank_, dst);
  if (fill >= slots && polls_rings()) {  // full: ask dst to ring once it frees a slot, then look once more (end_round)
    ring.wants_room.store(1, std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_seq_cst);
    tail = ring.tail.load(std::memory_order_acquire);
    fill = ring_fill(*segment_, head, tail, slots, dst, "data", rank_, dst);
  }
  return slots - fill;
}

void ShmTransport::push_sends(int dst) {
  auto& queue = outbox_[static_cast<std::size_t>(dst)];
  if (queue.empty()) return;
  RingHeader& ring = segment_->ring(rank_, dst);
  std::uint64_t head = ring.head.load(std::memory_order_relaxed);
  while (!queue.empty()) {
    if (free_slots(dst, head) == 0) break;
    SendOp& op = *queue.front();
    const bool by_reference = op.offset == 0 && op.bytes >= segment_->reference_from() &&
                              op.key.channel == Channel::point_to_point && segment_->single_copy();
    write_chunk(dst, head, op, by_reference, false);
    ring.head.store(++head, std::memory_order_release);
    wake_peer(dst);
    if (op.offset < op.bytes) continue;
    queue.pop_front();
    op.written = true;
    if (op.acked) {
      finish(op.done, Completion::done);
      sends_.erase(Key{dst, op.key.channel, op.key.seq, op.key.index});
    }
  }
}

void ShmTransport::write_chunk(int dst, std::uint64_t head, SendOp& op, bool by_reference, bool eager) {
  const std::size_t n =
      by_reference ? sizeof(std::uint64_t) : std::min<std::size_t>(segment_->layout().payload, op.bytes - op.offset);
  ChunkHeader& chunk = segment_->chunk(rank_, dst, head);
  chunk.seq = op.key.seq;
  chunk.total = op.bytes;
  chunk.offset = op.offset;
  chunk.index = op.key.index;
  chunk.bytes = static_cast<std::uint32_t>(n);
  chunk.channel = static_cast<std::uint8_t>(op.key.channel);
  chunk.has_signature = op.has_signature ? 1 : 0;
  chunk.by_reference = by_reference ? 1 : 0;
  chunk.eager = eager ? 1 : 0;
  if (op.has_signature) chunk.signature = op.signature;
  if (by_reference) {
    const auto address = static_cast<std::uint64_t>(reinterpret_cast<std::uintptr_t>(op.data));
    std::memcpy(segment_->payload(rank_, dst, head), &address, sizeof address);
    op.offset = op.bytes;  // read by the receiver before it acks
  } else {
    if (n > 0) core::copy(segment_->payload(rank_, dst, head, eager, op.has_signature, n), op.data + op.offset, n);
    op.offset += n;
  }
  stamp_of(chunk).store(stamp_for(head), std::memory_order_release);
}

bool ShmTransport::send_eager(int dst, SendOp& op) {
  if (corrupt_ || !outbox_[static_cast<std::size_t>(dst)].empty()) return false;
  RingHeader& ring = segment_->ring(rank_, dst);
  const std::uint64_t head = ring.head.load(std::memory_order_relaxed);
  if (free_slots(dst, head) == 0) return false;
  write_chunk(dst, head, op, false, true);
  ring.head.store(head + 1, std::memory_order_release);
  wake_peer(dst);
  finish(op.done, Completion::done);
  return true;
}

void ShmTransport::drain_acks(int dst) {
  RingHeader& ring = segment_->ring(rank_, dst);
  std::uint64_t tail = ring.ack_tail.load(std::memory_order_relaxed);
  const std::uint64_t head = ring.ack_head.load(std::memory_order_acquire);
  if (tail == head) return;
  const bool was_full = ring_fill(*segment_, head, tail, ack_entries, dst, "ack", dst, rank_) >= ack_entries;
  for (; tail != head; ++tail) handle_ack(dst, read_ack(*segment_, rank_, dst, tail));
  ring.ack_tail.store(tail, std::memory_order_release);
  if (was_full) wake_peer(dst);  // it may hold acks waiting for room
}

void ShmTransport::handle_ack(int dst, const Ack& ack) {
  const auto it = sends_.find(Key{dst, static_cast<Channel>(ack.channel), ack.seq, ack.index});
  if (it == sends_.end()) return;  // cancelled meanwhile
  SendOp& op = *it->second;
  if (ack.ok) {
    op.acked = true;
    if (!op.written) return;
    finish(op.done, Completion::done);
  } else {
    std::erase(outbox_[static_cast<std::size_t>(dst)], &op);  // the receiver drops what is left of it
    finish(op.done, Completion::failed, size_mismatch(named(rank_), op.bytes, named(dst), ack.expected, op.key));
  }
  sends_.erase(it);
}

void ShmTransport::flush_acks(int src) {
  auto& queue = pending_acks_[static_cast<std::size_t>(src)];
  if (queue.empty()) return;
  RingHeader& ring = segment_->ring(src, rank_);
  std::uint64_t head = ring.ack_head.load(std::memory_order_relaxed);
  const std::uint64_t tail = ring.ack_tail.load(std::memory_order_acquire);
  if (ring_fill(*segment_, head, tail, ack_entries, src, "ack", rank_, src) >= ack_entries) return;
  for (; !queue.empty() && head - tail < ack_entries; ++head) {
    ring.acks[head % ack_entries] = queue.front();
    queue.pop_front();
  }
  ring.ack_head.store(head, std::memory_order_release);
  wake_peer(src);
}

}  // namespace tutti::transport::shm
