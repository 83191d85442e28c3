// The reading side of the hub's I/O: nonblocking reads of a peer's stream into the read-ahead
// buffer or straight into the current frame's sink, headers and payloads checked against their
// tags, within a budget per wake-up. What a frame means is decided in hub_frames.cpp.
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "bootstrap/socket_io.hpp"
#include "reduce/reduce.hpp"
#include "transport/tcp/hub.hpp"

namespace tutti::transport::tcp {

namespace {

constexpr std::size_t direct_read = 64 * 1024;  // payload left at least this: recv() straight into the sink
constexpr std::size_t read_budget = 8 << 20;    // per wake-up and peer, so that one peer cannot starve the others

// Moves read-ahead bytes of the current payload into its sink, feeding them to the payload's tag
// first. False when none could move: a receive-and-reduce combines whole elements only, and the
// rest of a split one is not here yet.
bool consume_buffered(Inbound& in, FrameMac* mac, std::size_t& budget) {
  std::size_t take = std::min(in.end - in.begin, in.remaining);
  if (in.sink == Inbound::Sink::reduce) {
    const std::size_t elem = size_of(in.type);
    take -= take % elem;
    if (take == 0) return false;
  }
  const std::byte* incoming = in.buffer.get() + in.begin;
  if (mac != nullptr) mac->update(incoming, take);
  if (in.sink == Inbound::Sink::reduce) {
    reduce::apply(in.op, in.type, in.target, in.operand, incoming, take / size_of(in.type));
    in.operand += take;
    in.target += take;
  } else if (in.sink != Inbound::Sink::drain) {
    std::memcpy(in.target, incoming, take);
    in.target += take;
  }
  in.begin += take;
  in.remaining -= take;
  budget -= std::min(budget, take);
  return true;
}

}  // namespace

// Reads what the socket holds into the read-ahead buffer, up to `upto` bytes buffered in all.
bool Hub::fill_locked(int g, std::size_t upto) {
  Peer& peer = peers_[static_cast<std::size_t>(g)];
  Inbound& in = peer.in;
  if (in.drained) return false;
  if (in.begin == in.end) {
    in.begin = in.end = 0;
  } else if (in.begin > 0) {
    std::memmove(in.buffer.get(), in.buffer.get() + in.begin, in.end - in.begin);
    in.end -= in.begin;
    in.begin = 0;
  }
  for (;;) {
    const std::size_t room = (upto > in.end && upto < Inbound::read_ahead ? upto : Inbound::read_ahead) - in.end;
    const ssize_t got = ::recv(peer.fd, in.buffer.get() + in.end, room, 0);
    if (got > 0) {
      in.end += static_cast<std::size_t>(got);
      in.drained = static_cast<std::size_t>(got) < room;
      return true;
    }
    if (got < 0 && errno == EINTR) continue;
    if (got < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return false;
    peer_lost_locked(g, got == 0 ? "end of stream" : bootstrap::detail::errno_text(errno));
    return false;
  }
}

// Takes the next header (and its tag) out of the read-ahead buffer when it is all there. False
// when more bytes must arrive first, or the connection was dropped.
bool Hub::header_ready_locked(int g) {
  Peer& peer = peers_[static_cast<std::size_t>(g)];
  Inbound& in = peer.in;
  if (in.end - in.begin < sizeof(FrameHeader)) return false;
  std::memcpy(&in.header, in.buffer.get() + in.begin, sizeof(FrameHeader));
  in.compact = (in.header.flags & frame_compact) != 0;
  if (in.compact) return compact_ready_locked(g);
  const std::size_t wire = sizeof(FrameHeader) + (peer.receive_mac ? tag_size : 0);
  if (in.end - in.begin < wire) return false;
  in.number = peer.frames_received++;
  if (peer.receive_mac) {
    Tag tag;
    std::memcpy(tag.data(), in.buffer.get() + in.begin + sizeof(FrameHeader), tag_size);
    if (!FrameMac::same(tag,
                        peer.receive_mac->tag(in.number, FrameMac::Part::header, &in.header, sizeof(FrameHeader)))) {
      drop_peer_locked(g, "a frame header failed authentication", "frame from rank ",
                       " failed authentication (forged, replayed or altered on the way); its connection is closed");
      return false;
    }
  }
  in.begin += wire;
  return true;
}

// A compact frame (wire.hpp): nothing of it is acted on, not even its length beyond the bound,
// until all of it is here and its one tag verified. Then its tag is cut out of the read-ahead
// bytes, so that the header and payload are read on as a frame of an untagged stream's.
bool Hub::compact_ready_locked(int g) {
  Peer& peer = peers_[static_cast<std::size_t>(g)];
  Inbound& in = peer.in;
  const FrameHeader& h = in.header;
  if (!peer.receive_mac || h.bytes > max_compact_payload) {
    drop_peer_locked(g, "malformed frame (compact)", "rank ",
                     " sent a malformed frame (compact " +
                         std::string(peer.receive_mac ? "with a payload over the bound" : "on an untagged connection") +
                         "); its connection is closed");
    return false;
  }
  const std::size_t covered = sizeof(FrameHeader) + h.bytes;
  if (in.end - in.begin < covered + tag_size) return false;
  std::byte* frame = in.buffer.get() + in.begin;
  in.number = peer.frames_received++;
  FrameMac& mac = *peer.receive_mac;
  mac.begin(in.number, FrameMac::Part::compact);
  mac.update(frame, covered);
  Tag tag;
  std::memcpy(tag.data(), frame + covered, tag_size);
  if (!FrameMac::same(tag, mac.finish())) {
    drop_peer_locked(g, "a frame failed authentication", "frame from rank ",
                     " failed authentication (forged, replayed or altered on the way); its connection is closed");
    return false;
  }
  std::memmove(frame + tag_size, frame, covered);
  in.begin += tag_size + sizeof(FrameHeader);
  return true;
}

// The payload is all here: with tags, its own tag must verify before the frame completes (a
// compact frame's verified before it started).
void Hub::payload_done_locked(int g) {
  Peer& peer = peers_[static_cast<std::size_t>(g)];
  if (peer.receive_mac && !peer.in.compact) {
    peer.in.stage = Inbound::Stage::trailer;
    return;
  }
  finish_frame_locked(g);
}

void Hub::read_peer_locked(int g) {
  Peer& peer = peers_[static_cast<std::size_t>(g)];
  if (peer.reading) return;
  peer.reading = true;
  try {
    read_frames_locked(g);
  } catch (...) {
    peer.reading = false;
    throw;
  }
  peer.reading = false;
  if (peer.write_failed && !peer.closed) peer_lost_locked(g, peer.write_error);
}

void Hub::read_frames_locked(int g) {
  Peer& peer = peers_[static_cast<std::size_t>(g)];
  Inbound& in = peer.in;
  std::size_t budget = read_budget;
  // Bytes already read ahead raise no epoll event: a peer whose budget runs out is read again
  // on the next round of the I/O loop, whether or not its socket has more.
  peer.more = false;
  in.drained = false;
  while (!peer.closed) {
    if (budget == 0) {
      peer.more = true;
      return;
    }
    const std::size_t tags = peer.receive_mac ? tag_size : 0;
    if (in.stage == Inbound::Stage::header) {
      if (header_ready_locked(g)) {
        in.large = in.header.bytes >= direct_read;
        if (!start_frame_locked(g)) return;
      } else if (peer.closed || !fill_locked(g, in.large ? sizeof(FrameHeader) + tags : Inbound::read_ahead)) {
        return;
      }
      continue;
    }
    if (in.stage == Inbound::Stage::trailer) {
      if (in.end - in.begin < tag_size) {
        if (!fill_locked(g, in.large ? tag_size : Inbound::read_ahead)) return;
        continue;
      }
      Tag tag;
      std::memcpy(tag.data(), in.buffer.get() + in.begin, tag_size);
      in.begin += tag_size;
      if (!FrameMac::same(tag, peer.receive_mac->finish())) {
        drop_peer_locked(g, "a frame's payload failed authentication", "frame from rank ",
                         " failed authentication (forged, replayed or altered on the way); its connection is closed");
        return;
      }
      finish_frame_locked(g);
      continue;
    }
    FrameMac* const mac = in.compact ? nullptr : peer.receive_mac.get();  // (a compact frame verified)
    const std::size_t buffered = in.end - in.begin;
    if (buffered > 0 && consume_buffered(in, mac, budget)) {
      // moved what was read ahead
    } else if (buffered == 0 && in.remaining >= direct_read &&
               (in.sink == Inbound::Sink::user || in.sink == Inbound::Sink::heap)) {
      if (in.drained) return;
      const std::size_t wanted = std::min(in.remaining, budget);
      const ssize_t got = ::recv(peer.fd, in.target, wanted, 0);
      if (got <= 0) {
        if (got < 0 && errno == EINTR) continue;
        if (got < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
        peer_lost_locked(g, got == 0 ? "end of stream" : bootstrap::detail::errno_text(errno));
        return;
      }
      in.drained = static_cast<std::size_t>(got) < wanted;
      if (mac != nullptr) mac->update(in.target, static_cast<std::size_t>(got));
      in.target += got;
      in.remaining -= static_cast<std::size_t>(got);
      budget -= std::min(budget, static_cast<std::size_t>(got));
    } else if (!fill_locked(g, in.large ? in.remaining + tags : Inbound::read_ahead)) {
      return;
    }
    if (in.remaining == 0) payload_done_locked(g);
  }
}

}  // namespace tutti::transport::tcp
