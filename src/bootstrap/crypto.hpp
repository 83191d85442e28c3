// What Tutti takes from libcrypto besides the frame tags (frame_mac.hpp): SHA-256, HMAC-SHA256
// for the token handshake and the shared segments' names, and a constant-time comparison.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string_view>

namespace tutti::bootstrap {

using Digest = std::array<std::uint8_t, 32>;

/// SHA-256 (FIPS 180-4) of `data`. Throws Error(system) naming the libcrypto call that failed.
Digest sha256(std::string_view data);

/// HMAC-SHA256 (RFC 2104) of `message` under `key` (any length, empty included). Throws
/// Error(system) naming the libcrypto call that failed.
Digest hmac_sha256(std::string_view key, std::string_view message);

/// Whether the `size` bytes at `a` and `b` are equal, in a time that does not depend on where
/// they differ (so a secret cannot be found byte by byte from response timing).
bool same_bytes(const void* a, const void* b, std::size_t size);

/// Throws Error(system) naming the libcrypto `call` that failed, with libcrypto's reason when it
/// gave one (and clears its error queue).
[[noreturn]] void crypto_failure(const char* call);

}  // namespace tutti::bootstrap
