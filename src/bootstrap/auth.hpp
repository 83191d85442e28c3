// Shared-secret authentication of connections (store and TCP transport): a mutual HMAC-SHA256
// challenge-response, so the secret never crosses the wire.
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>

namespace tutti::bootstrap {

std::array<std::uint8_t, 32> sha256(std::string_view data);
std::array<std::uint8_t, 32> hmac_sha256(std::string_view key, std::string_view message);

/// Runs the handshake on a connected, blocking-or-not socket `fd`: each side sends a random
/// nonce and answers the other's with HMAC(token, nonce || role). Returns true when the peer
/// proved it knows `token`; false (with the reason in *why) when it did not or the deadline
/// passed. Both sides must call it; `initiator` is true on the connecting side.
bool handshake(int fd, const std::string& token, bool initiator, std::chrono::steady_clock::time_point deadline,
               std::string* why = nullptr);

/// 32 random bytes as 64 hex digits (for tokens and job ids).
std::string random_hex(std::size_t bytes = 32);

}  // namespace tutti::bootstrap
