// Shared-secret authentication of connections (store and TCP transport): a mutual HMAC-SHA256
// challenge-response, so the secret never crosses the wire.
#pragma once

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace tutti::bootstrap {

/// A key both ends of one connection share after the handshake, and nobody else: derived from the
/// token and both nonces, so it is fresh for every connection.
using SessionKey = std::array<std::uint8_t, 32>;

/// HMAC(token, "tutti-session-1" || initiator's nonce || acceptor's nonce).
SessionKey derive_session_key(std::string_view token, std::string_view initiator_nonce,
                              std::string_view acceptor_nonce);

/// How a handshake ended: the reason decides what a client does next (retry, or give up and
/// say why).
enum class HandshakeFailure {
  none,         ///< it passed
  wrong_token,  ///< the peer's answer to our challenge does not match: it holds another token
  not_a_peer,   ///< the peer does not speak this protocol (bad magic, an echoed nonce)
  closed,       ///< the peer closed the connection (or an I/O error) before the handshake finished
  deadline,     ///< the deadline passed first
};

/// The handshake as a state machine without I/O of its own, so that one event loop can run many
/// at once (no thread per connection); the blocking handshake() below drives the same machine.
/// The caller sends every byte of output() (and clears what it sent), reads at most wanted()
/// bytes and feed()s them. The machine never asks for a byte past the end of the handshake, so
/// what follows on the connection stays in the socket for the caller.
class Handshaker {
 public:
  enum class State { running, passed, failed };

  /// Draws this side's nonce (Error(system) if the system has no randomness) and queues the hello.
  Handshaker(std::string token, bool initiator);

  /// Bytes to send to the peer; the caller erases what it sent.
  std::string& output() { return output_; }
  /// How many bytes the machine can take now: 0 once it passed or failed.
  std::size_t wanted() const;
  /// Consumes `size` <= wanted() received bytes; the new state.
  State feed(const void* data, std::size_t size);
  /// Ends the handshake as failed (the connection closed, the deadline passed).
  void fail(HandshakeFailure failure, std::string why);

  State state() const { return state_; }
  HandshakeFailure failure() const { return failure_; }
  /// Why it failed, for messages and logs.
  const std::string& why() const { return why_; }
  /// Bytes received so far (a connection that sent nothing is idle).
  std::size_t received() const { return received_; }
  /// The connection's session key; valid once passed.
  const SessionKey& session_key() const { return session_; }

 private:
  enum class Step { magic, nonce, answer, confirmation };
  State finish(HandshakeFailure failure, std::string why);

  std::string token_;
  bool initiator_;
  Step step_ = Step::magic;
  State state_ = State::running;
  HandshakeFailure failure_ = HandshakeFailure::none;
  std::string why_;
  std::string mine_, theirs_;  // the two nonces
  std::string input_;          // bytes of the current step received so far
  std::string output_;
  std::size_t received_ = 0;
  SessionKey session_{};
};

/// The outcome of run_handshake().
struct HandshakeResult {
  HandshakeFailure failure = HandshakeFailure::none;  ///< none: it passed
  std::string why;
  SessionKey session{};
  bool passed() const { return failure == HandshakeFailure::none; }
};

/// Runs the handshake on a connected, blocking-or-not socket `fd` until it ends or `deadline`.
/// Both sides must call it (or drive a Handshaker); `initiator` is true on the connecting side.
HandshakeResult run_handshake(int fd, const std::string& token, bool initiator,
                              std::chrono::steady_clock::time_point deadline);

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
