// What the TCP transport puts on a connection. After the handshake each side sends one Ident;
// from then on the stream is a sequence of frames, each an 80-byte FrameHeader followed by
// `bytes` bytes of payload. All fields are in the host's byte order (the ranks of a job share an
// architecture; the magic numbers catch a peer that does not).
//
// With a token (the default), every piece carries a 16-byte tag (frame_mac.hpp) under the
// connection's session key: Ident || tag, then per frame header || tag [|| payload || tag]
// (the payload's tag only when bytes > 0). A header is acted on only after its tag verified, and
// a frame's payload completes its receive only after the payload's tag verified. A compact frame
// (flags has frame_compact; payload at most max_compact_payload bytes) is header || payload || tag
// instead, one tag over both: its receiver reads the whole frame before it acts on any of it, and
// verifies that tag first. In insecure mode (TUTTI_INSECURE=1, no token) there are no tags and
// no compact frames.
//
// Kinds:
//   data        a message; (comm_id, channel, seq, index) and the connection's peer identify it;
//               `signature` is the sender's WireSignature for collectives (zero for point to point)
//   abort       the communicator comm_id failed: code = ErrorCode, seq = Failure::seq, payload = text
//   size_error  the receiver of message (comm_id, channel, seq, index) expected another size:
//               payload = the error text; the sender fails its send with it
//   ack         point to point, larger than eager_bytes: the receiver matched message (comm_id,
//               channel, seq, index) with a receive of the same size (the send completes then, as a
//               synchronous send; an eager one completed once written)
//   goodbye     orderly shutdown: the connection's end that follows is not a failure
//   leave       this rank left communicator comm_id (destroyed its transport): operations that
//               wait for it there fail at once
//   notice      collective: `signature` is the sender's for call `seq` of comm_id, which the
//               receiver compares with its own and then drops (no payload, nothing kept)
#pragma once

#include <cstdint>
#include <type_traits>

#include "transport/transport.hpp"

namespace tutti::transport::tcp {

inline constexpr std::uint32_t frame_magic = 0x46545554;  // "TUTF"
inline constexpr std::uint32_t ident_magic = 0x49545554;  // "TUTI"
/// Largest payload of a control frame (abort and size_error texts); more is a corrupt stream.
inline constexpr std::uint64_t max_control_payload = 64 * 1024;

/// Largest payload of a data frame: no allocation or buffer comes near it; more is a corrupt stream.
inline constexpr std::uint64_t max_data_payload = std::uint64_t{1} << 48;

/// FrameHeader::flags: one tag after the payload covers header and payload (tagged connections only).
inline constexpr std::uint16_t frame_compact = 1;
/// Largest payload a sender puts in a compact frame; a compact frame claiming more is a corrupt stream.
inline constexpr std::uint64_t max_compact_payload = 1024;
/// A point-to-point data frame of at most this many payload bytes is eager: complete for its
/// sender once written to the socket, never acked (OpenMPI's TCP eager limit). A receive of
/// another size fails and aborts the communicator, which the sender meets at its next call.
/// Larger messages complete when their receiver acks the match, as a synchronous send.
inline constexpr std::uint64_t eager_bytes = 64 * 1024;
inline constexpr bool acked(std::uint8_t channel, std::uint64_t bytes) {
  return channel == static_cast<std::uint8_t>(Channel::point_to_point) && bytes > eager_bytes;
}

enum class FrameKind : std::uint8_t {
  data = 1,
  abort = 2,
  size_error = 3,
  ack = 4,
  goodbye = 5,
  leave = 6,
  notice = 7
};

struct FrameHeader {
  std::uint32_t magic = frame_magic;
  FrameKind kind = FrameKind::data;
  std::uint8_t channel = 0;  // transport::Channel
  std::uint16_t flags = 0;   // frame_compact, or 0
  std::uint32_t index = 0;
  std::uint32_t code = 0;  // abort: ErrorCode
  std::uint64_t comm_id = 0;
  std::uint64_t seq = 0;
  std::uint64_t bytes = 0;  // payload bytes that follow
  WireSignature signature;
};
static_assert(sizeof(WireSignature) == 40);
static_assert(sizeof(FrameHeader) == 80);
static_assert(std::is_trivially_copyable_v<FrameHeader>);

/// Sent by both ends of a new connection after the handshake: who is calling, for which job.
struct Ident {
  std::uint32_t magic = ident_magic;
  std::int32_t rank = -1;
  std::int32_t size = 0;
  std::uint32_t reserved = 0;
  std::uint64_t comm_id = 0;
};
static_assert(sizeof(Ident) == 24);

}  // namespace tutti::transport::tcp
