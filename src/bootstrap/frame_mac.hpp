// Per-frame authentication of a connection (the TCP transport, the tcp:// store): AES-256-GCM used as a MAC (GMAC; the
// bytes are authenticated, not encrypted) under the connection's session key from bootstrap::handshake. The 96-bit
// nonce is (direction, part, frame counter): each direction of a connection counts its frames from 0, so a frame that
// is replayed, reordered, dropped or reflected back to its sender fails its tag, and no nonce is ever used twice under
// one key.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>

#include "bootstrap/auth.hpp"
#include "bootstrap/ghash.hpp"

struct evp_cipher_ctx_st;
struct gcm128_context;

namespace tutti::bootstrap {

inline constexpr std::size_t tag_size = 16;
using Tag = std::array<std::uint8_t, tag_size>;

class FrameMac {
 public:
  /// Who computes GHASH: ghash.hpp's vector code where the CPU has it, else OpenSSL's GCM
  /// (`fastest`); or OpenSSL's GCM always. Both give the same tags.
  enum class Engine : std::uint8_t { fastest, openssl };
  /// Whether `fastest` is the vector code on this CPU.
  static bool vector_available();

  /// What a tag covers: a TCP frame's header, its payload, the Ident sent after the handshake,
  /// a whole store frame, or a compact TCP frame's header and payload together.
  enum class Part : std::uint8_t { header = 0, payload = 1, ident = 2, store = 3, compact = 4 };

  /// Tags of the direction whose sender was the connection's initiator (`from_initiator`) or its
  /// acceptor. Throws Error(system) if libcrypto cannot set up the cipher.
  FrameMac(const SessionKey& key, bool from_initiator, Engine engine = Engine::fastest);
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
  // The tags are AES-256-GCM's over the bytes as associated data: E(K, J0) xor GHASH(bytes, zero
  // padding, their length in bits), J0 the nonce and the counter 1. GHASH is ghash.hpp's where the
  // CPU runs it, else OpenSSL's GCM (CRYPTO_gcm128_*, one block per carry-less multiplication).
  // Either way one AES block per tag goes through an ECB context keyed once (AES-NI): the same
  // tags as EVP's AES-256-GCM, without EVP's re-initialisation per nonce (about 2,400
  // instructions a tag, against a few hundred).
  void nonce(std::uint64_t counter, Part part, std::uint8_t out[12]) const;
  void vector_update(const std::uint8_t* data, std::size_t bytes);

  evp_cipher_ctx_st* block_ = nullptr;  // AES-256-ECB under the key, no padding
  gcm128_context* gcm_ = nullptr;       // OpenSSL's GCM, where the vector code does not serve
  std::uint8_t direction_;
  // The vector code's state: the prepared hash key, the running hash, E(K, J0), the bytes of a
  // block not yet whole, and how many bytes this tag has covered.
  struct Vector {
    ghash::Key key;
    ghash::State hash;
    std::uint8_t pad[ghash::block];
    std::uint8_t partial[ghash::block];
    std::size_t buffered = 0;
    std::uint64_t bytes = 0;
  };
  std::unique_ptr<Vector> vector_;
};

}  // namespace tutti::bootstrap
