// Moving messages through the rings: posting, matching, receiving chunks, cancel (the sending side
// and the acknowledgements: shm_sends.cpp). The protocol is described in shm_transport.hpp.
#include <algorithm>
#include <cerrno>
#include <cstring>

#include "core/copy.hpp"
#include "reduce/reduce.hpp"
#include "transport/shm/shm_transport.hpp"

namespace tutti::transport::shm {

namespace {

// Heap memory for a message that arrived before its receive, grown as its chunks arrive: the
// total its first chunk announces is a peer's word, not to be allocated blindly.
constexpr std::size_t unexpected_first_allocation = 64u << 20;

void reserve(std::unique_ptr<std::byte[]>& data, std::size_t& capacity, std::size_t kept, std::size_t needed,
             std::size_t total) {
  if (needed <= capacity && data) return;
  std::size_t grown = std::max({needed, std::min(total, unexpected_first_allocation), std::min(total, 2 * capacity)});
  grown = std::max<std::size_t>(grown, 1);
  auto bigger = std::make_unique_for_overwrite<std::byte[]>(grown);
  if (kept > 0) core::copy(bigger.get(), data.get(), kept);
  data = std::move(bigger);
  capacity = grown;
}

std::uint64_t address_in(const std::byte* payload) {
  std::uint64_t address;
  std::memcpy(&address, payload, sizeof address);
  return address;
}

}  // namespace

void ShmTransport::finish(Completion* done, Completion::State state, std::string error) {
  if (!error.empty()) done->error = std::move(error);
  done->set(state);
  completed_ = true;
}

// Publishes what this round produced: acks that wait for room, the doorbells of the ranks whose
// rings we wrote into or freed (where one of their threads sleeps), then our local bell when one
// of our completions changed.
void ShmTransport::end_round() {
  if (acks_waiting_) {
    acks_waiting_ = false;
    for (int r = 0; r < size_; ++r) {
      flush_acks(r);
      acks_waiting_ = acks_waiting_ || !pending_acks_[static_cast<std::size_t>(r)].empty();
    }
  }
  if (wakes_) end_round_wakes();
  if (completed_) ring_local(bell_, self_);
  completed_ = false;
}

void ShmTransport::end_round_wakes() {
  wakes_ = false;
  const bool polled = polls_rings();
  if (polled) std::atomic_thread_fence(std::memory_order_seq_cst);  // the rings' counters before the sleeper counts
  for (int r = 0; r < size_; ++r) {
    if (wake_peer_[static_cast<std::size_t>(r)] == 0) continue;
    wake_peer_[static_cast<std::size_t>(r)] = 0;
    if (r == rank_)
      completed_ = true;  // a message to ourselves: our other threads may wait for it
    else if (polled && !room_asked(r))
      ring_if_sleeping(*segment_, r);
    else
      ring_doorbell(segment_->rank_block(r));
  }
}

void ShmTransport::post_send(int peer, const MessageKey& key, const void* data, std::size_t bytes, Completion* done) {
  prepare(done, peer, key, true);
  SendOp message;
  message.key = key;
  message.data = static_cast<const std::byte*>(data);
  message.bytes = bytes;
  message.done = done;
  if (key.channel == Channel::collective) {
    if (const WireSignature* mine = announced(key.seq)) {
      message.has_signature = true;
      message.signature = *mine;
    }
  }
  // A small message is eager (complete once in the ring, never acknowledged) where its sender may
  // go on without its receiver: point to point, and a collective's of a call that runs ahead (a
  // gather's or reduce's leaf, a broadcast's root, which would otherwise wait for each receiver to
  // take its message; how far such calls run ahead, the communicator's RunAheadWindow bounds).
  if ((key.channel == Channel::point_to_point || key.runs_ahead) && bytes <= eager_bytes) {
    try {
      if (send_eager(peer, message)) return end_round();
    } catch (const Error& error) {
      return corrupted(error);
    }
  }
  auto op = std::make_unique<SendOp>(message);
  SendOp* raw = op.get();
  if (!sends_.try_emplace(Key{peer, key.channel, key.seq, key.index}, std::move(op)).second) {
    finish(done, Completion::failed,
           "message posted twice: seq " + std::to_string(key.seq) + " index " + std::to_string(key.index) +
               " to rank " + std::to_string(named(peer)));
    return;
  }
  auto& queue = outbox_[static_cast<std::size_t>(peer)];
  queue.push_back(raw);
  try {
    if (queue.size() == 1 && !corrupt_) push_sends(peer);
    end_round();
  } catch (const Error& error) {
    corrupted(error);
  }
}

void ShmTransport::post_recv(int peer, const MessageKey& key, void* data, std::size_t bytes, Completion* done) {
  RecvOp op;
  op.dst = static_cast<std::byte*>(data);
  op.bytes = bytes;
  op.done = done;
  post_recv_op(peer, key, op);
}

bool ShmTransport::post_recv_reduce(int peer, const MessageKey& key, void* dst, const void* operand, std::size_t count,
                                    DataType type, ReduceOp op, Completion* done) {
  RecvOp recv;
  recv.dst = static_cast<std::byte*>(dst);
  recv.operand = static_cast<const std::byte*>(operand);
  recv.bytes = count * size_of(type);
  recv.reduce = true;
  recv.type = type;
  recv.op = op;
  recv.done = done;
  post_recv_op(peer, key, recv);
  return true;
}

void ShmTransport::post_recv_op(int peer, const MessageKey& key, RecvOp op) {
  prepare(op.done, peer, key, false);
  const Key k{peer, key.channel, key.seq, key.index};
  try {
    if (auto it = unexpected_.find(k); it != unexpected_.end()) {
      const Unexpected message = unexpected_.take(it);
      if (accept(k, op, message.total, message.has_signature, message.signature, message.eager)) {
        const bool read = message.by_reference ? read_reference(peer, op, message.reference)
                                               : (deliver(op, 0, message.bytes(), message.received), true);
        if (read && op.received == op.bytes)
          complete_recv(k, op);
        else
          recvs_.put(k, op);  // the rest goes straight into the buffer
      }
    } else if (recvs_.contains(k)) {
      finish(op.done, Completion::failed,
             "receive posted twice: seq " + std::to_string(key.seq) + " index " + std::to_string(key.index) +
                 " from rank " + std::to_string(named(peer)));
    } else {
      recvs_.put(k, op);
    }
    end_round();
  } catch (const Error& error) {
    corrupted(error);
  }
}

// Called once per message, when its first chunk meets its receive: checks that both ranks run
// the same collective and that the sizes agree, and answers the sender. False: `op` failed.
bool ShmTransport::accept(const Key& key, RecvOp& op, std::size_t total, bool has_signature,
                          const WireSignature& theirs, bool eager) {
  if (key.channel == Channel::collective) {
    const WireSignature* mine = announced(key.seq);
    op.unchecked = !has_signature || mine == nullptr;  // then the signature table decides (announce)
    if (!op.unchecked && *mine != theirs) {
      const Error error = collective_mismatch(named(key.peer), from_wire(theirs), named(rank_), from_wire(*mine));
      abort(error, key.seq);  // the sender learns of it through the abort, not an ack
      finish(op.done, Completion::failed, error.what());
      return false;
    }
  }
  const bool ok = total == op.bytes;
  Ack ack{};
  ack.seq = key.seq;
  ack.index = key.index;
  ack.channel = static_cast<std::uint8_t>(key.channel);
  ack.ok = ok ? 1 : 0;
  ack.expected = op.bytes;
  if (!eager) {
    pending_acks_[static_cast<std::size_t>(key.peer)].push_back(ack);
    acks_waiting_ = true;
  }
  if (!ok)
    finish(op.done, Completion::failed,
           size_mismatch(named(key.peer), total, named(rank_), op.bytes, message_key(key)));
  return ok;
}

// (Only point-to-point messages travel by reference, read_chunk makes sure, and a receive that
// reduces is only ever posted for a collective's message: this one lands as it is.)
bool ShmTransport::read_reference(int src, RecvOp& op, std::uint64_t address) {
  const int failure =
      read_process_memory(segment_->rank_block(src).pid.load(std::memory_order_relaxed), op.dst, address, op.bytes);
  if (failure == EFAULT)
    throw corrupt_segment(*segment_, named(src),
                          "the address of a " + std::to_string(op.bytes) +
                              "-byte message that its memory does not hold (" + std::strerror(failure) + ")");
  if (failure == ESRCH) throw Error(ErrorCode::peer_failure, "shm: rank " + std::to_string(named(src)) + " died");
  if (failure != 0)
    throw Error(ErrorCode::system, "shm: reading the " + std::to_string(op.bytes) + "-byte message of rank " +
                                       std::to_string(named(src)) +
                                       " from its memory failed: " + std::strerror(failure));
  // A sender gives its buffer back only after its communicator was aborted (a cancelled send):
  // if that happened, what was read may be anything.
  if (segment_->header().abort.state.load(std::memory_order_acquire) != 0) return false;
  op.received = op.bytes;
  return true;
}

void ShmTransport::deliver(RecvOp& op, std::size_t offset, const std::byte* data, std::size_t bytes) {
  if (bytes == 0) return;
  if (op.reduce)
    reduce::apply(op.op, op.type, op.dst + offset, op.operand + offset, data, bytes / size_of(op.type));
  else
    core::copy(op.dst + offset, data, bytes);
  op.received += bytes;
}

// A received message is complete: a collective's receive that could not compare signatures waits
// until the signature table has (see announce in shm.cpp).
void ShmTransport::complete_recv(const Key& key, RecvOp& op) {
  if (op.unchecked && !signature_checked(key.seq)) {
    held_.emplace_back(key.seq, op.done);
    return;
  }
  finish(op.done, Completion::done);
}

void ShmTransport::release_held() {
  if (held_.empty()) return;
  std::erase_if(held_, [&](const std::pair<std::uint64_t, Completion*>& held) {
    if (!signature_checked(held.first)) return false;
    finish(held.second, Completion::done);
    return true;
  });
}

// `header` was checked by read_chunk (its bytes fit its offset and total and the chunk slot);
// what depends on the message so far is checked here: chunks come in order, with the same total.
void ShmTransport::handle_chunk(int src, const ChunkHeader& header, const std::byte* payload) {
  const Key key{src, static_cast<Channel>(header.channel), header.seq, header.index};
  const auto out_of_order = [&](std::size_t received, std::size_t total) {
    return corrupt_segment(*segment_, src,
                           "a chunk out of order (offset " + std::to_string(header.offset) + " of " +
                               std::to_string(header.total) + " bytes where " + std::to_string(received) + " of " +
                               std::to_string(total) + " had arrived)");
  };
  if (auto it = recvs_.find(key); it != recvs_.end()) {
    RecvOp& op = it->second;
    if (header.offset != op.received || (header.offset != 0 && header.total != op.bytes))
      throw out_of_order(op.received, op.bytes);
    if (header.offset == 0 &&
        !accept(key, op, header.total, header.has_signature != 0, header.signature, header.eager != 0)) {
      recvs_.take(it);
      return;
    }
    if (header.by_reference != 0) {
      if (!read_reference(src, op, address_in(payload))) return;
    } else {
      deliver(op, header.offset, payload, header.bytes);
    }
    if (op.received == op.bytes) {
      complete_recv(key, op);
      recvs_.take(it);
    }
    return;
  }
  if (header.offset == 0) {  // unexpected: keep it until its receive is posted
    Unexpected message;
    message.total = header.total;
    if (header.by_reference != 0) {
      message.by_reference = true;
      message.reference = address_in(payload);
      message.received = header.total;
    } else {
      if (header.total > message.small.size()) reserve(message.data, message.capacity, 0, header.bytes, header.total);
      if (header.bytes > 0) core::copy(message.bytes(), payload, header.bytes);
      message.received = header.bytes;
    }
    message.has_signature = header.has_signature != 0;
    message.signature = header.signature;
    message.eager = header.eager != 0;
    unexpected_.put(key, std::move(message));
    return;
  }
  if (auto it = unexpected_.find(key); it != unexpected_.end()) {
    Unexpected& message = it->second;
    if (header.offset != message.received || header.total != message.total)
      throw out_of_order(message.received, message.total);
    reserve(message.data, message.capacity, message.received, message.received + header.bytes, message.total);
    core::copy(message.data.get() + header.offset, payload, header.bytes);
    message.received += header.bytes;
  }
  // Otherwise the rest of a message whose receive failed or was cancelled: dropped.
}

// A chunk whose stamp is there is taken without reading the head (ChunkHeader::stamp): one line
// crosses per small message. Where no stamp was found the head decides, checked as the peer's word
// where it is ahead of the tail (a head behind it has not caught up with its stamps yet).
void ShmTransport::drain(int src) {
  RingHeader& ring = segment_->ring(src, rank_);
  const std::uint64_t slots = segment_->layout().slots;
  const std::uint64_t start = ring.tail.load(std::memory_order_relaxed);
  const std::uint64_t limit = start + 4 * slots;  // bounds one round
  std::uint64_t tail = start;
  const auto take = [&] {
    const ChunkHeader header = read_chunk(*segment_, src, rank_, tail);
    handle_chunk(src, header,
                 segment_->payload(src, rank_, tail, header.eager == 1, header.has_signature == 1, header.bytes));
    ring.tail.store(++tail, std::memory_order_release);  // frees the slot at once: the sender refills it
  };
  while (tail != limit &&
         stamp_of(segment_->chunk(src, rank_, tail)).load(std::memory_order_acquire) == stamp_for(tail))
    take();
  bool more = tail == limit;
  if (tail == start) {
    // The head may still lag behind chunks taken by their stamps: nothing new then.
    std::uint64_t head = ring.head.load(std::memory_order_acquire);
    if (static_cast<std::int64_t>(head - tail) <= 0) return;
    ring_fill(*segment_, head, tail, slots, src, "data", src, rank_);
    while (tail != head && tail != limit) {
      take();
      if (tail == head) {
        head = ring.head.load(std::memory_order_acquire);
        ring_fill(*segment_, head, tail, slots, src, "data", src, rank_);
      }
    }
    more = tail != head;
  }
  wake_peer(src);
  if (more) completed_ = true;  // more to drain: keep our caller from sleeping
}

void ShmTransport::progress() {
  if (corrupt_) return;
  try {
    {
      std::lock_guard lock(publication_mutex_);
      publish_ready_locked();
    }
    for (int r = 0; r < size_; ++r) drain(r);
    for (int r = 0; r < size_; ++r) drain_acks(r);
    for (int r = 0; r < size_; ++r) push_sends(r);
    release_held();
    check_peers();
    end_round();
  } catch (const Error& error) {
    corrupted(error);
  }
}

void ShmTransport::cancel(Completion* done) {
  if (done->state() != Completion::posted) return;
  const Key key{done->peer, done->key.channel, done->key.seq, done->key.index};
  if (done->is_send) {
    const auto it = sends_.find(key);
    if (it != sends_.end() && it->second->done == done) {
      std::erase(outbox_[static_cast<std::size_t>(key.peer)], it->second.get());
      sends_.erase(it);
    }
  } else {
    const auto it = recvs_.find(key);
    if (it != recvs_.end() && it->second.done == done) recvs_.erase(it);  // later chunks are dropped
    std::erase_if(held_, [done](const std::pair<std::uint64_t, Completion*>& held) { return held.second == done; });
  }
  done->set(Completion::cancelled);
}

// A receive with part of its message in place cannot give it up: the rest would be dropped.
bool ShmTransport::withdraw_recv(Completion* done) {
  if (done->state() != Completion::posted) return false;
  const auto it = recvs_.find(Key{done->peer, done->key.channel, done->key.seq, done->key.index});
  if (it == recvs_.end() || it->second.done != done || it->second.received > 0)
    return false;  // arrived (held) or arriving
  recvs_.erase(it);
  done->set(Completion::cancelled);
  return true;
}

}  // namespace tutti::transport::shm
