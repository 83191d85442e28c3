// The TCP store's wire protocol, after the handshake. Every message is a frame:
//   u32 body length | body                                    (integers big-endian)
// Request body:  u32 id | u8 op | u32 key length | key | payload
//   op 'S' (set): payload = value     'G' (get): none     'A' (add): payload = i64 delta
// Reply body:    u32 id | u8 status | payload
//   status 'O': payload = nothing (set), value (get), i64 new value (add)
//   status 'E': payload = error message
// A get whose key is absent is answered when some client sets it, so replies may come out of
// request order; the id pairs them up (one connection may carry requests of several threads).
// With a token (the default), every frame is followed by a 16-byte tag (frame_mac.hpp, part
// `store`) over the whole frame under the connection's session key, numbered per direction, so
// that nobody on the path can inject, alter, replay or drop a request or a reply unnoticed.
#pragma once

#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <string>

#include "bootstrap/frame_mac.hpp"

namespace tutti::bootstrap::detail {

/// Frames larger than this are a protocol error (the peer is closed): no store value is this big.
constexpr std::uint32_t max_store_frame = 64u << 20;

struct StoreMessage {
  std::uint32_t id = 0;
  char kind = 0;        ///< op of a request ('S', 'G', 'A') or status of a reply ('O', 'E')
  std::string key;      ///< requests only
  std::string payload;  ///< value, 8-byte integer or error message
};

inline void put_u32(std::string& out, std::uint32_t value) {
  for (int shift = 24; shift >= 0; shift -= 8) out.push_back(static_cast<char>(value >> shift));
}

inline std::uint32_t get_u32(const char* in) {
  std::uint32_t value = 0;
  for (int i = 0; i < 4; ++i) value = (value << 8) | static_cast<unsigned char>(in[i]);
  return value;
}

inline std::string encode_i64(std::int64_t value) {
  std::string out;
  const auto bits = static_cast<std::uint64_t>(value);
  put_u32(out, static_cast<std::uint32_t>(bits >> 32));
  put_u32(out, static_cast<std::uint32_t>(bits));
  return out;
}

inline std::optional<std::int64_t> decode_i64(const std::string& in) {
  if (in.size() != 8) return std::nullopt;
  const std::uint64_t bits = (std::uint64_t{get_u32(in.data())} << 32) | get_u32(in.data() + 4);
  return static_cast<std::int64_t>(bits);
}

/// One framed message; `with_key` for requests.
inline std::string encode_message(const StoreMessage& message, bool with_key) {
  std::string body;
  put_u32(body, message.id);
  body.push_back(message.kind);
  if (with_key) {
    put_u32(body, static_cast<std::uint32_t>(message.key.size()));
    body += message.key;
  }
  body += message.payload;
  std::string frame;
  put_u32(frame, static_cast<std::uint32_t>(body.size()));
  return frame + body;
}

/// The tags of one direction of a store connection: `mac` is null without a token (insecure mode),
/// then frames carry no tag.
struct StoreSeal {
  std::unique_ptr<FrameMac> mac;
  std::uint64_t count = 0;  // frames tagged (or checked) so far in this direction

  StoreSeal() = default;
  StoreSeal(const SessionKey& key, bool from_initiator) : mac(std::make_unique<FrameMac>(key, from_initiator)) {}
  std::size_t tag_bytes() const { return mac ? tag_size : 0; }
};

/// Appends the next tag of `seal`'s direction to `frame` (one whole frame).
inline void seal_frame(std::string& frame, StoreSeal& seal) {
  if (!seal.mac) return;
  const Tag tag = seal.mac->tag(seal.count++, FrameMac::Part::store, frame.data(), frame.size());
  frame.append(reinterpret_cast<const char*>(tag.data()), tag.size());
}

enum class FrameStatus { complete, incomplete, malformed, forged };

/// Takes the first whole frame off the front of `buffer` into *message, checking its tag when
/// `seal` has a MAC. `incomplete` leaves the buffer as it is; `malformed` and `forged` (the tag
/// does not verify) mean the connection cannot be trusted any more.
inline FrameStatus take_message(std::string& buffer, bool with_key, StoreMessage* message, StoreSeal* seal = nullptr) {
  if (buffer.size() < 4) return FrameStatus::incomplete;
  const std::uint32_t size = get_u32(buffer.data());
  if (size > max_store_frame || size < 5) return FrameStatus::malformed;
  const std::size_t tag_bytes = seal != nullptr ? seal->tag_bytes() : 0;
  if (buffer.size() < 4 + std::size_t{size} + tag_bytes) return FrameStatus::incomplete;
  if (tag_bytes > 0) {
    Tag tag{};
    std::memcpy(tag.data(), buffer.data() + 4 + size, tag.size());
    if (!FrameMac::same(tag, seal->mac->tag(seal->count, FrameMac::Part::store, buffer.data(), 4 + std::size_t{size})))
      return FrameStatus::forged;
    ++seal->count;
  }
  const char* body = buffer.data() + 4;
  message->id = get_u32(body);
  message->kind = body[4];
  std::size_t used = 5;
  message->key.clear();
  if (with_key) {
    if (size < used + 4) return FrameStatus::malformed;
    const std::uint32_t key_size = get_u32(body + used);
    used += 4;
    if (key_size > size - used) return FrameStatus::malformed;
    message->key.assign(body + used, key_size);
    used += key_size;
  }
  message->payload.assign(body + used, size - used);
  buffer.erase(0, 4 + std::size_t{size} + tag_bytes);
  return FrameStatus::complete;
}

}  // namespace tutti::bootstrap::detail
