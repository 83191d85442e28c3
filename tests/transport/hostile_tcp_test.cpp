// The TCP transport against peers that attack it, on loopback, each case bounded in time:
//  - a rank's peer (a holder of the token) that sends impossible or oversized frames, or frames
//    for communicators nobody joined: the rank fails that peer by name and does not die;
//  - a man in the middle that relays a genuine handshake and then injects, replays or alters
//    frames: the frame fails authentication, the receive fails with peer_failure and the forged
//    bytes never complete it;
//  - a flood of idle connections during set-up: the rank's thread count stays small and the
//    legitimate mesh completes.
// Ranks are threads of this process with an in-memory store; the attacker speaks the wire format
// over raw sockets.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "bootstrap/auth.hpp"
#include "bootstrap/frame_mac.hpp"
#include "bootstrap/socket_io.hpp"
#include "bootstrap/store.hpp"
#include "comm/access.hpp"
#include "comm/comm_impl.hpp"
#include "memory_store.hpp"
#include "transport/tcp/tcp.hpp"
#include "transport/tcp/wire.hpp"
#include "tutti/tutti.hpp"

namespace tutti::testing {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
using bootstrap::FrameMac;
using bootstrap::Tag;
using transport::tcp::FrameHeader;
using transport::tcp::FrameKind;
using transport::tcp::Ident;

const std::string token = "hostile-tcp-test-secret";
constexpr std::uint64_t world_id = 7;
constexpr std::chrono::milliseconds connect_timeout{20000};
constexpr Options bounded{Algorithm::automatic, std::chrono::milliseconds(20000)};

// Point-to-point calls take the communicator's default deadline: keep it well below ctest's.
const bool timeout_set = [] { return ::setenv("TUTTI_TIMEOUT_MS", "20000", 0) == 0; }();

int dial_raw(const std::string& address) {
  const std::size_t colon = address.rfind(':');
  sockaddr_in to{};
  to.sin_family = AF_INET;
  to.sin_port = htons(static_cast<std::uint16_t>(std::stoi(address.substr(colon + 1))));
  ::inet_pton(AF_INET, address.substr(0, colon).c_str(), &to.sin_addr);
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  if (::connect(fd, reinterpret_cast<sockaddr*>(&to), sizeof(to)) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

bool write_all(int fd, const void* data, std::size_t size) {
  return bootstrap::detail::send_all(fd, data, size, Clock::now() + 10s, nullptr);
}

int thread_count() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line))
    if (line.rfind("Threads:", 0) == 0) return std::stoi(line.substr(8));
  return -1;
}

// Runs tcp::connect for `rank` of a `size`-rank mesh on a thread.
class RankThread {
 public:
  RankThread(bootstrap::Store& store, int rank, int size) {
    thread_ = std::thread([this, &store, rank, size] {
      try {
        transport_ = transport::tcp::connect(store, token, rank, size, world_id, "127.0.0.1", connect_timeout);
      } catch (const std::exception& e) {
        error_ = e.what();
      }
    });
  }
  ~RankThread() {
    if (thread_.joinable()) thread_.join();
  }
  // The connected rank as a communicator, or null (with the error in a test failure).
  Communicator join() {
    thread_.join();
    EXPECT_EQ(error_, "");
    if (!transport_) return Communicator();
    return comm::Access::make(std::make_shared<comm::CommImpl>(std::move(transport_)));
  }

 private:
  std::thread thread_;
  std::unique_ptr<transport::Transport> transport_;
  std::string error_;
};

// A rank played by the test (it holds the token): rank 1 of a 2-rank mesh, dialing rank 0.
class RogueRank {
 public:
  explicit RogueRank(bootstrap::Store& store) {
    fd_ = dial_raw(store.get("tcp/7/0", 10s));
    EXPECT_GE(fd_, 0);
    bootstrap::SessionKey key{};
    std::string why;
    EXPECT_TRUE(bootstrap::handshake(fd_, token, true, Clock::now() + 10s, &why, &key)) << why;
    send_mac_ = std::make_unique<FrameMac>(key, true);
    const Ident mine{transport::tcp::ident_magic, 1, 2, 0, world_id};
    const Tag tag = send_mac_->tag(0, FrameMac::Part::ident, &mine, sizeof(mine));
    EXPECT_TRUE(write_all(fd_, &mine, sizeof(mine)) && write_all(fd_, tag.data(), tag.size()));
    char theirs[sizeof(Ident) + sizeof(Tag)];
    EXPECT_TRUE(bootstrap::detail::recv_all(fd_, theirs, sizeof(theirs), Clock::now() + 10s, &why)) << why;
  }
  ~RogueRank() { ::close(fd_); }

  // A frame with correct tags; `payload_bytes` of payload are sent (header.bytes may claim more;
  // the payload's tag follows only a whole payload).
  void send(FrameHeader header, std::size_t payload_bytes = 0) {
    const std::uint64_t number = frames_++;
    const Tag header_tag = send_mac_->tag(number, FrameMac::Part::header, &header, sizeof(header));
    std::vector<std::byte> payload(payload_bytes, std::byte{0x5a});
    write_all(fd_, &header, sizeof(header));
    write_all(fd_, header_tag.data(), header_tag.size());
    if (payload_bytes > 0) write_all(fd_, payload.data(), payload.size());
    if (payload_bytes > 0 && payload_bytes == header.bytes) {
      const Tag payload_tag = send_mac_->tag(number, FrameMac::Part::payload, payload.data(), payload.size());
      write_all(fd_, payload_tag.data(), payload_tag.size());
    }
  }

  // A compact frame (wire.hpp): header, `header.bytes` of payload, one tag over both.
  void send_compact(FrameHeader header) {
    const std::uint64_t number = frames_++;
    header.flags = transport::tcp::frame_compact;
    std::vector<std::byte> frame(sizeof(header) + header.bytes, std::byte{0x5a});
    std::memcpy(frame.data(), &header, sizeof(header));
    const Tag tag = send_mac_->tag(number, FrameMac::Part::compact, frame.data(), frame.size());
    write_all(fd_, frame.data(), frame.size());
    write_all(fd_, tag.data(), tag.size());
  }

 private:
  int fd_ = -1;
  std::unique_ptr<FrameMac> send_mac_;
  std::uint64_t frames_ = 0;
};

FrameHeader data_frame(std::uint64_t comm_id, std::uint64_t bytes) {
  FrameHeader header;
  header.kind = FrameKind::data;
  header.channel = static_cast<std::uint8_t>(transport::Channel::point_to_point);
  header.comm_id = comm_id;
  header.seq = 1;
  header.bytes = bytes;
  return header;
}

// Rank 0 waits in a receive from the rogue rank 1 while `attack` runs; returns its error.
Error receive_during(const std::function<void(RogueRank&)>& attack) {
  MemoryStore store;
  RankThread rank0(store, 0, 2);
  RogueRank rogue(store);
  Communicator comm = rank0.join();
  if (comm.size() == 0) return Error(ErrorCode::system, "no mesh");
  std::thread attacker([&] { attack(rogue); });
  std::vector<float> buffer(4, -1.0f);
  const auto start = Clock::now();
  Error error(ErrorCode::system, "the receive succeeded");
  try {
    comm.recv(buffer.data(), buffer.size(), DataType::f32, 1, 99);
  } catch (const Error& e) {
    error = e;
  }
  attacker.join();
  EXPECT_LT(Clock::now() - start, 10s) << "at once, not at the deadline";
  for (float x : buffer) EXPECT_EQ(x, -1.0f) << "nothing was delivered";
  return error;
}

TEST(HostileTcp, ImpossibleLengthForAnUnknownCommunicatorFailsThePeerByName) {
  const Error error = receive_during([](RogueRank& rogue) { rogue.send(data_frame(12345, std::uint64_t{1} << 62)); });
  const std::string what = error.what();
  EXPECT_EQ(error.code(), ErrorCode::peer_failure) << what;
  EXPECT_NE(what.find("rank 1 sent a malformed frame"), std::string::npos) << what;
}

// A compact frame's length is bounded before anything waits for its payload, even from a rank
// that holds the key; and flags the format does not define are a malformed frame.
TEST(HostileTcp, CompactFrameOverTheBoundAndUnknownFlagsFailThePeerByName) {
  Error error = receive_during([](RogueRank& rogue) { rogue.send_compact(data_frame(world_id, 5000)); });
  std::string what = error.what();
  EXPECT_EQ(error.code(), ErrorCode::peer_failure) << what;
  EXPECT_NE(what.find("rank 1 sent a malformed frame (compact with a payload over the bound)"), std::string::npos)
      << what;
  error = receive_during([](RogueRank& rogue) {
    FrameHeader header = data_frame(world_id, 0);
    header.flags = 2;
    rogue.send(header);
  });
  what = error.what();
  EXPECT_EQ(error.code(), ErrorCode::peer_failure) << what;
  EXPECT_NE(what.find("rank 1 sent a malformed frame (unknown flags 2)"), std::string::npos) << what;
}

// A notice (a collective's signature, compared and dropped) carries no payload and belongs to
// the collective channel: anything else is a malformed frame, acted on before any of it is kept.
TEST(HostileTcp, NoticeWithAPayloadOrOutsideTheCollectiveChannelFailsThePeerByName) {
  Error error = receive_during([](RogueRank& rogue) {
    FrameHeader header = data_frame(world_id, 16);
    header.kind = FrameKind::notice;
    header.channel = static_cast<std::uint8_t>(transport::Channel::collective);
    rogue.send_compact(header);
  });
  std::string what = error.what();
  EXPECT_EQ(error.code(), ErrorCode::peer_failure) << what;
  EXPECT_NE(what.find("rank 1 sent a malformed frame (payload on a frame that has none)"), std::string::npos) << what;
  error = receive_during([](RogueRank& rogue) {
    FrameHeader header = data_frame(world_id, 0);
    header.kind = FrameKind::notice;
    rogue.send(header);
  });
  what = error.what();
  EXPECT_EQ(error.code(), ErrorCode::peer_failure) << what;
  EXPECT_NE(what.find("rank 1 sent a malformed frame (notice outside the collective channel)"), std::string::npos)
      << what;
}

TEST(HostileTcp, UnexpectedBytesBeyondTheCapFailThePeerByName) {
  ::setenv("TUTTI_TCP_MAX_UNEXPECTED", "1000000", 1);
  const Error error = receive_during([](RogueRank& rogue) {
    rogue.send(data_frame(12345, 600'000), 600'000);  // held: no receive posted for it
    rogue.send(data_frame(world_id, 600'000), 1000);  // over the cap with the first
  });
  ::unsetenv("TUTTI_TCP_MAX_UNEXPECTED");
  const std::string what = error.what();
  EXPECT_EQ(error.code(), ErrorCode::peer_failure) << what;
  EXPECT_NE(what.find("rank 1 sent more than this rank may hold"), std::string::npos) << what;
  EXPECT_NE(what.find("TUTTI_TCP_MAX_UNEXPECTED=1000000"), std::string::npos) << what;
}

TEST(HostileTcp, FramesForTooManyUnknownCommunicatorsFailThePeerByName) {
  const Error error = receive_during([](RogueRank& rogue) {
    for (std::uint64_t id = 1000; id < 1100; ++id) rogue.send(data_frame(id, 0));
  });
  const std::string what = error.what();
  EXPECT_EQ(error.code(), ErrorCode::peer_failure) << what;
  EXPECT_NE(what.find("rank 1 sent frames for more than 64 communicators"), std::string::npos) << what;
}

// An allocation that fails in the I/O thread (here: larger than the address space, let through by
// a raised cap) is that peer's failure, not the end of the process.
TEST(HostileTcp, AllocationFailureInTheIoThreadFailsThePeerByName) {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "sanitizer allocators abort on a 256 TiB request instead of throwing bad_alloc";
#endif
  ::setenv("TUTTI_TCP_MAX_UNEXPECTED", std::to_string(std::uint64_t{1} << 50).c_str(), 1);
  const Error error = receive_during([](RogueRank& rogue) { rogue.send(data_frame(12345, std::uint64_t{1} << 48)); });
  ::unsetenv("TUTTI_TCP_MAX_UNEXPECTED");
  const std::string what = error.what();
  EXPECT_EQ(error.code(), ErrorCode::peer_failure) << what;
  EXPECT_NE(what.find("handling frames from rank 1 failed"), std::string::npos) << what;
}

// A man in the middle: forwards the bytes between rank 1 (client) and rank 0 (target), records
// what rank 1 sent, and can inject bytes towards rank 0 or alter one byte on the way.
class Relay {
 public:
  explicit Relay(std::string target) : target_(std::move(target)) {
    listener_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    ::inet_pton(AF_INET, "127.0.0.1", &address.sin_addr);
    socklen_t length = sizeof(address);
    if (::bind(listener_, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0 || ::listen(listener_, 4) != 0 ||
        ::getsockname(listener_, reinterpret_cast<sockaddr*>(&address), &length) != 0)
      ADD_FAILURE() << "relay cannot listen";
    address_ = "127.0.0.1:" + std::to_string(ntohs(address.sin_port));
    thread_ = std::thread([this] { run(); });
  }
  ~Relay() {
    stop_ = true;
    thread_.join();
    for (int fd : {listener_, client_, server_})
      if (fd >= 0) ::close(fd);
  }
  const std::string& address() const { return address_; }
  std::size_t forwarded() {
    std::lock_guard lock(mutex_);
    return recorded_.size();
  }
  std::string recorded(std::size_t from) {
    std::lock_guard lock(mutex_);
    return recorded_.substr(from);
  }
  void inject(const std::string& bytes) {
    std::lock_guard lock(mutex_);
    write_all(server_, bytes.data(), bytes.size());
  }
  void flip_byte_at(std::size_t offset) {
    std::lock_guard lock(mutex_);
    flip_at_ = offset;
  }

 private:
  void run() {
    while (!stop_ && client_ < 0) {
      pollfd entry{listener_, POLLIN, 0};
      if (::poll(&entry, 1, 50) > 0) client_ = ::accept(listener_, nullptr, nullptr);
    }
    if (client_ < 0) return;
    {
      std::lock_guard lock(mutex_);
      server_ = dial_raw(target_);
    }
    char chunk[65536];
    while (!stop_) {
      pollfd entries[2] = {{client_, POLLIN, 0}, {server_, POLLIN, 0}};
      if (::poll(entries, 2, 50) <= 0) continue;
      if (entries[0].revents) {
        const ssize_t got = ::recv(client_, chunk, sizeof(chunk), 0);
        if (got <= 0) break;
        std::lock_guard lock(mutex_);
        const std::size_t at = recorded_.size();
        recorded_.append(chunk, static_cast<std::size_t>(got));
        if (flip_at_ >= at && flip_at_ < at + static_cast<std::size_t>(got)) chunk[flip_at_ - at] ^= 0x40;
        write_all(server_, chunk, static_cast<std::size_t>(got));
      }
      if (entries[1].revents) {
        const ssize_t got = ::recv(server_, chunk, sizeof(chunk), 0);
        if (got <= 0) break;
        write_all(client_, chunk, static_cast<std::size_t>(got));
      }
    }
    ::shutdown(client_, SHUT_RDWR);
    ::shutdown(server_, SHUT_RDWR);
  }

  std::string target_, address_;
  int listener_ = -1, client_ = -1, server_ = -1;
  std::atomic<bool> stop_{false};
  std::thread thread_;
  std::mutex mutex_;
  std::string recorded_;
  std::size_t flip_at_ = ~std::size_t{0};
};

// Hands rank 1 the relay's address instead of rank 0's.
class RelayedStore final : public MemoryStore {
 public:
  std::string get(const std::string& key, std::chrono::milliseconds timeout) override {
    std::string value = MemoryStore::get(key, timeout);
    if (key != "tcp/7/0") return value;
    std::lock_guard lock(mutex_);
    if (!relay) relay = std::make_unique<Relay>(value);
    return relay->address();
  }
  std::mutex mutex_;
  std::unique_ptr<Relay> relay;
};

// Two real ranks whose one connection runs through a relay.
struct RelayedPair {
  RelayedStore store;
  Communicator rank0, rank1;
  RelayedPair() {
    RankThread first(store, 0, 2), second(store, 1, 2);
    rank0 = first.join();
    rank1 = second.join();
  }
};

// Rank 0 posts a receive of 4 floats from rank 1 with `tag`, while `attack` runs; returns its error.
Error relayed_receive(RelayedPair& pair, int tag, std::vector<float>& buffer, const std::function<void()>& attack) {
  Error error(ErrorCode::system, "the receive succeeded");
  std::thread attacker(attack);
  const auto start = Clock::now();
  try {
    pair.rank0.recv(buffer.data(), buffer.size(), DataType::f32, 1, tag);
  } catch (const Error& e) {
    error = e;
  }
  attacker.join();
  EXPECT_LT(Clock::now() - start, 10s) << "at once, not at the deadline";
  return error;
}

void expect_authentication_failure(const Error& error) {
  const std::string what = error.what();
  EXPECT_EQ(error.code(), ErrorCode::peer_failure) << what;
  EXPECT_NE(what.find("frame from rank 1 failed authentication"), std::string::npos) << what;
}

// The relay injects `forged` with 4 floats of payload and `tags` tags it cannot compute without
// the session key, while rank 0 waits in a receive (tag 6): the receive fails by name and nothing
// forged reaches its buffer.
void expect_forgery_rejected(RelayedPair& pair, const FrameHeader& forged, std::size_t tags) {
  std::string bytes(reinterpret_cast<const char*>(&forged), sizeof(forged));
  const std::vector<float> evil(4, 666.0f);
  bytes.append(reinterpret_cast<const char*>(evil.data()), 4 * sizeof(float));
  bytes.append(tags * sizeof(Tag), '\x17');
  std::vector<float> target(4, -1.0f);
  const Error error = relayed_receive(pair, 6, target, [&] {
    std::this_thread::sleep_for(100ms);
    pair.store.relay->inject(bytes);
  });
  expect_authentication_failure(error);
  for (float x : target) EXPECT_EQ(x, -1.0f) << "forged data delivered";
}

TEST(HostileTcp, InjectedFrameAfterARelayedHandshakeIsRejected) {
  RelayedPair pair;
  ASSERT_TRUE(pair.rank0.size() > 0 && pair.rank1.size() > 0 && pair.store.relay);
  // Genuine traffic passes the relay.
  const std::vector<float> good(4, 1.0f);
  std::vector<float> buffer(4, -1.0f);
  std::thread sender([&] { pair.rank1.send(good.data(), good.size(), DataType::f32, 0, 5); });
  pair.rank0.recv(buffer.data(), buffer.size(), DataType::f32, 1, 5);
  sender.join();
  EXPECT_EQ(buffer, good);
  // The relay forges the message rank 0 waits for next, as the pre-authentication format had it.
  FrameHeader forged = data_frame(world_id, 4 * sizeof(float));
  forged.seq = 6;
  expect_forgery_rejected(pair, forged, 2);
}

// The same forgery as a compact frame, on the collective channel with a signature that
// disagrees with rank 0's: its one tag is checked before any of it is acted on, so the forged
// signature raises no mismatch and the forged bytes are delivered nowhere.
TEST(HostileTcp, InjectedCompactFrameIsRejectedBeforeItsHeaderIsActedOn) {
  RelayedPair pair;
  ASSERT_TRUE(pair.rank0.size() > 0 && pair.rank1.size() > 0 && pair.store.relay);
  // Collective #0 done: rank 0 knows its signature, which a forged header would contradict.
  std::thread other([&] {
    float x = 1.0f;
    pair.rank1.allreduce(&x, &x, 1, DataType::f32, ReduceOp::sum);
  });
  float x = 1.0f;
  pair.rank0.allreduce(&x, &x, 1, DataType::f32, ReduceOp::sum);
  other.join();
  EXPECT_EQ(x, 2.0f);
  FrameHeader forged = data_frame(world_id, 4 * sizeof(float));
  forged.flags = transport::tcp::frame_compact;
  forged.channel = static_cast<std::uint8_t>(transport::Channel::collective);
  forged.seq = 0;
  forged.signature.count = 0xbad;
  expect_forgery_rejected(pair, forged, 1);
}

TEST(HostileTcp, ReplayedFrameIsRejected) {
  RelayedPair pair;
  ASSERT_TRUE(pair.rank0.size() > 0 && pair.rank1.size() > 0 && pair.store.relay);
  const std::size_t before = pair.store.relay->forwarded();
  const std::vector<float> good(4, 3.0f);
  std::vector<float> buffer(4, -1.0f);
  std::thread sender([&] { pair.rank1.send(good.data(), good.size(), DataType::f32, 0, 5); });
  pair.rank0.recv(buffer.data(), buffer.size(), DataType::f32, 1, 5);
  sender.join();
  EXPECT_EQ(buffer, good);
  const std::string frame = pair.store.relay->recorded(before);  // rank 1's genuine data frame
  ASSERT_GT(frame.size(), sizeof(FrameHeader));
  std::vector<float> again(4, -1.0f);
  const Error error = relayed_receive(pair, 5, again, [&] {
    std::this_thread::sleep_for(100ms);
    pair.store.relay->inject(frame);
  });
  expect_authentication_failure(error);
  for (float x : again) EXPECT_EQ(x, -1.0f) << "a replayed message was delivered";
}

// One byte of rank 1's next frame changes on the way: in the payload of a frame with a tag for
// its header and one for its payload (2 KiB), and in the payload or the header of a compact frame
// (16 bytes, one tag over both).
TEST(HostileTcp, PayloadAlteredOnTheWayNeverCompletesTheReceive) {
  struct Alteration {
    std::size_t floats, offset;
  };
  for (const Alteration a : {Alteration{512, sizeof(FrameHeader) + sizeof(Tag) + 2},
                             Alteration{4, sizeof(FrameHeader) + 2}, Alteration{4, 40}}) {
    RelayedPair pair;
    ASSERT_TRUE(pair.rank0.size() > 0 && pair.rank1.size() > 0 && pair.store.relay);
    pair.store.relay->flip_byte_at(pair.store.relay->forwarded() + a.offset);
    const std::vector<float> good(a.floats, 2.0f);
    std::vector<float> buffer(a.floats, -1.0f);
    const Error error = relayed_receive(pair, 5, buffer, [&] {
      try {
        pair.rank1.send(good.data(), good.size(), DataType::f32, 0, 5);
      } catch (const Error&) {  // rank 0 closes the connection: rank 1's send fails too
      }
    });
    expect_authentication_failure(error);
    EXPECT_NE(buffer, good) << a.floats << " floats, byte " << a.offset;
  }
}

TEST(HostileTcp, IdleConnectionFloodDuringSetUpUsesFewThreadsAndTheMeshCompletes) {
  constexpr int flood = 1000;
  rlimit files{};
  ::getrlimit(RLIMIT_NOFILE, &files);
  files.rlim_cur = std::max<rlim_t>(files.rlim_cur, std::min<rlim_t>(files.rlim_max, 4096));
  ::setrlimit(RLIMIT_NOFILE, &files);
  if (files.rlim_cur < 2 * flood + 100) GTEST_SKIP() << "needs " << 2 * flood + 100 << " file descriptors";

  MemoryStore store;
  const int threads_before = thread_count();
  auto rank0 = std::make_unique<RankThread>(store, 0, 3);
  const std::string address = store.get("tcp/7/0", 10s);
  std::vector<int> idle;
  const auto start = Clock::now();
  for (int i = 0; i < flood && Clock::now() - start < 20s; ++i) {
    const int fd = dial_raw(address);
    if (fd >= 0) idle.push_back(fd);
  }
  EXPECT_GT(idle.size(), flood / 2u);
  std::this_thread::sleep_for(300ms);  // rank 0 has seen them all
  const int threads_during = thread_count();
  EXPECT_LE(threads_during - threads_before, 8) << "threads: " << threads_before << " before, " << threads_during
                                                << " with " << idle.size() << " idle connections";
  // The legitimate ranks connect while the idle connections are still open.
  const auto mesh_start = Clock::now();
  RankThread rank1(store, 1, 3), rank2(store, 2, 3);
  std::vector<Communicator> comms{rank0->join(), rank1.join(), rank2.join()};
  EXPECT_LT(Clock::now() - mesh_start, 15s);
  for (int fd : idle) ::close(fd);
  for (const Communicator& comm : comms) ASSERT_TRUE(comm.size() > 0);
  std::vector<std::thread> threads;
  std::atomic<int> correct{0};
  for (Communicator& comm : comms)
    threads.emplace_back([&comm, &correct] {
      std::vector<float> v(1000, 2.0f);
      comm.allreduce(v.data(), v.data(), v.size(), DataType::f32, ReduceOp::sum, bounded);
      if (std::all_of(v.begin(), v.end(), [](float x) { return x == 6.0f; })) correct.fetch_add(1);
    });
  for (auto& t : threads) t.join();
  EXPECT_EQ(correct.load(), 3);
}

}  // namespace
}  // namespace tutti::testing
