// Per-frame authentication of a connection (the TCP transport, the tcp:// store): AES-256-GCM used as a MAC (GMAC; the
// bytes are authenticated, not encrypted) under the connection's session key from bootstrap::handshake. The 96-bit
// nonce is (direction, part, frame counter): each direction of a connection counts its frames from 0, so a frame that
// is replayed, reordered, dropped or reflected back to its sender fails its tag, and no nonce is ever used twice under
// one key.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>

#include "bootstrap/auth.hpp"

struct evp_cipher_ctx_st;
struct gcm128_context;

namespace tutti::bootstrap {

inline constexpr std::size_t tag_size = 16;
using Tag = std::array<std::uint8_t, tag_size>;

class FrameMac {
 public:
  /// What a tag covers: a TCP frame's header, its payload, the Ident sent after the handshake,
  /// a whole store frame, or a compact TCP frame's header and payload together.
  enum class Part : std::uint8_t { header = 0, payload = 1, ident = 2, store = 3, compact = 4 };

  /// Tags of the direction whose sender was the connection's initiator (`from_initiator`) or its
  /// acceptor. Throws Error(system) if libcrypto cannot set up the cipher.
  FrameMac(const SessionKey& key, bool from_initiator);
  ~FrameMac();
  FrameMac(const FrameMac&) = delete;
  FrameMac& operator=(const FrameMac&) = delete;

  /// Incremental use: begin, update any number of times (any sizes), finish.
  void begin(std::uint64_t counter, Part part);
  void update(const void* data, std::size_t bytes);
  Tag finish();

  Tag tag(std::uint64_t counter, Part part, const void* data, std::size_t bytes) {
    begin(counter, part);
    update(data, bytes);
    return finish();
  }

  /// Constant-time comparison.
  static bool same(const Tag& a, const Tag& b);

 private:
  // The tags are AES-256-GCM's over the bytes as associated data, computed with OpenSSL's GCM
  // (CRYPTO_gcm128_*, GHASH with carry-less multiplication) around one AES block per tag from an
  // ECB context keyed once (AES-NI): the same tags as EVP's AES-256-GCM, without EVP's
  // re-initialisation per nonce (about 2,400 instructions a tag, against a few hundred).
  evp_cipher_ctx_st* block_ = nullptr;  // AES-256-ECB under the key, no padding
  gcm128_context* gcm_ = nullptr;
  std::uint8_t direction_;
};

}  // namespace tutti::bootstrap
