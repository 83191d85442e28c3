// The TCP store under attack, on loopback: floods of idle connections, garbage, wrong tokens and
// malformed frames from raw sockets. Each test asserts that the server keeps serving honest
// clients, names what it refused, counts it, and never grows a thread per connection. Every
// flood is bounded in count and time; every socket and thread a test makes is closed or joined.
#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <deque>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "bootstrap/auth.hpp"
#include "bootstrap/store.hpp"
#include "bootstrap/tcp_store_protocol.hpp"
#include "test_waits.hpp"
#include "tutti/types.hpp"

namespace tutti::bootstrap {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

std::size_t thread_count() {
  return static_cast<std::size_t>(
      std::distance(std::filesystem::directory_iterator("/proc/self/task"), std::filesystem::directory_iterator()));
}

// Enough descriptors for a flood and the server's side of it.
void raise_descriptor_limit() {
  rlimit limit{};
  ASSERT_EQ(::getrlimit(RLIMIT_NOFILE, &limit), 0);
  limit.rlim_cur = std::min<rlim_t>(limit.rlim_max, 8192);
  ASSERT_EQ(::setrlimit(RLIMIT_NOFILE, &limit), 0);
}

// Starts a connection to 127.0.0.1:port without waiting for it; -1 on failure.
int start_connect(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) return -1;
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(static_cast<std::uint16_t>(port));
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0 && errno != EINPROGRESS) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// A connected, blocking socket to 127.0.0.1:port (reads time out after 10 s).
int dial(int port) {
  const int fd = start_connect(port);
  EXPECT_GE(fd, 0);
  pollfd entry{fd, POLLOUT, 0};
  EXPECT_EQ(::poll(&entry, 1, 5000), 1);
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  timeval limit{10, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &limit, sizeof(limit));
  return fd;
}

// Opens `count` connections that never say a word; waits (up to 5 s) until all are established.
std::vector<int> idle_flood(int port, int count) {
  std::vector<int> fds;
  for (int i = 0; i < count; ++i) {
    const int fd = start_connect(port);
    EXPECT_GE(fd, 0);
    if (fd >= 0) fds.push_back(fd);
  }
  std::vector<pollfd> entries;
  for (const int fd : fds) entries.push_back({fd, POLLOUT, 0});
  const auto deadline = Clock::now() + 5s;
  std::size_t established = 0;
  while (established < entries.size() && Clock::now() < deadline) {
    ::poll(entries.data(), entries.size(), 100);
    established = 0;
    for (auto& entry : entries) {
      if (entry.revents & POLLOUT) entry.events = 0;  // connected (or failed: counted below)
      if (entry.events == 0) ++established;
    }
  }
  for (const int fd : fds) {
    int error = 0;
    socklen_t size = sizeof(error);
    ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &size);
    EXPECT_EQ(error, 0) << "a flood connection failed: " << std::strerror(error);
  }
  EXPECT_EQ(established, fds.size());
  return fds;
}

// True once the server has closed `fd` (whatever it sent first is read and dropped); false if it
// is still open after `limit`.
bool closed_by_server(int fd, std::chrono::milliseconds limit) {
  const auto deadline = Clock::now() + limit;
  char buffer[256];
  while (Clock::now() < deadline) {
    pollfd entry{fd, POLLIN, 0};
    if (::poll(&entry, 1, 50) <= 0) continue;
    const ssize_t got = ::recv(fd, buffer, sizeof(buffer), MSG_DONTWAIT);
    if (got == 0 || (got < 0 && errno == ECONNRESET)) return true;
  }
  return false;
}

using testing::error_code_of;
using testing::eventually;

void close_all(std::vector<int>& fds) {
  for (const int fd : fds) ::close(fd);
  fds.clear();
}

// 200 idle connections from the honest client's own address: the server takes them on its one
// thread, keeps 8 in handshake (the per-source cap) and evicts the rest; those 8 expire after the
// 2 s handshake limit. Every one is counted.
TEST(HostileStore, IdleConnectionsCostNoThreadsAndAreCountedAsRefused) {
  raise_descriptor_limit();
  StoreServer server("127.0.0.1", 0, "t");
  const std::size_t threads = thread_count();
  const auto start = Clock::now();
  std::vector<int> flood = idle_flood(server.port(), 200);
  EXPECT_TRUE(eventually([&] { return server.refused() >= 192; })) << server.refused();
  EXPECT_EQ(thread_count(), threads);  // no thread per connection
  if (Clock::now() - start < 1500ms) {
    EXPECT_EQ(server.refused(), 192);  // the 8 newest are still in their handshake
  }
  EXPECT_TRUE(eventually([&] { return server.refused() == 200; }, 4s)) << server.refused();
  int closed = 0;
  for (const int fd : flood) closed += closed_by_server(fd, 1s) ? 1 : 0;
  EXPECT_EQ(closed, 200);
  EXPECT_EQ(thread_count(), threads);
  close_all(flood);
  auto store = connect_store(server.url(), "t", 5s);
  EXPECT_EQ(store->add("n", 1), 1);
}

// An attacker who keeps 200 idle connections open and keeps opening new ones (bounded: 3,000
// connections, 10 s) must not keep an honest client out: it gets in and is served in seconds.
TEST(HostileStore, HonestClientGetsInDuringASustainedIdleFlood) {
  raise_descriptor_limit();
  StoreServer server("127.0.0.1", 0, "t");
  const std::size_t threads = thread_count();
  std::atomic<bool> stop{false};
  std::atomic<int> opened{0};
  std::thread attacker([&] {
    std::deque<int> open;
    const auto deadline = Clock::now() + 10s;
    while (!stop && opened < 3000 && Clock::now() < deadline) {
      const int fd = start_connect(server.port());
      if (fd >= 0) {
        open.push_back(fd);
        ++opened;
      }
      if (open.size() > 200) {
        ::close(open.front());
        open.pop_front();
      }
      std::this_thread::sleep_for(500us);
    }
    for (const int fd : open) ::close(fd);
  });
  EXPECT_TRUE(eventually([&] { return opened >= 200; }));
  EXPECT_EQ(thread_count(), threads + 1);  // the attacker's thread, nothing in the server
  const auto start = Clock::now();
  std::string failure;
  try {
    auto store = connect_store(server.url(), "t", 5s);
    store->set("rank/0", "here");
    EXPECT_EQ(store->get("rank/0", 1s), "here");
  } catch (const std::exception& e) {
    failure = e.what();
  }
  const auto took = Clock::now() - start;
  const bool flood_was_on = !stop && opened < 3000;
  stop = true;
  attacker.join();
  EXPECT_EQ(failure, "");
  EXPECT_LT(took, 5s);
  EXPECT_TRUE(flood_was_on) << "the flood ended before the honest client was done; the test proves nothing";
  EXPECT_GE(server.refused(), 1);
  EXPECT_EQ(thread_count(), threads);
}

// Garbage, a stranger that sends a hello then a wrong answer, and clients with the wrong token:
// each is refused and counted, the clients are told their token is wrong, and the server goes on.
TEST(HostileStore, GarbageAndWrongTokensAreRefusedCountedAndNamed) {
  StoreServer server("127.0.0.1", 0, "right");
  auto honest = connect_store(server.url(), "right", 5s);
  honest->set("k", "v");
  int expected = 0;
  for (const std::string& junk : {std::string("GET / HTTP/1.1\r\nHost: x\r\n\r\n"), std::string(4096, '\0'),
                                  std::string("TUT"), std::string("SSH-2.0-OpenSSH_9.2\r\n")}) {
    const int fd = dial(server.port());
    ASSERT_EQ(::send(fd, junk.data(), junk.size(), MSG_NOSIGNAL), static_cast<ssize_t>(junk.size()));
    if (junk == "TUT") ::shutdown(fd, SHUT_WR);  // a truncated hello, then silence
    EXPECT_TRUE(closed_by_server(fd, 5s)) << junk;
    ::close(fd);
    ++expected;
  }
  {
    const int fd = dial(server.port());  // a well-formed hello and a made-up answer
    const std::string hello = "TUT2" + std::string(32, '\x5a') + std::string(32, '\x00');
    ASSERT_EQ(::send(fd, hello.data(), hello.size(), MSG_NOSIGNAL), static_cast<ssize_t>(hello.size()));
    EXPECT_TRUE(closed_by_server(fd, 5s));
    ::close(fd);
    ++expected;
  }
  for (int i = 0; i < 3; ++i) {
    std::string message;
    EXPECT_EQ(error_code_of([&] { connect_store(server.url(), "wrong", 5s); }, &message), ErrorCode::system);
    EXPECT_NE(message.find("wrong token"), std::string::npos) << message;
    ++expected;
  }
  EXPECT_TRUE(eventually([&] { return server.refused() == expected; })) << server.refused();
  EXPECT_EQ(honest->get("k", 1s), "v");
  EXPECT_EQ(connect_store(server.url(), "right", 5s)->add("n", 2), 2);
  EXPECT_EQ(server.refused(), expected);
}

// An authenticated raw connection, for sending frames by hand; *session gets its key.
int authenticated(int port, const std::string& token, SessionKey* session = nullptr) {
  const int fd = dial(port);
  const HandshakeResult result = run_handshake(fd, token, true, Clock::now() + 5s);
  EXPECT_TRUE(result.passed()) << result.why;
  if (session != nullptr) *session = result.session;
  return fd;
}

std::string u32(std::uint32_t value) {
  std::string out;
  detail::put_u32(out, value);
  return out;
}

// Frames with impossible lengths (a client with the token, gone wrong or gone bad): the server
// closes that connection, allocates nothing near the declared size, and serves everyone else.
TEST(HostileStore, MalformedFramesCloseTheConnectionNotTheServer) {
  StoreServer server("127.0.0.1", 0, "t");
  auto honest = connect_store(server.url(), "t", 5s);
  const std::vector<std::pair<const char*, std::string>> frames = {
      {"length 2^32-1", u32(0xffffffffu) + "xxxxxxxx"},
      {"length just past the limit", u32(detail::max_store_frame + 1) + "xxxxxxxx"},
      {"shorter than a header", u32(2) + "xx"},
      {"key longer than the frame", u32(13) + u32(1) + "G" + u32(0xfffffff0u) + "abcd"},
      {"key length cut off", u32(7) + u32(1) + "G" + "ab"},
  };
  for (auto [what, bytes] : frames) {
    SessionKey session{};
    const int fd = authenticated(server.port(), "t", &session);
    detail::StoreSeal seal(session, true);
    detail::seal_frame(bytes, seal);  // a valid tag: the frame is refused for what it says
    ASSERT_EQ(::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL), static_cast<ssize_t>(bytes.size()));
    EXPECT_TRUE(closed_by_server(fd, 5s)) << what;
    ::close(fd);
    honest->set("alive", what);
    EXPECT_EQ(honest->get("alive", 1s), what);
  }
  {
    // A frame that declares the largest allowed size and stops after 1 MiB: waits for the rest
    // and goes when the client does.
    const int fd = authenticated(server.port(), "t");
    const std::string start = u32(detail::max_store_frame) + u32(1) + "S" + u32(1) + "k" + std::string(1 << 20, 'z');
    ASSERT_EQ(::send(fd, start.data(), start.size(), MSG_NOSIGNAL), static_cast<ssize_t>(start.size()));
    ::close(fd);
  }
  {
    // An unknown request (tagged like an honest one) is answered with an error, and the
    // connection stays usable.
    SessionKey session{};
    const int fd = authenticated(server.port(), "t", &session);
    detail::StoreSeal send_seal(session, true), receive_seal(session, false);
    std::string request = detail::encode_message({7, 'Z', "k", ""}, true);
    detail::seal_frame(request, send_seal);
    ASSERT_EQ(::send(fd, request.data(), request.size(), MSG_NOSIGNAL), static_cast<ssize_t>(request.size()));
    std::string inbox;
    detail::StoreMessage reply;
    char chunk[256];
    while (detail::take_message(inbox, false, &reply, &receive_seal) == detail::FrameStatus::incomplete) {
      const ssize_t got = ::recv(fd, chunk, sizeof(chunk), 0);
      ASSERT_GT(got, 0);
      inbox.append(chunk, static_cast<std::size_t>(got));
    }
    EXPECT_EQ(reply.id, 7u);
    EXPECT_EQ(reply.kind, 'E');
    EXPECT_NE(reply.payload.find("unknown request"), std::string::npos) << reply.payload;
    ::close(fd);
  }
  EXPECT_EQ(honest->add("n", 3), 3);
  EXPECT_EQ(server.refused(), 0);  // they all had the token: closed, not refused
}

// A relay between a client and the server that passes the handshake through untouched, then
// tampers with the client's frames: `inject` puts a request of its own (without a valid tag)
// ahead of the client's first; otherwise the relay delivers the client's first frame twice.
class Relay {
 public:
  Relay(int server_port, bool inject) : inject_(inject) {
    listener_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(::bind(listener_, reinterpret_cast<sockaddr*>(&address), sizeof(address)), 0);
    EXPECT_EQ(::listen(listener_, 4), 0);
    socklen_t size = sizeof(address);
    ::getsockname(listener_, reinterpret_cast<sockaddr*>(&address), &size);
    port_ = ntohs(address.sin_port);
    thread_ = std::thread([this, server_port] { run(server_port); });
  }
  ~Relay() {
    stop_ = true;
    thread_.join();
    ::close(listener_);
  }
  int port() const { return port_; }

 private:
  static constexpr std::size_t handshake_bytes = 4 + 32 + 32 + 1;  // hello, answer, confirmation

  void run(int server_port) {
    pollfd entry{listener_, POLLIN, 0};
    if (::poll(&entry, 1, 5000) != 1) return;
    const int client = ::accept4(listener_, nullptr, nullptr, SOCK_CLOEXEC);
    const int server = dial(server_port);
    std::string upstream;  // client bytes not yet passed on
    std::size_t passed = 0;
    bool tampered = false;
    const auto give_up = Clock::now() + 10s;
    while (!stop_ && Clock::now() < give_up) {
      pollfd fds[2] = {{client, POLLIN, 0}, {server, POLLIN, 0}};
      if (::poll(fds, 2, 20) <= 0) continue;
      char chunk[4096];
      if (fds[1].revents != 0) {
        const ssize_t got = ::recv(server, chunk, sizeof(chunk), 0);
        if (got <= 0) break;
        ::send(client, chunk, static_cast<std::size_t>(got), MSG_NOSIGNAL);
      }
      if (fds[0].revents != 0) {
        const ssize_t got = ::recv(client, chunk, sizeof(chunk), 0);
        if (got <= 0) break;
        upstream.append(chunk, static_cast<std::size_t>(got));
      }
      std::string out;
      if (passed < handshake_bytes) {
        const std::size_t take = std::min(handshake_bytes - passed, upstream.size());
        out = upstream.substr(0, take);
        upstream.erase(0, take);
        passed += take;
      }
      if (passed == handshake_bytes && !tampered) {
        if (inject_) {
          std::string forged = detail::encode_message({99, 'S', "evil", "planted"}, true);
          forged.append(tag_size, '\0');
          out += forged;
          tampered = true;
        } else if (upstream.size() >= 4) {
          const std::size_t frame = 4 + std::size_t{detail::get_u32(upstream.data())} + tag_size;
          if (upstream.size() >= frame) {
            out += upstream.substr(0, frame) + upstream.substr(0, frame);
            upstream.erase(0, frame);
            tampered = true;
          }
        }
      }
      if (tampered) {
        out += upstream;
        upstream.clear();
      }
      if (!out.empty()) ::send(server, out.data(), out.size(), MSG_NOSIGNAL);
    }
    ::close(client);
    ::close(server);
  }

  const bool inject_;
  int listener_ = -1;
  int port_ = 0;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

// Item 2 for the store: after a relayed handshake, a frame the relay made up, or a frame of the
// client's delivered twice, fails its tag; the server closes that connection without acting on
// it, and the client's next call fails instead of carrying on over a tampered connection.
TEST(HostileStore, FramesInjectedOrReplayedAfterARelayedHandshakeAreRejected) {
  StoreServer server("127.0.0.1", 0, "t");
  auto honest = connect_store(server.url(), "t", 5s);
  for (const bool inject : {true, false}) {
    SCOPED_TRACE(inject ? "injected" : "replayed");
    Relay relay(server.port(), inject);
    auto victim = connect_store("tcp://127.0.0.1:" + std::to_string(relay.port()), "t", 5s);
    std::string message;
    const auto code = error_code_of(
        [&] {
          victim->add("counter", 1);
          victim->add("counter", 1);
        },
        &message);
    EXPECT_EQ(code, ErrorCode::system) << message;
    EXPECT_TRUE(message.find("closed") != std::string::npos || message.find("reset") != std::string::npos) << message;
    // The planted key was never set, and the replayed add counted once at most.
    EXPECT_EQ(error_code_of([&] { honest->get("evil", 300ms); }, nullptr), ErrorCode::timeout);
    EXPECT_EQ(honest->add("counter", 0), inject ? 0 : 1);
    honest->add("counter", -honest->add("counter", 0));
  }
}

// The tags themselves: a frame altered by one bit, or replayed, does not verify, and a frame
// sealed for one direction does not verify in the other.
TEST(StoreFrameTags, AlteredReplayedAndReflectedFramesAreForged) {
  SessionKey key{};
  key[0] = 1;
  detail::StoreSeal client_send(key, true), server_receive(key, true), server_send(key, false);
  const std::string first = detail::encode_message({1, 'S', "k", "v"}, true);
  std::string sealed = first;
  detail::seal_frame(sealed, client_send);
  detail::StoreMessage message;
  std::string altered = sealed;
  altered[10] = static_cast<char>(altered[10] ^ 1);
  EXPECT_EQ(detail::take_message(altered, true, &message, &server_receive), detail::FrameStatus::forged);
  std::string inbox = sealed;
  ASSERT_EQ(detail::take_message(inbox, true, &message, &server_receive), detail::FrameStatus::complete);
  EXPECT_EQ(message.key, "k");
  EXPECT_EQ(message.payload, "v");
  EXPECT_TRUE(inbox.empty());
  inbox = sealed;  // the same frame again
  EXPECT_EQ(detail::take_message(inbox, true, &message, &server_receive), detail::FrameStatus::forged);
  std::string reflected = first;
  detail::seal_frame(reflected, server_send);
  detail::StoreSeal client_receive(key, true);  // expects the initiator's direction: wrong
  EXPECT_EQ(detail::take_message(reflected, true, &message, &client_receive), detail::FrameStatus::forged);
}

}  // namespace
}  // namespace tutti::bootstrap
