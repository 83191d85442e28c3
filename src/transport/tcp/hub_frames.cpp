// Frames as they arrive at the hub: each header checked before use, its payload routed (into a
// posted receive, onto the heap as an unexpected message, or drained), and the frame acted on once
// complete; with what a peer's frames make this rank hold charged against TUTTI_TCP_MAX_UNEXPECTED.
// Every function here runs with the hub's mutex held.
#include <algorithm>
#include <string>

#include "transport/tcp/hub.hpp"

namespace tutti::transport::tcp {

namespace {

constexpr auto p2p = static_cast<std::uint8_t>(Channel::point_to_point);
constexpr std::size_t max_unjoined = 64;  // communicators created by frames before this rank joined them

}  // namespace

// Every field of a header, checked before any is used: "" when it is well formed.
std::string Hub::check_header(const FrameHeader& h) const {
  if (h.magic != frame_magic) return "bad frame magic";
  if ((h.flags & ~frame_compact) != 0) return "unknown flags " + std::to_string(h.flags);
  if (h.channel > p2p) return "unknown channel " + std::to_string(h.channel);
  switch (h.kind) {
    case FrameKind::data:
      if (h.bytes > max_data_payload) return "data frame of " + std::to_string(h.bytes) + " bytes";
      return {};
    case FrameKind::abort:
      if (h.code > static_cast<std::uint32_t>(ErrorCode::system)) return "unknown error code " + std::to_string(h.code);
      [[fallthrough]];
    case FrameKind::size_error:
      if (h.bytes > max_control_payload) return "control frame of " + std::to_string(h.bytes) + " bytes";
      return {};
    case FrameKind::notice:
      if (h.channel != static_cast<std::uint8_t>(Channel::collective)) return "notice outside the collective channel";
      [[fallthrough]];
    case FrameKind::ack:
    case FrameKind::goodbye:
    case FrameKind::leave:
      if (h.bytes != 0) return "payload on a frame that has none";
      return {};
  }
  return "unknown frame kind " + std::to_string(static_cast<int>(h.kind));
}

bool Hub::start_frame_locked(int g) {
  Peer& peer = peers_[static_cast<std::size_t>(g)];
  Inbound& in = peer.in;
  const FrameHeader& h = in.header;
  if (const std::string bad = check_header(h); !bad.empty()) {
    drop_peer_locked(g, "malformed frame (" + bad + ")", "rank ",
                     " sent a malformed frame (" + bad + "); its connection is closed");
    return false;
  }
  if (peer.departed) {  // nothing follows a goodbye
    drop_peer_locked(g, "frame after its goodbye", "rank ", " sent a frame after leaving; its connection is closed");
    return false;
  }
  in.remaining = h.bytes;
  in.sink = Inbound::Sink::drain;
  in.done = nullptr;
  in.target = nullptr;
  in.charged = 0;
  switch (h.kind) {
    case FrameKind::data:
      if (!start_data_locked(g)) return false;
      break;
    case FrameKind::abort:
    case FrameKind::size_error:
      in.heap = Bytes::make(h.bytes);
      in.sink = Inbound::Sink::heap;
      in.target = in.heap.data.get();
      break;
    case FrameKind::ack:
    case FrameKind::goodbye:
    case FrameKind::leave:
    case FrameKind::notice:
      break;  // acted on when the frame is complete (authenticated)
  }
  if (in.remaining == 0) {
    finish_frame_locked(g);
  } else {
    in.stage = Inbound::Stage::payload;
    if (peer.receive_mac && !in.compact) peer.receive_mac->begin(in.number, FrameMac::Part::payload);
  }
  return !peer.closed;
}

CommState* Hub::frame_comm_locked(int g, std::uint64_t id) {
  auto found = comms_.find(id);
  if (found != comms_.end()) return found->second.get();
  if (left_ids_.count(id)) return nullptr;  // a late frame for a communicator this rank left
  const auto unjoined =
      std::count_if(comms_.begin(), comms_.end(), [](const auto& entry) { return !entry.second->joined(); });
  if (static_cast<std::size_t>(unjoined) >= max_unjoined) {
    drop_peer_locked(g, "frames for too many unknown communicators", "rank ",
                     " sent frames for more than " + std::to_string(max_unjoined) +
                         " communicators this rank has not joined (the last " + std::to_string(id) +
                         "); its connection is closed");
    return nullptr;
  }
  return &comm_locked(id);
}

void Hub::refuse_charge_locked(int g, const std::string& what) {
  const Peer& peer = peers_[static_cast<std::size_t>(g)];
  drop_peer_locked(g, "over TUTTI_TCP_MAX_UNEXPECTED", "rank ",
                   " sent more than this rank may hold before its receives are posted: " + what + " on top of " +
                       std::to_string(peer.held) + " bytes held, over TUTTI_TCP_MAX_UNEXPECTED=" +
                       std::to_string(max_unexpected_) + " (post receives earlier or raise it)");
}

void Hub::release_locked(int g, std::size_t bytes) {
  if (g < 0 || g >= size()) return;
  Peer& peer = peers_[static_cast<std::size_t>(g)];
  peer.held -= std::min(peer.held, bytes);
}

bool Hub::start_data_locked(int g) {
  Peer& peer = peers_[static_cast<std::size_t>(g)];
  Inbound& in = peer.in;
  const FrameHeader& h = in.header;
  if (stopping_) return true;  // nobody will receive it
  CommState* found = frame_comm_locked(g, h.comm_id);
  if (found == nullptr) return !peer.closed;
  CommState& c = *found;
  if (c.failure) return true;  // an aborted communicator takes no more data
  if (h.channel != p2p && !check_signature_locked(c, h.comm_id, g, h.seq, h.signature)) return !peer.closed;
  const MatchKey k = frame_key(g, h);
  auto it = c.posted.find(k);
  if (it == c.posted.end()) {  // unexpected: keep it until the receive is posted
    const std::size_t charge = charge_of_message(h.bytes);
    if (!charge_locked(g, charge, [&] {
          return "a message of " + std::to_string(h.bytes) + " bytes for communicator " + std::to_string(h.comm_id) +
                 " with no receive posted";
        }))
      return false;
    in.charged = charge;
    in.heap = message_bytes_locked(h.bytes);
    in.sink = Inbound::Sink::heap;
    in.target = in.heap.data.get();
    return true;
  }
  const PostedRecv recv = c.posted.take(it);
  if (recv.bytes != h.bytes) {
    size_mismatch_locked(c, h.comm_id, g, k, h.bytes, recv);
    return true;
  }
  in.sink = recv.operand ? Inbound::Sink::reduce : Inbound::Sink::user;  // straight into the user's buffer
  in.target = static_cast<std::byte*>(recv.data);
  in.operand = static_cast<const std::byte*>(recv.operand);
  in.type = recv.type;
  in.op = recv.op;
  in.done = recv.done;
  return true;
}

Bytes Hub::message_bytes_locked(std::size_t size) {
  if (size <= small_message_bytes) {
    if (small_buffers_.empty())
      return {std::make_unique_for_overwrite<std::byte[]>(small_message_bytes), size, small_message_bytes};
    Bytes bytes{std::move(small_buffers_.back()), size, small_message_bytes};
    small_buffers_.pop_back();
    return bytes;
  }
  // Pooled only from a granule up, so that no message takes more than twice its size (what a
  // peer makes this rank hold stays near what it is charged).
  constexpr std::size_t granule = 64 * 1024;
  if (size < granule || size > large_kept_each) return Bytes::make(size);
  auto best = large_buffers_.end();  // the smallest kept buffer that holds `size`
  for (auto it = large_buffers_.begin(); it != large_buffers_.end(); ++it)
    if (it->second >= size && (best == large_buffers_.end() || it->second < best->second)) best = it;
  if (best == large_buffers_.end()) {
    const std::size_t room = (size + granule - 1) / granule * granule;
    return {std::make_unique_for_overwrite<std::byte[]>(room), size, room};
  }
  Bytes bytes{std::move(best->first), size, best->second};
  large_buffers_bytes_ -= best->second;
  large_buffers_.erase(best);
  return bytes;
}

void Hub::recycle_locked(Bytes&& bytes) {
  if (bytes.room == 0 || !bytes.data) return;
  if (bytes.room == small_message_bytes) {
    if (small_buffers_.size() >= small_kept) return;
    if (small_buffers_.capacity() == 0) small_buffers_.reserve(small_kept);
    small_buffers_.push_back(std::move(bytes.data));
  } else if (large_buffers_bytes_ + bytes.room <= large_kept_bytes) {
    large_buffers_bytes_ += bytes.room;
    large_buffers_.emplace_back(std::move(bytes.data), bytes.room);
  }
}

bool Hub::check_signature_locked(CommState& c, std::uint64_t id, int g, std::uint64_t seq,
                                 const WireSignature& theirs) {
  const WireSignature* mine = c.announced.find(seq);
  if (mine == nullptr) {  // checked when this rank announces it, every sender's
    const auto [first, last] = c.unchecked.equal_range(seq);
    if (std::none_of(first, last, [g](const auto& entry) { return entry.second.first == g; })) {
      if (!charge_locked(g, signature_overhead, [&] { return "a signature for collective #" + std::to_string(seq); }))
        return false;
      c.unchecked_spares.insert(c.unchecked, seq, std::pair{g, theirs});
    }
    return true;
  }
  if (*mine == theirs) return true;
  report_mismatch_locked(c, id, g, theirs, *mine);
  return false;
}

void Hub::finish_frame_locked(int g) {
  Peer& peer = peers_[static_cast<std::size_t>(g)];
  Inbound& in = peer.in;
  in.stage = Inbound::Stage::header;
  const FrameHeader h = in.header;
  std::string text = in.sink == Inbound::Sink::heap && h.kind != FrameKind::data
                         ? std::string(reinterpret_cast<const char*>(in.heap.data.get()), in.heap.size)
                         : std::string();
  if (h.kind == FrameKind::abort || h.kind == FrameKind::size_error) {
    // The peer's reason, up to its first NUL (where what() would stop); a peer that gives none
    // is named instead, so that the failure still says who failed it and how.
    text.resize(std::min(text.find('\0'), text.size()));
    if (text.empty()) {
      int who = g;
      if (auto c = comms_.find(h.comm_id); c != comms_.end())
        if (auto r = c->second->rank_of.find(g); r != c->second->rank_of.end()) who = r->second;
      text = "rank " + std::to_string(who) +
             (h.kind == FrameKind::abort ? " aborted the communicator" : " refused a message (size mismatch)") +
             " without giving a reason";
    }
  }
  if (h.kind == FrameKind::data && (in.sink == Inbound::Sink::user || in.sink == Inbound::Sink::reduce)) {
    in.done->set(Completion::done);
    if (acked(h.channel, h.bytes)) send_control_locked(g, FrameKind::ack, h.comm_id, frame_key(g, h), {});
    ring();
  } else if (h.kind == FrameKind::data && in.sink == Inbound::Sink::heap) {
    CommState* c = frame_comm_locked(g, h.comm_id);
    const MatchKey k = frame_key(g, h);
    if (c == nullptr) {
      release_locked(g, in.charged);  // the communicator was left meanwhile
    } else if (auto it = c->posted.find(k); it == c->posted.end()) {
      if (auto old = c->unexpected.find(k); old != c->unexpected.end())
        release_locked(g, charge_of(old->second));  // a peer that repeats a message key
      c->unexpected.put(k, std::move(in.heap));
    } else {  // posted while the payload was arriving
      const PostedRecv recv = c->posted.take(it);
      release_locked(g, in.charged);
      match_buffered_locked(*c, h.comm_id, g, k, std::move(in.heap), recv);
    }
  } else if (h.kind == FrameKind::abort) {
    // Passed on to every other member before anything else this rank sends them: connections are
    // not ordered among themselves, so a rank that learned the error, then left, could otherwise
    // reach a third rank with its leave frame before the error does, and that rank would report
    // the departure instead of the first error. Each rank passes an abort on once at most.
    if (CommState* c = frame_comm_locked(g, h.comm_id))
      fail_comm_locked(*c, h.comm_id, Failure{Error(static_cast<ErrorCode>(h.code), text), h.seq}, true);
  } else if (h.kind == FrameKind::size_error) {
    fail_send_locked(h.comm_id, g, h, text);
  } else if (h.kind == FrameKind::ack) {
    auto it = awaiting_ack_.find({h.comm_id, g, h.channel, h.seq, h.index});
    if (it != awaiting_ack_.end()) {
      it->second->set(Completion::done);
      awaiting_ack_.erase(it);
      ring();
    }
  } else if (h.kind == FrameKind::leave) {
    if (CommState* c = frame_comm_locked(g, h.comm_id)) peer_left_locked(*c, h.comm_id, g);
  } else if (h.kind == FrameKind::notice) {
    if (CommState* c = frame_comm_locked(g, h.comm_id); c != nullptr && !c->failure)
      check_signature_locked(*c, h.comm_id, g, h.seq, h.signature);
  } else if (h.kind == FrameKind::goodbye) {
    peer.departed = true;
    for (auto& [id, state] : comms_)
      if (state->rank_of.count(g)) peer_left_locked(*state, id, g);
  }
  in.done = nullptr;
  in.heap = Bytes{};
  in.charged = 0;
  in.sink = Inbound::Sink::drain;
}

}  // namespace tutti::transport::tcp
