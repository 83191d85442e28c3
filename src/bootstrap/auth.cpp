// The connection handshake. Wire format, the same in both directions, both sides sending at once:
//   hello:  "TUT1" (4 bytes, so a stray client is told apart at once) + 32-byte random nonce
//   answer: HMAC-SHA256(token, peer's nonce || role byte)   (32 bytes)
// The role byte is 'I' in the initiator's answer and 'A' in the acceptor's, so an answer obtained
// by reflecting a nonce back to its owner (or over a second connection) never verifies.
#include <sys/random.h>

#include <array>
#include <cerrno>
#include <cstring>
#include <mutex>
#include <stdexcept>

#include "bootstrap/auth.hpp"
#include "bootstrap/socket_io.hpp"
#include "core/env.hpp"
#include "core/log.hpp"
#include "tutti/types.hpp"

namespace tutti::bootstrap {
namespace {

constexpr char magic[4] = {'T', 'U', 'T', '1'};
constexpr std::size_t nonce_size = 32;
using Nonce = std::array<std::uint8_t, nonce_size>;
using Digest = std::array<std::uint8_t, 32>;

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

Digest answer_for(const std::string& token, const Nonce& nonce, char role) {
  std::string message(reinterpret_cast<const char*>(nonce.data()), nonce.size());
  message.push_back(role);
  return hmac_sha256(token, message);
}

// Constant time, so the answer cannot be found byte by byte from response timing.
bool same_digest(const Digest& a, const Digest& b) {
  std::uint8_t difference = 0;
  for (std::size_t i = 0; i < a.size(); ++i) difference |= static_cast<std::uint8_t>(a[i] ^ b[i]);
  return difference == 0;
}

bool fail(std::string* why, const std::string& reason) {
  if (why != nullptr) *why = reason;
  return false;
}

}  // namespace

SessionKey derive_session_key(std::string_view token, std::string_view initiator_nonce,
                              std::string_view acceptor_nonce) {
  std::string message = "tutti-session-1";
  message.append(initiator_nonce);
  message.append(acceptor_nonce);
  return hmac_sha256(token, message);
}

bool handshake(int fd, const std::string& token, bool initiator, std::chrono::steady_clock::time_point deadline,
               std::string* why, SessionKey* session) {
  std::string reason;
  Nonce mine{};
  fill_random(mine.data(), mine.size());
  std::array<std::uint8_t, sizeof(magic) + nonce_size> hello{};
  std::memcpy(hello.data(), magic, sizeof(magic));
  std::memcpy(hello.data() + sizeof(magic), mine.data(), mine.size());
  if (!detail::send_all(fd, hello.data(), hello.size(), deadline, &reason))
    return fail(why, "sending hello: " + reason);

  char peer_magic[sizeof(magic)];
  if (!detail::recv_all(fd, peer_magic, sizeof(peer_magic), deadline, &reason))
    return fail(why, "receiving hello: " + reason);
  if (std::memcmp(peer_magic, magic, sizeof(magic)) != 0) return fail(why, "peer is not a Tutti peer (bad magic)");
  Nonce theirs{};
  if (!detail::recv_all(fd, theirs.data(), theirs.size(), deadline, &reason))
    return fail(why, "receiving hello: " + reason);
  if (theirs == mine) return fail(why, "peer echoed our nonce");

  const char my_role = initiator ? 'I' : 'A';
  const char peer_role = initiator ? 'A' : 'I';
  const Digest answer = answer_for(token, theirs, my_role);
  if (!detail::send_all(fd, answer.data(), answer.size(), deadline, &reason))
    return fail(why, "sending answer: " + reason);
  Digest peer_answer{};
  if (!detail::recv_all(fd, peer_answer.data(), peer_answer.size(), deadline, &reason))
    return fail(why, "receiving answer: " + reason);
  if (!same_digest(peer_answer, answer_for(token, mine, peer_role)))
    return fail(why, "wrong token (the peer's answer does not match)");
  if (session != nullptr) {
    const std::string_view my_nonce(reinterpret_cast<const char*>(mine.data()), mine.size());
    const std::string_view peer_nonce(reinterpret_cast<const char*>(theirs.data()), theirs.size());
    *session =
        initiator ? derive_session_key(token, my_nonce, peer_nonce) : derive_session_key(token, peer_nonce, my_nonce);
  }
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
