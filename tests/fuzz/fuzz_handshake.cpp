// The connection handshake (bootstrap/auth.hpp) against a peer whose every byte is the fuzzer's:
// byte 0 picks our role (bit 0 set: we initiate), the rest is what the peer sends, all of it at
// once, after which it closes its sending side. Such a peer cannot know our fresh nonce, so the
// handshake must fail, with a reason, and within its deadline; it must never crash or hang.
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <string>

#include "bootstrap/auth.hpp"
#include "fuzz_support.hpp"

using tutti::fuzz::require;

namespace {

// More than one whole exchange (hello 36 bytes, answer 32), and well below a socket's buffer, so
// that writing it all before the handshake starts cannot block.
constexpr std::size_t max_peer_bytes = 512;

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0 || size - 1 > max_peer_bytes) return 0;
  const bool initiator = (data[0] & 1) != 0;
  int fds[2];
  require(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) == 0, "socketpair");
  const std::size_t peer_bytes = size - 1;
  require(::write(fds[1], data + 1, peer_bytes) == static_cast<ssize_t>(peer_bytes), "writing the peer's bytes");
  require(::shutdown(fds[1], SHUT_WR) == 0, "shutdown");

  const auto start = std::chrono::steady_clock::now();
  const auto deadline = start + std::chrono::seconds(2);
  std::string why;
  tutti::bootstrap::SessionKey key{};
  const bool authenticated = tutti::bootstrap::handshake(fds[0], "fuzz-token", initiator, deadline, &why, &key);
  require(!authenticated, "a peer that cannot know our nonce passed the handshake");
  require(!why.empty(), "a failed handshake gave no reason");
  // The peer's bytes end, so the handshake ends at once, never by its deadline.
  require(std::chrono::steady_clock::now() < deadline, "the handshake waited out its deadline on a closed peer");
  ::close(fds[0]);
  ::close(fds[1]);
  return 0;
}
