// The connection handshake. Wire format, the same in both directions, both sides sending at once:
//   hello:        "TUT2" (4 bytes, so a stray client is told apart at once) + 32-byte random nonce
//   answer:       HMAC-SHA256(token, peer's nonce || role byte)   (32 bytes)
//   confirmation: 'K' (1 byte), sent once the peer's answer verified
// The role byte is 'I' in the initiator's answer and 'A' in the acceptor's, so an answer obtained
// by reflecting a nonce back to its owner (or over a second connection) never verifies. The
// confirmation proves nothing (anyone can send a 'K'); it tells a side that the peer accepted it
// too, so a client whose server dropped it half-way (busy, flooded) knows to try again instead of
// believing it is in. One implementation: the blocking handshake() drives the Handshaker that
// event loops use.
#include <sys/random.h>

#include <array>
#include <cerrno>
#include <cstring>
#include <mutex>
#include <stdexcept>

#include "bootstrap/auth.hpp"
#include "bootstrap/crypto.hpp"
#include "bootstrap/socket_io.hpp"
#include "core/env.hpp"
#include "core/log.hpp"
#include "tutti/types.hpp"

namespace tutti::bootstrap {
namespace {

constexpr char magic[4] = {'T', 'U', 'T', '2'};
constexpr std::size_t nonce_size = 32;
constexpr char confirmation = 'K';
using Nonce = std::array<std::uint8_t, nonce_size>;

void fill_random(std::uint8_t* out, std::size_t size) {
  while (size > 0) {
    const ssize_t got = ::getrandom(out, size, 0);
    if (got < 0) {
      if (errno == EINTR) continue;
      throw Error(ErrorCode::system, "getrandom: " + detail::errno_text(errno));
    }
    out += got;
    size -= static_cast<std::size_t>(got);
  }
}

Digest answer_for(const std::string& token, std::string_view nonce, char role) {
  std::string message(nonce);
  message.push_back(role);
  return hmac_sha256(token, message);
}

std::size_t step_size(int step) {
  static constexpr std::size_t sizes[] = {sizeof(magic), nonce_size, 32, 1};
  return sizes[step];
}

}  // namespace

SessionKey derive_session_key(std::string_view token, std::string_view initiator_nonce,
                              std::string_view acceptor_nonce) {
  std::string message = "tutti-session-1";
  message.append(initiator_nonce);
  message.append(acceptor_nonce);
  return hmac_sha256(token, message);
}

Handshaker::Handshaker(std::string token, bool initiator) : token_(std::move(token)), initiator_(initiator) {
  Nonce nonce{};
  fill_random(nonce.data(), nonce.size());
  mine_.assign(reinterpret_cast<const char*>(nonce.data()), nonce.size());
  output_.assign(magic, sizeof(magic));
  output_ += mine_;
}

std::size_t Handshaker::wanted() const {
  return state_ == State::running ? step_size(static_cast<int>(step_)) - input_.size() : 0;
}

Handshaker::State Handshaker::finish(HandshakeFailure failure, std::string why) {
  state_ = State::failed;
  failure_ = failure;
  why_ = std::move(why);
  return state_;
}

void Handshaker::fail(HandshakeFailure failure, std::string why) {
  if (state_ == State::running) finish(failure, std::move(why));
}

Handshaker::State Handshaker::feed(const void* data, std::size_t size) {
  if (state_ != State::running) return state_;
  if (size > wanted()) throw std::logic_error("Handshaker::feed: more bytes than wanted()");
  received_ += size;
  input_.append(static_cast<const char*>(data), size);
  if (input_.size() < step_size(static_cast<int>(step_))) return state_;
  const char my_role = initiator_ ? 'I' : 'A';
  const char peer_role = initiator_ ? 'A' : 'I';
  switch (step_) {
    case Step::magic:
      if (std::memcmp(input_.data(), magic, sizeof(magic)) != 0)
        return finish(HandshakeFailure::not_a_peer, "peer is not a Tutti peer of this version (bad magic)");
      step_ = Step::nonce;
      break;
    case Step::nonce: {
      if (input_ == mine_) return finish(HandshakeFailure::not_a_peer, "peer echoed our nonce");
      theirs_ = input_;
      const Digest answer = answer_for(token_, theirs_, my_role);
      output_.append(reinterpret_cast<const char*>(answer.data()), answer.size());
      step_ = Step::answer;
      break;
    }
    case Step::answer: {
      const Digest expected = answer_for(token_, mine_, peer_role);
      if (!same_bytes(input_.data(), expected.data(), expected.size()))
        return finish(HandshakeFailure::wrong_token, "wrong token (the peer's answer does not match)");
      session_ = initiator_ ? derive_session_key(token_, mine_, theirs_) : derive_session_key(token_, theirs_, mine_);
      output_.push_back(confirmation);
      step_ = Step::confirmation;
      break;
    }
    case Step::confirmation:
      if (input_[0] != confirmation)
        return finish(HandshakeFailure::not_a_peer, "peer is not a Tutti peer of this version (bad confirmation)");
      state_ = State::passed;
      break;
  }
  input_.clear();
  return state_;
}

HandshakeResult run_handshake(int fd, const std::string& token, bool initiator,
                              std::chrono::steady_clock::time_point deadline) {
  Handshaker machine(token, initiator);
  std::string reason;
  const auto io_failed = [&](const char* doing) {
    const bool late = detail::Clock::now() >= deadline;
    machine.fail(late ? HandshakeFailure::deadline : HandshakeFailure::closed, std::string(doing) + ": " + reason);
  };
  char buffer[64];
  while (machine.state() != Handshaker::State::failed) {
    std::string& out = machine.output();
    if (!out.empty()) {
      if (!detail::send_all(fd, out.data(), out.size(), deadline, &reason)) {
        io_failed("sending");
        break;
      }
      out.clear();
    }
    if (machine.state() == Handshaker::State::passed) break;
    const std::size_t hello_size = step_size(0) + step_size(1), answer_end = hello_size + step_size(2);
    const char* what = machine.received() < hello_size   ? "receiving the peer's hello"
                       : machine.received() < answer_end ? "receiving the peer's answer"
                                                         : "receiving the peer's confirmation";
    const std::size_t want = machine.wanted();
    if (!detail::recv_all(fd, buffer, want, deadline, &reason)) {
      io_failed(what);
      break;
    }
    machine.feed(buffer, want);
  }
  HandshakeResult result;
  result.failure = machine.failure();
  result.why = machine.why();
  if (result.passed()) result.session = machine.session_key();
  return result;
}

bool handshake(int fd, const std::string& token, bool initiator, std::chrono::steady_clock::time_point deadline,
               std::string* why, SessionKey* session) {
  HandshakeResult result = run_handshake(fd, token, initiator, deadline);
  if (!result.passed()) {
    if (why != nullptr) *why = std::move(result.why);
    return false;
  }
  if (session != nullptr) *session = result.session;
  return true;
}

void require_token(const std::string& token, std::string_view what, int rank) {
  if (!token.empty()) return;
  const auto insecure = core::env("TUTTI_INSECURE");
  if (insecure && *insecure == "1") {
    static std::once_flag warned;
    std::call_once(warned, [&] {
      core::log(core::LogLevel::warn, rank,
                "TUTTI_INSECURE=1: " + std::string(what) +
                    " runs WITHOUT authentication; anyone who can reach its ports can read and write the "
                    "job's data and join it as a rank");
    });
    return;
  }
  throw Error(ErrorCode::invalid_argument,
              std::string(what) +
                  " needs a shared secret and TUTTI_TOKEN is not set: give every rank the same "
                  "TUTTI_TOKEN (make one with `openssl rand -hex 32` or `head -c 32 /dev/urandom | xxd -p -c 64`), "
                  "or set TUTTI_INSECURE=1 to run without authentication (tutti-run sets a token itself)");
}

std::string random_hex(std::size_t bytes) {
  static constexpr char digits[] = "0123456789abcdef";
  std::string raw(bytes, '\0');
  fill_random(reinterpret_cast<std::uint8_t*>(raw.data()), raw.size());
  std::string text;
  text.reserve(2 * bytes);
  for (const char c : raw) {
    const auto byte = static_cast<unsigned char>(c);
    text.push_back(digits[byte >> 4]);
    text.push_back(digits[byte & 0xf]);
  }
  return text;
}

}  // namespace tutti::bootstrap
