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

/// A key both ends of one connection share after the handshake, and nobody else: derived from the
/// token and both nonces, so it is fresh for every connection.
using SessionKey = std::array<std::uint8_t, 32>;

/// HMAC(token, "tutti-session-1" || initiator's nonce || acceptor's nonce).
SessionKey derive_session_key(std::string_view token, std::string_view initiator_nonce,
                              std::string_view acceptor_nonce);

/// Runs the handshake on a connected, blocking-or-not socket `fd`: each side sends a random
/// nonce and answers the other's with HMAC(token, nonce || role). Returns true when the peer
/// proved it knows `token`; false (with the reason in *why) when it did not or the deadline
/// passed. Both sides must call it; `initiator` is true on the connecting side. On success
/// *session (when given) receives the connection's session key.
bool handshake(int fd, const std::string& token, bool initiator, std::chrono::steady_clock::time_point deadline,
               std::string* why = nullptr, SessionKey* session = nullptr);

/// The token policy of everything that crosses a socket (a tcp:// store, its server, the TCP
/// transport): a non-empty token passes. An empty one throws Error(invalid_argument) that names
/// TUTTI_TOKEN and how to make one, unless TUTTI_INSECURE=1, when it logs a warning (once per
/// process, on every rank) and passes. `what` names the user ("the TCP transport").
void require_token(const std::string& token, std::string_view what, int rank = -1);

/// 32 random bytes as 64 hex digits (for tokens and job ids).
std::string random_hex(std::size_t bytes = 32);

}  // namespace tutti::bootstrap
