// The matching side of the hub: posting, cancelling, signatures, size errors, aborts and peers
// that left. Frames as they arrive are taken apart in hub_frames.cpp.
// Every function here runs with the hub's mutex held.
#include <algorithm>
#include <cstring>
#include <optional>

#include "core/copy.hpp"
#include "core/log.hpp"
#include "reduce/reduce.hpp"
#include "transport/tcp/hub.hpp"

namespace tutti::transport::tcp {

namespace {

constexpr std::size_t max_left_ids = 4096;  // communicators remembered as left, to drop their late frames

std::uint8_t wire_channel(Channel channel) { return static_cast<std::uint8_t>(channel); }

// The frame keeps sending from its own copy: the executor may reuse the buffer from now on.
void detach(OutFrame& frame) {
  if (frame.done == nullptr) return;
  if (frame.bytes > 0 && frame.payload != frame.owned.data.get()) {
    frame.owned = Bytes::make(frame.bytes);
    core::copy(frame.owned.data.get(), frame.payload, frame.bytes);
    frame.payload = frame.owned.data.get();
  }
  frame.done = nullptr;
}

}  // namespace

CommState& Hub::comm_locked(std::uint64_t id) {
  auto& slot = comms_[id];
  if (!slot) slot = std::make_unique<CommState>();
  return *slot;
}

CommState* Hub::join(std::uint64_t id, const std::vector<int>& members, int rank) {
  std::lock_guard lock(mutex_);
  CommState& c = comm_locked(id);
  c.members = members;
  c.rank = rank;
  for (std::size_t r = 0; r < members.size(); ++r) c.rank_of[members[r]] = static_cast<int>(r);
  for (std::size_t r = 0; r < members.size(); ++r) {
    const int g = members[r];
    if (g != rank_ && peers_[static_cast<std::size_t>(g)].departed) c.left.insert(g);
    auto dead = dead_.find(g);
    if (dead == dead_.end() || c.failure) continue;
    fail_comm_locked(
        c, id,
        Failure{Error(ErrorCode::peer_failure, dead->second.first + std::to_string(r) + dead->second.second), no_seq},
        false);
  }
  return &c;
}

void Hub::leave(std::uint64_t id) {
  std::lock_guard lock(mutex_);
  for (Peer& peer : peers_) {
    if (peer.in.stage != Inbound::Stage::header && peer.in.header.comm_id == id && peer.in.done != nullptr) {
      peer.in.sink = Inbound::Sink::drain;
      peer.in.done = nullptr;
    }
    for (OutFrame& frame : peer.out)
      if (frame.header.comm_id == id) detach(frame);
  }
  std::erase_if(awaiting_ack_, [id](const auto& entry) { return std::get<0>(entry.first) == id; });
  auto found = comms_.find(id);
  if (found == comms_.end()) return;
  CommState& c = *found->second;
  for (const auto& [key, message] : c.unexpected) release_locked(key.peer, charge_of(message));
  for (const auto& [seq, entry] : c.unchecked) release_locked(entry.first, signature_overhead);
  // Peers still waiting for this rank in this communicator fail now rather than at their deadline.
  if (!stopping_)
    for (int g : c.members)
      if (g != rank_) send_control_locked(g, FrameKind::leave, id, {}, {});
  comms_.erase(found);
  left_ids_.insert(id);
  left_order_.push_back(id);
  if (left_order_.size() > max_left_ids) {
    left_ids_.erase(left_order_.front());
    left_order_.pop_front();
  }
}

void Hub::announce(std::uint64_t id, const Signature& signature) {
  std::lock_guard lock(mutex_);
  CommState& c = comm_locked(id);
  const WireSignature mine = to_wire(signature);
  c.announced.add(signature.seq, mine);
  const auto [first, last] = c.unchecked.equal_range(signature.seq);
  std::optional<std::pair<int, WireSignature>> disagreeing;
  for (auto it = first; it != last;) {
    if (!disagreeing && it->second.second != mine) disagreeing = it->second;
    release_locked(it->second.first, signature_overhead);
    c.unchecked_spares.take(c.unchecked, it++);
  }
  if (disagreeing) report_mismatch_locked(c, id, disagreeing->first, disagreeing->second, mine);
}

void Hub::notify_signature(std::uint64_t id, int peer, std::uint64_t seq) {
  std::lock_guard lock(mutex_);
  CommState& c = comm_locked(id);
  const WireSignature* mine = c.announced.find(seq);
  const int g = c.members.at(static_cast<std::size_t>(peer));
  if (mine == nullptr || g == rank_ || c.failure) return;
  OutFrame frame;
  frame.header.kind = FrameKind::notice;
  frame.header.channel = static_cast<std::uint8_t>(Channel::collective);
  frame.header.comm_id = id;
  frame.header.seq = seq;
  frame.header.signature = *mine;
  enqueue_locked(g, std::move(frame));
}

void Hub::post_send(std::uint64_t id, int peer, const MessageKey& key, const void* data, std::size_t bytes,
                    Completion* done) {
  prepare(done, peer, key, true);
  std::lock_guard lock(mutex_);
  CommState& c = comm_locked(id);
  const int g = c.members.at(static_cast<std::size_t>(peer));
  if (g == rank_) {
    self_send_locked(c, match_key(g, key), data, bytes, done);
    return;
  }
  if (fail_if_left_locked(c, id, g, match_key(g, key), true)) return;
  OutFrame frame;
  frame.header.kind = FrameKind::data;
  frame.header.channel = static_cast<std::uint8_t>(key.channel);
  frame.header.comm_id = id;
  frame.header.seq = key.seq;
  frame.header.index = key.index;
  if (key.channel == Channel::collective) {
    if (const WireSignature* mine = c.announced.find(key.seq)) frame.header.signature = *mine;
  }
  frame.payload = static_cast<const std::byte*>(data);
  frame.bytes = bytes;
  frame.done = done;
  frame.may_wait = key.runs_ahead;
  enqueue_locked(g, std::move(frame));
}

void PostedRecv::land(const void* incoming) const {
  if (operand != nullptr)
    reduce::apply(op, type, data, operand, incoming, bytes / size_of(type));
  else if (bytes > 0)
    core::move(data, incoming, bytes);
}

void Hub::post_recv(std::uint64_t id, int peer, const MessageKey& key, const PostedRecv& recv) {
  prepare(recv.done, peer, key, false);
  std::lock_guard lock(mutex_);
  CommState& c = comm_locked(id);
  const int g = c.members.at(static_cast<std::size_t>(peer));
  const MatchKey k = match_key(g, key);
  if (g == rank_) {
    auto it = c.self_sends.find(k);
    if (it == c.self_sends.end()) {
      c.posted.put(k, recv);
      return;
    }
    const SelfSend send = c.self_sends.take(it);
    c.posted.put(k, recv);
    self_send_locked(c, k, send.data, send.bytes, send.done);
    return;
  }
  auto it = c.unexpected.find(k);
  if (it == c.unexpected.end()) {
    if (fail_if_left_locked(c, id, g, k, false)) return;  // what it sent before leaving is matched above
    c.posted.put(k, recv);
    return;
  }
  Bytes message = c.unexpected.take(it);
  release_locked(g, charge_of(message));
  match_buffered_locked(c, id, g, k, std::move(message), recv);
}

void Hub::self_send_locked(CommState& c, const MatchKey& key, const void* data, std::size_t bytes, Completion* done) {
  auto it = c.posted.find(key);
  if (it == c.posted.end()) {
    c.self_sends.put(key, SelfSend{data, bytes, done});
    return;
  }
  const PostedRecv recv = c.posted.take(it);
  if (recv.bytes != bytes) {
    const std::string text = size_mismatch(c.rank, bytes, c.rank, recv.bytes, message_key(key));
    done->error = recv.done->error = text;
    done->set(Completion::failed);
    recv.done->set(Completion::failed);
  } else {
    recv.land(data);
    done->set(Completion::done);
    recv.done->set(Completion::done);
  }
  ring();
}

void Hub::match_buffered_locked(CommState& c, std::uint64_t id, int g, const MatchKey& key, Bytes&& message,
                                const PostedRecv& recv) {
  if (message.size != recv.bytes) {
    size_mismatch_locked(c, id, g, key, message.size, recv);
    return recycle_locked(std::move(message));
  }
  recv.land(message.data.get());
  const bool ack = acked(wire_channel(key.channel), message.size);
  recycle_locked(std::move(message));
  recv.done->set(Completion::done);
  if (ack) send_control_locked(g, FrameKind::ack, id, key, {});
  ring();
}

void Hub::cancel(std::uint64_t id, Completion* done) {
  std::lock_guard lock(mutex_);
  if (done->state() != Completion::posted) return;
  auto found = comms_.find(id);
  if (found != comms_.end()) {
    CommState& c = *found->second;
    const int g = c.members.at(static_cast<std::size_t>(done->peer));
    MatchKey k = match_key(g, done->key);
    if (!done->is_send) {
      auto it = c.posted.find(k);
      if (it != c.posted.end() && it->second.done == done) c.posted.take(it);
      Inbound& in = peers_[static_cast<std::size_t>(g)].in;
      if (in.stage != Inbound::Stage::header && in.done == done) {  // mid-read into its buffer: divert the rest
        in.sink = Inbound::Sink::drain;
        in.done = nullptr;
      }
    } else if (g == rank_) {
      auto it = c.self_sends.find(k);
      if (it != c.self_sends.end() && it->second.done == done) c.self_sends.erase(it);
    } else {
      auto& out = peers_[static_cast<std::size_t>(g)].out;
      for (auto it = out.begin(); it != out.end(); ++it) {
        if (it->done != done) continue;
        if (!it->sealed)
          out.erase(it);
        else
          detach(*it);  // the peer is reading it: finish the frame from a copy
        break;
      }
      awaiting_ack_.erase({id, g, wire_channel(k.channel), k.seq, k.index});
    }
  }
  done->set(Completion::cancelled);
}

bool Hub::withdraw_recv(std::uint64_t id, Completion* done) {
  std::lock_guard lock(mutex_);
  if (done->state() != Completion::posted) return false;
  auto found = comms_.find(id);
  if (found == comms_.end()) return false;
  CommState& c = *found->second;
  const int g = c.members.at(static_cast<std::size_t>(done->peer));
  const Inbound& in = peers_[static_cast<std::size_t>(g)].in;
  if (in.stage != Inbound::Stage::header && in.done == done) return false;  // being read into its buffer
  auto it = c.posted.find(match_key(g, done->key));
  if (it == c.posted.end() || it->second.done != done) return false;
  c.posted.take(it);
  done->set(Completion::cancelled);
  return true;
}

std::optional<Failure> Hub::failure(const CommState& state) const {
  if (!state.has_failure.load(std::memory_order_acquire)) return std::nullopt;
  std::lock_guard lock(mutex_);
  return state.failure;
}

void Hub::abort(std::uint64_t id, const Error& error, std::uint64_t seq) {
  std::lock_guard lock(mutex_);
  fail_comm_locked(comm_locked(id), id, Failure{error, seq}, true);
}

void Hub::fail_comm_locked(CommState& c, std::uint64_t id, const Failure& failure, bool broadcast) {
  if (c.failure) return;  // the first error wins
  c.failure = failure;
  c.has_failure.store(true, std::memory_order_release);
  if (broadcast) {
    for (int g : c.members) {
      if (g == rank_) continue;
      send_control_locked(g, FrameKind::abort, id, MatchKey{0, Channel::collective, failure.seq, 0},
                          failure.error.what(), static_cast<std::uint32_t>(failure.error.code()));
    }
  }
  ring();
}

void Hub::send_control_locked(int g, FrameKind kind, std::uint64_t id, const MatchKey& about, std::string text,
                              std::uint32_t code) {
  if (text.size() > max_control_payload) text.resize(max_control_payload);
  OutFrame frame;
  frame.header.kind = kind;
  frame.header.comm_id = id;
  frame.header.channel = wire_channel(about.channel);
  frame.header.seq = about.seq;
  frame.header.index = about.index;
  frame.header.code = code;
  frame.owned = Bytes::make(text.size());
  if (!text.empty()) std::memcpy(frame.owned.data.get(), text.data(), text.size());
  frame.payload = frame.owned.data.get();
  frame.bytes = text.size();
  enqueue_locked(g, std::move(frame));
}

std::string Hub::operation_name(const CommState& c, const MatchKey& key, bool is_send) const {
  if (key.channel != Channel::point_to_point) {
    const WireSignature* mine = c.announced.find(key.seq);
    return mine != nullptr ? from_wire(*mine).describe() : "collective #" + std::to_string(key.seq);
  }
  auto found = c.rank_of.find(key.peer);
  const int peer = found == c.rank_of.end() ? key.peer : found->second;
  return (is_send ? "send to rank " : "recv from rank ") + std::to_string(peer) + " (tag " + std::to_string(key.seq) +
         ")";
}

// An operation of this rank on `c` that involves `g`, which left: it can never complete.
bool Hub::fail_if_left_locked(CommState& c, std::uint64_t id, int g, const MatchKey& key, bool is_send) {
  if (!c.left.count(g) || c.failure) return c.failure.has_value() && c.left.count(g);
  auto found = c.rank_of.find(g);
  const std::string them = std::to_string(found == c.rank_of.end() ? g : found->second);
  const std::string text = "rank " + them + " left (closed its communicator/exited) while rank " +
                           std::to_string(c.rank) + " was waiting for it in " + operation_name(c, key, is_send);
  fail_comm_locked(
      c, id, Failure{Error(ErrorCode::peer_failure, text), key.channel == Channel::point_to_point ? no_seq : key.seq},
      true);
  return true;
}

// `g` left communicator `c` (or the job): whatever this rank still waits for from it fails now.
void Hub::peer_left_locked(CommState& c, std::uint64_t id, int g) {
  c.left.insert(g);
  if (c.failure || !c.joined()) return;
  for (const auto& [key, recv] : c.posted)
    if (key.peer == g) {
      fail_if_left_locked(c, id, g, key, false);
      return;
    }
  for (const auto& [key, done] : awaiting_ack_)
    if (std::get<0>(key) == id && std::get<1>(key) == g) {
      fail_if_left_locked(
          c, id, g, MatchKey{g, static_cast<Channel>(std::get<2>(key)), std::get<3>(key), std::get<4>(key)}, true);
      return;
    }
  for (const OutFrame& frame : peers_[static_cast<std::size_t>(g)].out)
    if (frame.done != nullptr && frame.header.comm_id == id) {
      fail_if_left_locked(c, id, g, frame_key(g, frame.header), true);
      return;
    }
  // The receive being filled from g right now cannot be pending: g's frames before its goodbye
  // are all read.
}

void Hub::report_mismatch_locked(CommState& c, std::uint64_t id, int g, const WireSignature& theirs,
                                 const WireSignature& mine) {
  auto found = c.rank_of.find(g);
  const int them = found == c.rank_of.end() ? g : found->second;
  const Error error = collective_mismatch(them, from_wire(theirs), c.rank, from_wire(mine));
  if (core::log_enabled(core::LogLevel::info)) core::log(core::LogLevel::info, rank_, error.what());
  fail_comm_locked(c, id, Failure{error, mine.seq}, true);
}

void Hub::size_mismatch_locked(CommState& c, std::uint64_t id, int g, const MatchKey& key, std::size_t sent,
                               const PostedRecv& recv) {
  auto found = c.rank_of.find(g);
  const std::string text =
      size_mismatch(found == c.rank_of.end() ? g : found->second, sent, c.rank, recv.bytes, message_key(key));
  recv.done->error = text;
  recv.done->set(Completion::failed);
  send_control_locked(g, FrameKind::size_error, id, key, text);
  ring();
}

void Hub::fail_send_locked(std::uint64_t id, int g, const FrameHeader& h, const std::string& text) {
  Completion* done = nullptr;
  auto it = awaiting_ack_.find({id, g, h.channel, h.seq, h.index});
  if (it != awaiting_ack_.end()) {
    done = it->second;
    awaiting_ack_.erase(it);
  } else {
    for (OutFrame& frame : peers_[static_cast<std::size_t>(g)].out) {
      const FrameHeader& f = frame.header;
      if (frame.done == nullptr || f.comm_id != id || f.channel != h.channel || f.seq != h.seq || f.index != h.index)
        continue;
      done = frame.done;
      detach(frame);
      break;
    }
  }
  if (done == nullptr) return;  // already complete: the receiver's abort reaches this rank's operation
  done->error = text;
  done->set(Completion::failed);
  ring();
}

}  // namespace tutti::transport::tcp
