// What a TCP peer sends after the handshake (transport/tcp/wire.hpp), through the real parser: a
// Hub for rank 0 of 2 reads the fuzzer's bytes as the stream of rank 1 over one end of a
// socketpair, in insecure mode (no key: no tags, so the bytes reach the header and payload
// parsing instead of failing the first tag). Communicator 1 = {0, 1} is joined.
//
// Input: a 6-byte Setup (below), then the stream, written whole into the other end, which is then
// shut down (end of stream). Setup chooses what rank 0 has posted, so that frames meet the user
// and reduce sinks, unexpected messages, acks and size errors: a receive (or receive-and-reduce)
// A on (channel, seq 0, index 0), optionally B on (channel, seq 1, index 0) of the same size,
// posted before the stream or after its end; a point-to-point send to rank 1 (tag 0) for ack and
// size_error frames to complete; rank 0's signature for collective #0.
//
// Whatever the bytes, within 5 s the hub must have handled the end of the stream (closed the
// connection), and then nothing rank 0 posted may still wait without its communicator having
// failed (a receive from a peer that is gone must never hang), no receive may have been written
// past its end, and a failed operation must say why. ASan, UBSan and LSan watch the rest.
#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "fuzz_signature.hpp"
#include "fuzz_support.hpp"
#include "transport/tcp/hub.hpp"
#include "transport/tcp/wire.hpp"

using tutti::fuzz::require;
namespace transport = tutti::transport;
namespace tcp = tutti::transport::tcp;

namespace {

using Clock = std::chrono::steady_clock;

struct Setup {
  std::uint8_t flags = 0;
  std::uint8_t type_op = 0;      // receive-and-reduce: DataType = low nibble % 10, ReduceOp = high nibble % 5
  std::uint16_t recv_bytes = 0;  // of A and B (for a reduce, rounded down to whole elements)
  std::uint16_t send_bytes = 0;  // of the point-to-point send
};
static_assert(sizeof(Setup) == 6);

constexpr std::uint8_t post_a = 1;      // post receive A
constexpr std::uint8_t reduce = 2;      // A and B are receive-and-reduce
constexpr std::uint8_t p2p = 4;         // on the point-to-point channel (else collective)
constexpr std::uint8_t post_late = 8;   // post A and B after the end of the stream was handled
constexpr std::uint8_t announce = 16;   // rank 0 announces collective #0 (allreduce, ring)
constexpr std::uint8_t post_send = 32;  // a point-to-point send of send_bytes to rank 1, tag 0
constexpr std::uint8_t post_b = 64;     // post receive B too
constexpr std::uint8_t big = 128;       // A and B are 64 KiB larger (the hub reads those straight in)

constexpr std::uint64_t comm = 1;
constexpr std::size_t guard = 64;  // bytes past each receive that must stay untouched
constexpr std::byte canary{0xa5};
constexpr auto stream_deadline = std::chrono::seconds(5);

// Peers' messages kept before their receive is posted: small, so that a frame's length field
// costs little to honour (the cap, not its value, is what is being tested).
const bool configured = [] {
  ::setenv("TUTTI_TCP_MAX_UNEXPECTED", "1048576", 1);
  return true;
}();

struct Receive {
  std::vector<std::byte> buffer, operand;
  transport::Completion done;
  bool posted = false;
};

void post(tcp::Hub& hub, Receive& r, const transport::MessageKey& key, std::size_t bytes, bool reducing,
          tutti::DataType type, tutti::ReduceOp op) {
  r.buffer.assign(bytes + guard, canary);
  tcp::PostedRecv recv;
  recv.data = r.buffer.data();
  recv.bytes = bytes;
  recv.done = &r.done;
  if (reducing) {
    r.operand.assign(bytes, std::byte{0x11});
    recv.operand = r.operand.data();
    recv.type = type;
    recv.op = op;
  }
  hub.post_recv(comm, 1, key, recv);
  r.posted = true;
}

// Reads (and drops) what the hub wrote to rank 1; false at the end of the stream (the hub closed
// its end). Waits at most until `until` for something to happen.
bool drain(int fd, Clock::time_point until) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - Clock::now()).count();
  pollfd p{fd, POLLIN, 0};
  if (::poll(&p, 1, static_cast<int>(std::max<long long>(left, 0))) <= 0) return true;
  char sink[4096];
  for (;;) {
    const ssize_t got = ::recv(fd, sink, sizeof sink, MSG_DONTWAIT);
    if (got > 0) continue;
    if (got < 0 && errno == EINTR) continue;
    // EAGAIN: drained for now. 0 or ECONNRESET (the hub closed its end with bytes of ours unread):
    // the end of the stream.
    return got < 0 && (errno == EAGAIN || errno == EWOULDBLOCK);
  }
}

void write_all(int fd, const std::uint8_t* data, std::size_t size) {
  while (size > 0) {
    const ssize_t put = ::send(fd, data, size, MSG_NOSIGNAL);
    if (put < 0) {
      // The hub may close its end before reading everything (a malformed frame): the rest is moot.
      require(errno == EINTR || errno == EPIPE || errno == ECONNRESET, "writing the stream failed");
      if (errno != EINTR) return;
      continue;
    }
    data += put;
    size -= static_cast<std::size_t>(put);
  }
}

void check_outcome(const tcp::Hub& hub, const tcp::CommState& state, const transport::Completion& done) {
  // A reason that says something: not empty, and not cut to nothing by a NUL (as what() would).
  const auto says_why = [](const std::string& text) { return !text.empty() && text.front() != '\0'; };
  const auto s = done.state();
  if (s == transport::Completion::failed) require(says_why(done.error), "an operation failed without saying why");
  const auto failure = hub.failure(state);
  if (failure) require(says_why(failure->error.what()), "a communicator failed without saying why");
  if (s == transport::Completion::posted)
    require(failure.has_value(),
            "an operation still waits on a peer whose connection is closed, and its communicator did not fail");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  require(configured, "setup");
  Setup setup;
  if (size > 0) std::memcpy(&setup, data, std::min(size, sizeof setup));
  const std::uint8_t* stream = data + std::min(size, sizeof setup);
  const std::size_t stream_size = size - std::min(size, sizeof setup);
  if (stream_size >= sizeof(tcp::FrameHeader)) {  // the signature of the first header, decoded on its own
    tcp::FrameHeader first;
    std::memcpy(&first, stream, sizeof first);
    tutti::fuzz::check_signature(first.signature);
  }

  const bool reducing = (setup.flags & reduce) != 0;
  const auto type = reducing ? static_cast<tutti::DataType>((setup.type_op & 0xf) % 10) : tutti::DataType::u8;
  const auto op = static_cast<tutti::ReduceOp>((setup.type_op >> 4) % 5);
  std::size_t recv_bytes = setup.recv_bytes + ((setup.flags & big) ? 64 * 1024 : 0);
  recv_bytes -= recv_bytes % tutti::size_of(type);
  const auto channel = (setup.flags & p2p) ? transport::Channel::point_to_point : transport::Channel::collective;

  int fds[2];
  require(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) == 0, "socketpair failed");
  require(::fcntl(fds[0], F_SETFL, ::fcntl(fds[0], F_GETFL) | O_NONBLOCK) == 0, "O_NONBLOCK failed");
  const int rank1 = fds[1];

  // Declared before the hub: it may write into them until it is gone.
  Receive a, b;
  std::vector<std::byte> send_buffer(setup.send_bytes, std::byte{0x22});
  transport::Completion sent;
  bool sending = false;
  {
    std::vector<tcp::Link> links(2);
    links[1].fd = fds[0];
    tcp::Hub hub(0, 2, std::move(links));
    tcp::CommState* state = hub.join(comm, {0, 1}, 0);
    if (setup.flags & announce) {
      transport::Signature mine;
      mine.seq = 0;
      mine.collective = tutti::Collective::allreduce;
      mine.count = recv_bytes / tutti::size_of(type);
      mine.type = type;
      mine.op = op;
      mine.algorithm = tutti::Algorithm::ring;
      hub.announce(comm, mine);
    }
    const auto post_receives = [&] {
      if (setup.flags & post_a) post(hub, a, {channel, 0, 0}, recv_bytes, reducing, type, op);
      if (setup.flags & post_b) post(hub, b, {channel, 1, 0}, recv_bytes, reducing, type, op);
    };
    if (!(setup.flags & post_late)) post_receives();
    if (setup.flags & post_send) {
      hub.post_send(comm, 1, {transport::Channel::point_to_point, 0, 0}, send_buffer.data(), send_buffer.size(), &sent);
      sending = true;
    }

    write_all(rank1, stream, stream_size);
    ::shutdown(rank1, SHUT_WR);
    const auto deadline = Clock::now() + stream_deadline;
    while (drain(rank1, std::min(deadline, Clock::now() + std::chrono::milliseconds(100)))) {
      if (Clock::now() >= deadline) {
        std::fprintf(stderr, "fuzz check failed: the hub did not handle the end of the stream within 5 s\n");
        std::abort();
      }
    }
    // Its end is closed; the mutex orders this after the rest of that handling.
    require(hub.closed_for_testing(1), "the hub's end of the stream is closed but it does not know");
    if (setup.flags & post_late) post_receives();

    for (const Receive* r : {&a, &b}) {
      if (!r->posted) continue;
      check_outcome(hub, *state, r->done);
      for (std::size_t i = r->buffer.size() - guard; i < r->buffer.size(); ++i)
        require(r->buffer[i] == canary, "a receive was written past its end");
    }
    if (sending) check_outcome(hub, *state, sent);

    for (Receive* r : {&a, &b})
      if (r->posted) hub.cancel(comm, &r->done);
    if (sending) hub.cancel(comm, &sent);
    hub.leave(comm);
  }
  ::close(rank1);
  return 0;
}
