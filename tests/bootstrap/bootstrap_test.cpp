// Bootstrap layer: SHA-256/HMAC known-answer vectors (through the library's calls into libcrypto),
// frame tags against EVP's AES-256-GCM, the token handshake, the file and TCP stores, and job
// detection from each launcher's variables. Every wait has a deadline; every socket, thread and
// temporary directory a test makes is closed, joined or removed by the test.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netdb.h>
#include <netinet/in.h>
#include <openssl/evp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <future>
#include <map>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "bootstrap/auth.hpp"
#include "bootstrap/crypto.hpp"
#include "bootstrap/frame_mac.hpp"
#include "bootstrap/job.hpp"
#include "bootstrap/store.hpp"
#include "test_waits.hpp"
#include "tutti/tutti.hpp"
#include "tutti/types.hpp"

namespace tutti::bootstrap {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

std::string hex(const std::array<std::uint8_t, 32>& digest) {
  static constexpr char digits[] = "0123456789abcdef";
  std::string text;
  for (const auto byte : digest) {
    text.push_back(digits[byte >> 4]);
    text.push_back(digits[byte & 0xf]);
  }
  return text;
}

// ---- SHA-256 and HMAC-SHA256 -------------------------------------------------------------------

TEST(Sha256, Fips180Vectors) {
  EXPECT_EQ(hex(sha256("")), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(hex(sha256("abc")), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(hex(sha256("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq")),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  EXPECT_EQ(hex(sha256(std::string(1000000, 'a'))), "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

TEST(Sha256, PaddingBoundaries) {
  // Lengths at the 55/56/64-byte padding edges, against values from Python's hashlib.
  EXPECT_EQ(hex(sha256(std::string(55, 'x'))), "d5e285683cd4efc02d021a5c62014694958901005d6f71e89e0989fac77e4072");
  EXPECT_EQ(hex(sha256(std::string(56, 'x'))), "04c26261370ee7541549d16dee320c723e3fd14671e66a099afe0a377c16888e");
  EXPECT_EQ(hex(sha256(std::string(64, 'x'))), "7ce100971f64e7001e8fe5a51973ecdfe1ced42befe7ee8d5fd6219506b5393c");
  EXPECT_EQ(hex(sha256(std::string(119, 'x'))), "000b48d4edf0fa7bee3c6236ecd2785baa5db4eeb8bb54341b029e0d9fa5fb0c");
}

TEST(HmacSha256, Rfc4231Vectors) {
  EXPECT_EQ(hex(hmac_sha256(std::string(20, '\x0b'), "Hi There")),
            "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7");
  EXPECT_EQ(hex(hmac_sha256("Jefe", "what do ya want for nothing?")),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
  EXPECT_EQ(hex(hmac_sha256(std::string(20, '\xaa'), std::string(50, '\xdd'))),
            "773ea91e36800e46854db8ebd09181a72959098b3ef8c122d9635514ced565fe");
  std::string key4;
  for (int i = 1; i <= 25; ++i) key4.push_back(static_cast<char>(i));
  EXPECT_EQ(hex(hmac_sha256(key4, std::string(50, '\xcd'))),
            "82558a389a443c0ea4cc819899f2083a85f0faa3e578f8077a2e3ff46729665b");
  const std::string long_key(131, '\xaa');
  EXPECT_EQ(hex(hmac_sha256(long_key, "Test Using Larger Than Block-Size Key - Hash Key First")),
            "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54");
  EXPECT_EQ(hex(hmac_sha256(long_key,
                            "This is a test using a larger than block-size key and a larger than block-size data. The "
                            "key needs to be hashed before being used by the HMAC algorithm.")),
            "9b09ffa71b942fcb27635fbcd5b0e944bfdc63644f0713938a7f51535c3a35e2");
  // Test case 5 gives the output truncated to 128 bits.
  EXPECT_EQ(hex(hmac_sha256(std::string(20, '\x0c'), "Test With Truncation")).substr(0, 32),
            "a3b6167473100ee06e0c796c2955552b");
}

TEST(HmacSha256, EmptyKeyAndMessage) {
  // Empty views (null data) included: libcrypto must still be given a key. Values from Python's hmac.
  EXPECT_EQ(hex(hmac_sha256(std::string_view(), std::string_view())),
            "b613679a0814d9ec772f95d778c35fc5ff1697c493715653c6c712144292c5ad");
  EXPECT_EQ(hex(hmac_sha256("key", "")), "5d5d139563c95b5967b9bd9a8c9b233a9dedb45072794cd232dc1b74832607d0");
}

TEST(SameBytes, ComparesEveryByte) {
  const Digest a = sha256("a");
  Digest b = a;
  EXPECT_TRUE(same_bytes(a.data(), b.data(), a.size()));
  for (const std::size_t at : {std::size_t{0}, std::size_t{17}, a.size() - 1}) {
    b = a;
    b[at] ^= 0x01;
    EXPECT_FALSE(same_bytes(a.data(), b.data(), a.size())) << "differing at byte " << at;
  }
  EXPECT_TRUE(same_bytes(a.data(), b.data(), 0));
}

// A frame's tag is AES-256-GCM's, over the bytes as associated data, with the nonce (direction,
// part, 0, 0, counter little-endian): checked against libcrypto's EVP AES-256-GCM, whatever the
// size and however the bytes are split into updates, for random keys, counters and parts; with
// GHASH computed by each engine (the vector code's 256-byte strides, its one-block tail and the
// bytes carried from one update to the next all cross the sizes and pieces drawn).
void expect_tags_are_aes_256_gcm(FrameMac::Engine engine) {
  std::mt19937_64 random(20261130);
  const auto byte = [&] { return static_cast<std::uint8_t>(random()); };
  for (int trial = 0; trial < 400; ++trial) {
    SessionKey key;
    for (auto& b : key) b = byte();
    const bool initiator = trial % 2 == 0;
    const std::uint64_t counter = trial < 4 ? static_cast<std::uint64_t>(trial) : random();
    const auto part = static_cast<FrameMac::Part>(trial % 5);
    const std::size_t size = trial < 40    ? static_cast<std::size_t>(trial * 13)
                             : trial < 300 ? random() % 5000
                                           : random() % 70000;  // frames up to a 64 KiB payload and beyond
    std::vector<std::uint8_t> data(size);
    for (auto& b : data) b = byte();

    unsigned char nonce[12] = {static_cast<unsigned char>(initiator ? 'I' : 'A'), static_cast<unsigned char>(part), 0,
                               0};
    for (int i = 0; i < 8; ++i) nonce[4 + i] = static_cast<unsigned char>(counter >> (8 * i));
    EVP_CIPHER_CTX* ctx = EVP_CIPHER_CTX_new();
    ASSERT_NE(ctx, nullptr);
    int n = 0;
    unsigned char none[16];
    Tag want{};
    ASSERT_EQ(EVP_EncryptInit_ex(ctx, EVP_aes_256_gcm(), nullptr, key.data(), nonce), 1);
    if (!data.empty()) {
      ASSERT_EQ(EVP_EncryptUpdate(ctx, nullptr, &n, data.data(), static_cast<int>(data.size())), 1);
    }
    ASSERT_EQ(EVP_EncryptFinal_ex(ctx, none, &n), 1);
    ASSERT_EQ(EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_GCM_GET_TAG, static_cast<int>(want.size()), want.data()), 1);
    EVP_CIPHER_CTX_free(ctx);

    FrameMac mac(key, initiator, engine);
    EXPECT_EQ(mac.tag(counter, part, data.data(), data.size()), want) << "trial " << trial;
    // The same again in pieces of random sizes (the payload arrives as it arrives), after another
    // tag on the same object: nothing of one tag leaks into the next.
    (void)mac.tag(counter + 1, part, data.data(), data.size() / 2);
    mac.begin(counter, part);
    const std::size_t most = trial % 3 == 0 ? 40 : 700;
    for (std::size_t at = 0; at < data.size();) {
      const std::size_t piece = std::min<std::size_t>(data.size() - at, 1 + random() % most);
      mac.update(data.data() + at, piece);
      at += piece;
    }
    EXPECT_EQ(mac.finish(), want) << "trial " << trial << " in pieces";
  }
}

TEST(FrameMac, TagsAreAes256GcmOverTheBytesAsAssociatedData) { expect_tags_are_aes_256_gcm(FrameMac::Engine::openssl); }

TEST(FrameMac, VectorGhashGivesTheSameTags) {
  if (!FrameMac::vector_available())
    GTEST_SKIP() << "this CPU lacks VPCLMULQDQ or AVX-512: the frame tags use OpenSSL's GHASH here";
  expect_tags_are_aes_256_gcm(FrameMac::Engine::fastest);
}

// A tag made by one engine verifies under the other: peers on different CPUs agree.
TEST(FrameMac, EnginesAgreeAcrossPeers) {
  SessionKey key;
  for (std::size_t i = 0; i < key.size(); ++i) key[i] = static_cast<std::uint8_t>(i * 7 + 1);
  std::vector<std::uint8_t> data(4099);
  for (std::size_t i = 0; i < data.size(); ++i) data[i] = static_cast<std::uint8_t>(i * 31);
  FrameMac fastest(key, true, FrameMac::Engine::fastest), openssl(key, true, FrameMac::Engine::openssl);
  for (std::uint64_t counter = 0; counter < 20; ++counter)
    EXPECT_TRUE(FrameMac::same(fastest.tag(counter, FrameMac::Part::payload, data.data(), counter * 200),
                               openssl.tag(counter, FrameMac::Part::payload, data.data(), counter * 200)))
        << "counter " << counter;
}

TEST(RandomHex, LengthAndDigits) {
  const std::string a = random_hex(), b = random_hex(8);
  EXPECT_EQ(a.size(), 64u);
  EXPECT_EQ(b.size(), 16u);
  EXPECT_EQ(a.find_first_not_of("0123456789abcdef"), std::string::npos);
  EXPECT_NE(a, random_hex());
}

// ---- handshake ---------------------------------------------------------------------------------

struct SocketPair {
  int fd[2] = {-1, -1};
  SocketPair() { EXPECT_EQ(::socketpair(AF_UNIX, SOCK_STREAM, 0, fd), 0); }
  ~SocketPair() { close_all(); }
  void close_all() {
    for (int& f : fd)
      if (f >= 0) ::close(f), f = -1;
  }
};

struct PairResult {
  bool ok[2] = {false, false};
  std::string why[2];
};

PairResult run_pair(const std::string& token0, const std::string& token1, std::chrono::milliseconds limit = 5s) {
  SocketPair pair;
  PairResult result;
  const auto deadline = Clock::now() + limit;
  std::thread acceptor([&] { result.ok[1] = handshake(pair.fd[1], token1, false, deadline, &result.why[1]); });
  result.ok[0] = handshake(pair.fd[0], token0, true, deadline, &result.why[0]);
  acceptor.join();
  return result;
}

TEST(Handshake, SameTokenSucceedsBothWays) {
  const auto r = run_pair("secret", "secret");
  EXPECT_TRUE(r.ok[0]) << r.why[0];
  EXPECT_TRUE(r.ok[1]) << r.why[1];
  const auto empty = run_pair("", "");
  EXPECT_TRUE(empty.ok[0] && empty.ok[1]);
}

TEST(Handshake, WrongTokenFailsOnBothSides) {
  const auto r = run_pair("secret", "other");
  EXPECT_FALSE(r.ok[0]);
  EXPECT_FALSE(r.ok[1]);
  EXPECT_NE(r.why[0].find("wrong token"), std::string::npos) << r.why[0];
  EXPECT_NE(r.why[1].find("wrong token"), std::string::npos) << r.why[1];
}

TEST(Handshake, NonblockingSocketsWork) {
  SocketPair pair;
  for (int f : pair.fd) ASSERT_EQ(fcntl(f, F_SETFL, fcntl(f, F_GETFL) | O_NONBLOCK), 0);
  const auto deadline = Clock::now() + 5s;
  auto other = std::async(std::launch::async, [&] { return handshake(pair.fd[1], "t", false, deadline); });
  EXPECT_TRUE(handshake(pair.fd[0], "t", true, deadline));
  EXPECT_TRUE(other.get());
}

TEST(Handshake, SilentPeerFailsByTheDeadline) {
  SocketPair pair;
  std::string why;
  const auto start = Clock::now();
  EXPECT_FALSE(handshake(pair.fd[0], "t", true, start + 200ms, &why));
  EXPECT_LT(Clock::now() - start, 3s);
  EXPECT_NE(why.find("deadline"), std::string::npos) << why;
}

TEST(Handshake, GarbageAndEofFail) {
  {
    SocketPair pair;
    const std::string junk = "GET / HTTP/1.1\r\nHost: x\r\n\r\n and some more junk bytes to fill a hello";
    ASSERT_EQ(::write(pair.fd[1], junk.data(), junk.size()), static_cast<ssize_t>(junk.size()));
    std::string why;
    EXPECT_FALSE(handshake(pair.fd[0], "t", false, Clock::now() + 2s, &why));
    EXPECT_NE(why.find("magic"), std::string::npos) << why;
  }
  {
    SocketPair pair;
    ::close(pair.fd[1]);
    pair.fd[1] = -1;
    std::string why;
    EXPECT_FALSE(handshake(pair.fd[0], "t", false, Clock::now() + 2s, &why));
  }
  {
    // A correct hello followed by a wrong answer (e.g. a replayed one).
    SocketPair pair;
    std::string hello = "TUT2" + std::string(32, '\x01') + std::string(32, '\x02');
    ASSERT_EQ(::write(pair.fd[1], hello.data(), hello.size()), static_cast<ssize_t>(hello.size()));
    std::string why;
    EXPECT_FALSE(handshake(pair.fd[0], "t", false, Clock::now() + 2s, &why));
    EXPECT_NE(why.find("wrong token"), std::string::npos) << why;
  }
}

// Runs two Handshakers against each other in memory, handing over at most `step` bytes at a time.
void exchange(Handshaker& a, Handshaker& b, std::size_t step) {
  std::string to_a, to_b;
  for (int round = 0; round < 1000; ++round) {
    to_b += a.output();
    a.output().clear();
    to_a += b.output();
    b.output().clear();
    bool moved = false;
    const auto deliver = [&](std::string& wire, Handshaker& machine) {
      const std::size_t size = std::min({wire.size(), machine.wanted(), step});
      if (size == 0) return;
      machine.feed(wire.data(), size);
      wire.erase(0, size);
      moved = true;
    };
    deliver(to_b, b);
    deliver(to_a, a);
    if (!moved) return;
  }
}

TEST(Handshaker, TwoMachinesAgreeHowEverTheBytesArrive) {
  for (const std::size_t step : {std::size_t{1}, std::size_t{3}, std::size_t{64}}) {
    Handshaker a("secret", true), b("secret", false);
    exchange(a, b, step);
    ASSERT_EQ(a.state(), Handshaker::State::passed) << a.why();
    ASSERT_EQ(b.state(), Handshaker::State::passed) << b.why();
    EXPECT_EQ(a.session_key(), b.session_key());
    EXPECT_EQ(a.wanted(), 0u);
    EXPECT_EQ(b.received(), 4u + 32u + 32u + 1u);  // hello, answer, confirmation: nothing past them
    EXPECT_TRUE(a.output().empty() && b.output().empty());
  }
  Handshaker c("secret", true), d("secret", false);
  exchange(c, d, 64);
  Handshaker e("secret", true), f("secret", false);
  exchange(e, f, 64);
  EXPECT_NE(c.session_key(), e.session_key());  // fresh for every connection
}

TEST(Handshaker, WrongTokenIsToldApartFromOtherFailures) {
  Handshaker a("secret", true), b("other", false);
  exchange(a, b, 64);
  EXPECT_EQ(a.failure(), HandshakeFailure::wrong_token);
  EXPECT_EQ(b.failure(), HandshakeFailure::wrong_token);
  EXPECT_NE(a.why().find("wrong token"), std::string::npos) << a.why();

  Handshaker stranger("secret", false);
  EXPECT_EQ(stranger.feed("GET ", 4), Handshaker::State::failed);  // told at the fourth byte
  EXPECT_EQ(stranger.failure(), HandshakeFailure::not_a_peer);
  EXPECT_EQ(stranger.wanted(), 0u);

  Handshaker greedy("secret", false);
  const std::string too_much(100, 'x');
  EXPECT_THROW(greedy.feed(too_much.data(), too_much.size()), std::logic_error);

  Handshaker closed("secret", true);
  closed.fail(HandshakeFailure::closed, "gone");
  EXPECT_EQ(closed.state(), Handshaker::State::failed);
  EXPECT_EQ(closed.failure(), HandshakeFailure::closed);
}

TEST(Handshake, RunHandshakeNamesWhatWentWrong) {
  {
    SocketPair pair;
    ::close(pair.fd[1]);
    pair.fd[1] = -1;
    EXPECT_EQ(run_handshake(pair.fd[0], "t", true, Clock::now() + 2s).failure, HandshakeFailure::closed);
  }
  {
    SocketPair pair;
    EXPECT_EQ(run_handshake(pair.fd[0], "t", true, Clock::now() + 100ms).failure, HandshakeFailure::deadline);
  }
  {
    SocketPair pair;
    ASSERT_EQ(::write(pair.fd[1], "SSH-2.0-x", 9), 9);
    EXPECT_EQ(run_handshake(pair.fd[0], "t", true, Clock::now() + 2s).failure, HandshakeFailure::not_a_peer);
  }
  {
    SocketPair pair;
    const auto deadline = Clock::now() + 5s;
    auto other = std::async(std::launch::async, [&] { return run_handshake(pair.fd[1], "b", false, deadline); });
    EXPECT_EQ(run_handshake(pair.fd[0], "a", true, deadline).failure, HandshakeFailure::wrong_token);
    EXPECT_EQ(other.get().failure, HandshakeFailure::wrong_token);
  }
}

// A peer that answers correctly and then hangs up (a server that dropped the connection half-way)
// has not admitted us: the handshake must not pass.
TEST(Handshake, PeerThatLeavesBeforeConfirmingIsNoPass) {
  SocketPair pair;
  auto client = std::async(std::launch::async, [&] { return run_handshake(pair.fd[0], "t", true, Clock::now() + 5s); });
  char hello[36];
  ASSERT_EQ(::recv(pair.fd[1], hello, sizeof(hello), MSG_WAITALL), 36);
  const std::string my_hello = "TUT2" + std::string(32, '\x07');
  ASSERT_EQ(::write(pair.fd[1], my_hello.data(), my_hello.size()), 36);
  char answer[32];
  ASSERT_EQ(::recv(pair.fd[1], answer, sizeof(answer), MSG_WAITALL), 32);
  const auto mine = hmac_sha256("t", std::string(hello + 4, 32) + "A");  // the acceptor's answer
  ASSERT_EQ(::write(pair.fd[1], mine.data(), mine.size()), 32);
  char confirmation = 0;
  ASSERT_EQ(::recv(pair.fd[1], &confirmation, 1, MSG_WAITALL), 1);  // the client accepted us...
  EXPECT_EQ(confirmation, 'K');
  ::close(pair.fd[1]);  // ...but we leave without confirming
  pair.fd[1] = -1;
  const HandshakeResult result = client.get();
  EXPECT_EQ(result.failure, HandshakeFailure::closed) << result.why;
  EXPECT_NE(result.why.find("confirmation"), std::string::npos) << result.why;
}

// ---- helpers for the stores --------------------------------------------------------------------

struct TempDir {
  std::string path;
  TempDir() {
    std::string pattern = (std::filesystem::temp_directory_path() / "tutti-store-XXXXXX").string();
    EXPECT_NE(::mkdtemp(pattern.data()), nullptr);
    path = pattern;
  }
  ~TempDir() { std::filesystem::remove_all(path); }
  std::string url() const { return "file://" + path; }
};

using testing::error_code_of;
using testing::eventually;

// Several threads, each with its own store: they publish keys, bump a shared counter, and read
// every other thread's keys (some of which are set after the reader asks).
void exercise_store(const std::string& url, const std::string& token, int threads, int keys) {
  std::vector<std::thread> workers;
  std::atomic<int> failures{0};
  for (int t = 0; t < threads; ++t) {
    workers.emplace_back([&, t] {
      try {
        auto store = connect_store(url, token, 5s);
        for (int k = 0; k < keys; ++k) {
          store->set("t" + std::to_string(t) + "/k" + std::to_string(k), std::to_string(t * 1000 + k));
          store->add("counter", 1);
        }
        for (int other = 0; other < threads; ++other)
          for (int k = 0; k < keys; ++k)
            if (store->get("t" + std::to_string(other) + "/k" + std::to_string(k), 10s) !=
                std::to_string(other * 1000 + k))
              ++failures;
      } catch (const std::exception& e) {
        ADD_FAILURE() << e.what();
        ++failures;
      }
    });
  }
  for (auto& w : workers) w.join();
  EXPECT_EQ(failures.load(), 0);
  auto store = connect_store(url, token, 5s);
  EXPECT_EQ(store->get("counter", 1s), std::to_string(threads * keys));
  EXPECT_EQ(store->add("counter", -threads * keys), 0);
}

// ---- file store --------------------------------------------------------------------------------

TEST(FileStore, SetGetAddFromSeveralThreads) {
  TempDir dir;
  exercise_store(dir.url(), "", 4, 20);
  for (const auto& entry : std::filesystem::directory_iterator(dir.path))
    EXPECT_FALSE(entry.path().filename().string().starts_with(".tmp-")) << entry.path();
}

TEST(FileStore, GetWaitsForALaterSet) {
  TempDir dir;
  auto store = connect_store(dir.url(), "", 1s);
  std::thread writer([&] {
    std::this_thread::sleep_for(100ms);
    connect_store(dir.url(), "", 1s)->set("late", "value");
  });
  EXPECT_EQ(store->get("late", 5s), "value");
  writer.join();
}

TEST(FileStore, GetTimesOutNamingTheKey) {
  TempDir dir;
  auto store = connect_store(dir.url(), "", 1s);
  std::string message;
  const auto start = Clock::now();
  EXPECT_EQ(error_code_of([&] { store->get("missing/key", 50ms); }, &message), ErrorCode::timeout);
  EXPECT_LT(Clock::now() - start, 2s);
  EXPECT_NE(message.find("store: key 'missing/key' not set after 50 ms"), std::string::npos) << message;
}

TEST(FileStore, OddKeysAndValues) {
  TempDir dir;
  auto store = connect_store(dir.url(), "", 1s);
  const std::vector<std::string> keys = {"a/b/c", ".", "..", "", "%2F", "/", "a b\n\xff", ".lock-x", ".tmp-y"};
  for (std::size_t i = 0; i < keys.size(); ++i) store->set(keys[i], "v" + std::to_string(i) + std::string(3, '\0'));
  for (std::size_t i = 0; i < keys.size(); ++i)
    EXPECT_EQ(store->get(keys[i], 1s), "v" + std::to_string(i) + std::string(3, '\0')) << keys[i];
  store->set("big", std::string(1 << 20, 'z'));
  EXPECT_EQ(store->get("big", 1s).size(), std::size_t{1} << 20);
  store->set("word", "hello");
  EXPECT_EQ(error_code_of([&] { store->add("word", 1); }), ErrorCode::invalid_argument);
}

TEST(StoreUrl, MalformedOrMissing) {
  std::string message;
  EXPECT_EQ(error_code_of([&] { connect_store("file:///no/such/dir/for/tutti", "", 100ms); }, &message),
            ErrorCode::invalid_argument);
  EXPECT_NE(message.find("TUTTI_STORE"), std::string::npos) << message;
  for (const char* url : {"", "http://x:1", "file://relative", "file://", "tcp://", "tcp://host", "tcp://host:",
                          "tcp://:80", "tcp://host:0", "tcp://host:65536", "tcp://host:12x", "tcp://::1:80"}) {
    EXPECT_EQ(error_code_of([&] { connect_store(url, "", 100ms); }, &message), ErrorCode::invalid_argument) << url;
    EXPECT_NE(message.find("TUTTI_STORE"), std::string::npos) << message;
  }
}

// ---- TCP store ---------------------------------------------------------------------------------

TEST(TcpStore, SetGetAddFromSeveralClients) {
  StoreServer server("127.0.0.1", 0, "token");
  EXPECT_EQ(server.url(), "tcp://127.0.0.1:" + std::to_string(server.port()));
  exercise_store(server.url(), "token", 4, 50);
  EXPECT_EQ(server.refused(), 0);
}

TEST(TcpStore, GetBlocksUntilSetAndTimesOut) {
  StoreServer server("127.0.0.1", 0, "t");
  auto reader = connect_store(server.url(), "t", 5s);
  auto writer = connect_store(server.url(), "t", 5s);
  auto value = std::async(std::launch::async, [&] { return reader->get("later", 5s); });
  EXPECT_EQ(value.wait_for(100ms), std::future_status::timeout);
  writer->set("later", "here");
  EXPECT_EQ(value.get(), "here");
  std::string message;
  EXPECT_EQ(error_code_of([&] { reader->get("never", 50ms); }, &message), ErrorCode::timeout);
  EXPECT_NE(message.find("store: key 'never' not set after 50 ms"), std::string::npos) << message;
  writer->set("never", "late");  // the reply to the abandoned get must not confuse the next call
  EXPECT_EQ(reader->get("later", 1s), "here");
  EXPECT_EQ(reader->add("n", 5), 5);
}

TEST(TcpStore, OneStoreSharedByThreads) {
  // A get blocked on one thread must not stop the set on another thread of the same Store.
  StoreServer server("127.0.0.1", 0, "t");
  auto store = connect_store(server.url(), "t", 5s);
  auto value = std::async(std::launch::async, [&] { return store->get("k", 5s); });
  std::this_thread::sleep_for(50ms);
  store->set("k", "v");
  EXPECT_EQ(value.get(), "v");
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&] {
      for (int i = 0; i < 100; ++i) store->add("shared", 1);
    });
  for (auto& t : threads) t.join();
  EXPECT_EQ(store->get("shared", 1s), "400");
}

TEST(TcpStore, WrongTokenIsRefusedOthersKeepWorking) {
  StoreServer server("127.0.0.1", 0, "right");
  auto good = connect_store(server.url(), "right", 5s);
  good->set("a", "1");
  std::string message;
  EXPECT_EQ(error_code_of([&] { connect_store(server.url(), "wrong", 5s); }, &message), ErrorCode::system);
  EXPECT_NE(message.find("authentication failed: wrong token"), std::string::npos) << message;
  EXPECT_NE(message.find("TUTTI_TOKEN"), std::string::npos) << message;
  EXPECT_TRUE(eventually([&] { return server.refused() == 1; }));
  EXPECT_EQ(good->get("a", 1s), "1");
  EXPECT_EQ(connect_store(server.url(), "right", 5s)->add("a", 1), 2);
  EXPECT_EQ(server.refused(), 1);
}

int raw_connect(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(static_cast<std::uint16_t>(port));
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)), 0);
  timeval limit{10, 0};  // no read below waits longer than this
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &limit, sizeof(limit));
  return fd;
}

// Reads until the server closes the connection; false if it is still open after ~10 s.
bool closed_by_server(int fd) {
  char buffer[256];
  for (;;) {
    const ssize_t got = ::recv(fd, buffer, sizeof(buffer), 0);
    if (got == 0 || (got < 0 && errno == ECONNRESET)) return true;
    if (got < 0) return false;
  }
}

TEST(TcpStore, JunkConnectionIsRefused) {
  StoreServer server("127.0.0.1", 0, "t");
  const int fd = raw_connect(server.port());
  const std::string junk = "GET / HTTP/1.1\r\nHost: localhost\r\n\r\n........................................";
  EXPECT_EQ(::send(fd, junk.data(), junk.size(), MSG_NOSIGNAL), static_cast<ssize_t>(junk.size()));
  EXPECT_TRUE(closed_by_server(fd));
  ::close(fd);
  EXPECT_TRUE(eventually([&] { return server.refused() == 1; }));
  EXPECT_EQ(connect_store(server.url(), "t", 5s)->add("x", 3), 3);
}

TEST(TcpStore, SilentConnectionIsClosedAfterTheHandshakeLimit) {
  StoreServer server("127.0.0.1", 0, "t");
  const int fd = raw_connect(server.port());
  auto other = connect_store(server.url(), "t", 5s);  // served while the silent one waits
  other->set("k", "v");
  const auto start = Clock::now();
  EXPECT_TRUE(closed_by_server(fd));
  EXPECT_LT(Clock::now() - start, 4s);  // the handshake limit is 2 s
  ::close(fd);
  EXPECT_TRUE(eventually([&] { return server.refused() == 1; }));
}

TEST(TcpStore, DestructorWithConnectedClientsDoesNotHang) {
  std::unique_ptr<Store> client;
  std::future<ErrorCode> blocked;
  int silent = -1;
  const auto start = Clock::now();
  {
    StoreServer server("127.0.0.1", 0, "t");
    client = connect_store(server.url(), "t", 5s);
    client->set("a", "b");
    silent = raw_connect(server.port());  // still in its handshake when the server goes
    blocked = std::async(std::launch::async, [&] { return error_code_of([&] { client->get("never", 20s); }); });
    std::this_thread::sleep_for(50ms);
  }
  EXPECT_LT(Clock::now() - start, 3s);
  EXPECT_EQ(blocked.wait_for(5s), std::future_status::ready);
  EXPECT_EQ(blocked.get(), ErrorCode::system);
  EXPECT_EQ(error_code_of([&] { client->set("a", "c"); }), ErrorCode::system);
  ::close(silent);
}

std::size_t open_descriptors() {
  return static_cast<std::size_t>(
      std::distance(std::filesystem::directory_iterator("/proc/self/fd"), std::filesystem::directory_iterator()));
}

TEST(TcpStore, ClosesEveryDescriptor) {
  const std::size_t before = open_descriptors();
  {
    StoreServer server("127.0.0.1", 0, "t");
    auto a = connect_store(server.url(), "t", 5s);
    auto b = connect_store(server.url(), "t", 5s);
    a->set("k", "v");
    EXPECT_EQ(b->get("k", 1s), "v");
    EXPECT_EQ(error_code_of([&] { connect_store(server.url(), "bad", 5s); }), ErrorCode::system);
    EXPECT_TRUE(eventually([&] { return server.refused() == 1; }));
  }
  EXPECT_EQ(open_descriptors(), before);
}

int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)), 0);
  socklen_t size = sizeof(address);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &size);
  ::close(fd);
  return ntohs(address.sin_port);
}

TEST(TcpStore, ClientWaitsForALateServerOrTimesOut) {
  const int port = free_port();
  const std::string url = "tcp://127.0.0.1:" + std::to_string(port);
  std::string message;
  EXPECT_EQ(error_code_of([&] { connect_store(url, "t", 100ms); }, &message), ErrorCode::timeout);
  EXPECT_NE(message.find("could not connect"), std::string::npos) << message;
  auto client = std::async(std::launch::async, [&] { return connect_store(url, "t", 5s); });
  std::this_thread::sleep_for(200ms);
  StoreServer server("127.0.0.1", port, "t");
  auto store = client.get();
  store->set("k", "v");
  EXPECT_EQ(store->get("k", 1s), "v");
}

TEST(TcpStore, WildcardUrlNamesTheHost) {
  StoreServer server("0.0.0.0", 0, "t");
  char name[256] = {};
  ASSERT_EQ(::gethostname(name, sizeof(name) - 1), 0);
  EXPECT_EQ(server.url(), "tcp://" + std::string(name) + ":" + std::to_string(server.port()));
  auto store = connect_store("tcp://127.0.0.1:" + std::to_string(server.port()), "t", 5s);
  EXPECT_EQ(store->add("k", 2), 2);
}

// A listener on 127.0.0.1:`port` that accepts connections and closes each at once, as a server
// too busy to take them would: the first `count` of them, or all until destroyed (count < 0).
class RudeServer {
 public:
  RudeServer(int port, int count) {
    fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    const int one = 1;
    ::setsockopt(fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_port = htons(static_cast<std::uint16_t>(port));
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(::bind(fd_, reinterpret_cast<sockaddr*>(&address), sizeof(address)), 0);
    EXPECT_EQ(::listen(fd_, 16), 0);
    thread_ = std::thread([this, count] {
      const auto deadline = Clock::now() + 20s;
      while (!stop_ && (count < 0 || closed_ < count) && Clock::now() < deadline) {
        pollfd entry{fd_, POLLIN, 0};
        if (::poll(&entry, 1, 20) <= 0) continue;
        const int fd = ::accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC);
        if (fd < 0) continue;
        ::close(fd);
        ++closed_;
      }
      ::close(fd_);  // the port is free again
    });
  }
  ~RudeServer() { finish(); }
  RudeServer(const RudeServer&) = delete;
  RudeServer& operator=(const RudeServer&) = delete;
  void finish() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
  }
  /// Waits until it has closed its `count` connections and its port (the test's bound: 20 s).
  void wait() {
    if (thread_.joinable()) thread_.join();
  }
  int closed() const { return closed_; }

 private:
  int fd_ = -1;
  std::atomic<bool> stop_{false};
  std::atomic<int> closed_{0};
  std::thread thread_;
};

TEST(TcpStore, ClientRetriesWhenTheServerClosesItDuringTheHandshake) {
  const int port = free_port();
  RudeServer rude(port, 1);
  auto client = std::async(std::launch::async,
                           [&] { return connect_store("tcp://127.0.0.1:" + std::to_string(port), "t", 10s); });
  rude.wait();  // it turned the client away once, and left
  EXPECT_EQ(rude.closed(), 1);
  StoreServer server("127.0.0.1", port, "t");
  ASSERT_EQ(client.wait_for(8s), std::future_status::ready);
  auto store = client.get();  // throws if the client gave up
  store->set("k", "v");
  EXPECT_EQ(store->get("k", 1s), "v");
  EXPECT_EQ(server.refused(), 0);
}

TEST(TcpStore, ClientGivesUpAtItsDeadlineSayingWhatHappened) {
  const int port = free_port();
  RudeServer rude(port, -1);
  std::string message;
  const auto start = Clock::now();
  EXPECT_EQ(error_code_of([&] { connect_store("tcp://127.0.0.1:" + std::to_string(port), "t", 600ms); }, &message),
            ErrorCode::timeout);
  EXPECT_LT(Clock::now() - start, 3s);
  EXPECT_NE(message.find("no handshake completed within 600 ms"), std::string::npos) << message;
  EXPECT_NE(message.find("closed the connection during the handshake (busy or flooded?)"), std::string::npos)
      << message;
  EXPECT_EQ(message.find("wrong token"), std::string::npos) << message;
  EXPECT_GE(rude.closed(), 2);  // it tried again
}

// The address the listening socket on `port` of this process is bound to, found among its
// descriptors; "" if there is none.
std::string listening_address(int port) {
  for (const auto& entry : std::filesystem::directory_iterator("/proc/self/fd")) {
    int fd = -1;
    try {
      fd = std::stoi(entry.path().filename().string());
    } catch (const std::exception&) {
      continue;
    }
    sockaddr_storage address{};
    socklen_t size = sizeof(address);
    int listening = 0;
    socklen_t flag_size = sizeof(listening);
    if (::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &size) != 0 ||
        ::getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &flag_size) != 0 || listening == 0)
      continue;
    char host[NI_MAXHOST] = "", service[NI_MAXSERV] = "";
    if (::getnameinfo(reinterpret_cast<sockaddr*>(&address), size, host, sizeof(host), service, sizeof(service),
                      NI_NUMERICHOST | NI_NUMERICSERV) == 0 &&
        std::string(service) == std::to_string(port))
      return host;
  }
  return "";
}

TEST(StoreBind, ServerListensOnItsHostOnly) {
  StoreServer server("127.0.0.1", 0, "t");
  EXPECT_EQ(listening_address(server.port()), "127.0.0.1");
  StoreServer wildcard("0.0.0.0", 0, "t");
  EXPECT_EQ(listening_address(wildcard.port()), "0.0.0.0");
  std::optional<StoreServer> v6;
  try {
    v6.emplace("::1", 0, "t");
  } catch (const Error& e) {
    GTEST_SKIP() << "no IPv6 loopback here: " << e.what();
  }
  EXPECT_EQ(listening_address(v6->port()), "::1");
  EXPECT_EQ(v6->url(), "tcp://[::1]:" + std::to_string(v6->port()));
  EXPECT_EQ(connect_store(v6->url(), "t", 5s)->add("n", 4), 4);
}

TEST(StoreBind, RankZeroHostsTheStoreOnTheUrlsHost) {
  JobInfo job;
  job.size = 2;
  job.local_size = 2;
  job.token = "t";
  job.store = "tcp://127.0.0.1:" + std::to_string(free_port());
  auto server = host_store(job);
  ASSERT_NE(server, nullptr);
  EXPECT_EQ(listening_address(server->port()), "127.0.0.1");  // not 0.0.0.0: no other host reaches it
  EXPECT_EQ(server->url(), job.store);
  EXPECT_EQ(connect_store(job.store, "t", 5s)->add("n", 1), 1);
  EXPECT_EQ(host_store(job), nullptr);  // the port is served already: someone else hosts it
  JobInfo other = job;
  other.rank = 1;
  EXPECT_EQ(host_store(other), nullptr);
  other = job;
  other.store = "file:///tmp";
  EXPECT_EQ(host_store(other), nullptr);
  other = job;
  other.store = "tcp://127.0.0.1";
  EXPECT_EQ(error_code_of([&] { host_store(other); }), ErrorCode::invalid_argument);
}

// ---- file store permissions --------------------------------------------------------------------

TEST(FileStore, WarnsWhenOthersCanWriteTheDirectory) {
  TempDir open_dir, group_dir, private_dir;
  ASSERT_EQ(::chmod(open_dir.path.c_str(), 0777), 0);
  ASSERT_EQ(::chmod(group_dir.path.c_str(), 0770), 0);
  ::testing::internal::CaptureStderr();
  connect_store(open_dir.url(), "", 1s)->set("k", "v");
  connect_store(open_dir.url(), "", 1s)->set("k", "w");  // said once per directory
  connect_store(group_dir.url(), "", 1s)->set("k", "v");
  connect_store(private_dir.url(), "", 1s)->set("k", "v");
  const std::string said = ::testing::internal::GetCapturedStderr();
  const std::string open_warning =
      "the file store directory '" + open_dir.path + "' has mode 0777 (writable by its group and others)";
  const auto first = said.find(open_warning);
  ASSERT_NE(first, std::string::npos) << said;
  EXPECT_EQ(said.find(open_warning, first + 1), std::string::npos) << said;
  EXPECT_NE(said.find("forge or replace the job's keys"), std::string::npos) << said;
  EXPECT_NE(said.find("'" + group_dir.path + "' has mode 0770 (writable by its group)"), std::string::npos) << said;
  EXPECT_EQ(said.find(private_dir.path), std::string::npos) << said;
  EXPECT_EQ(connect_store(open_dir.url(), "", 1s)->get("k", 1s), "w");  // a warning, not a refusal
}

TEST(FileStore, WarnsWhenAnotherUserOwnsTheDirectory) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to give a directory away";
  TempDir dir;
  ASSERT_EQ(::chown(dir.path.c_str(), 65534, 65534), 0);
  ::testing::internal::CaptureStderr();
  connect_store(dir.url(), "", 1s);
  const std::string said = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(said.find("'" + dir.path + "' is owned by uid 65534, not by this user (uid 0)"), std::string::npos) << said;
}

// ---- detect_job --------------------------------------------------------------------------------

// Clears every variable detect_job reads, sets the given ones, and puts the environment back.
class Environment {
 public:
  explicit Environment(const std::map<std::string, std::string>& values) {
    for (const char* name : names_) {
      const char* old = std::getenv(name);
      if (old != nullptr) saved_[name] = old;
      ::unsetenv(name);
    }
    for (const auto& [name, value] : values) {
      EXPECT_TRUE(std::find(std::begin(names_), std::end(names_), name) != std::end(names_)) << name;
      ::setenv(name.c_str(), value.c_str(), 1);
    }
  }
  ~Environment() {
    for (const char* name : names_) ::unsetenv(name);
    for (const auto& [name, value] : saved_) ::setenv(name.c_str(), value.c_str(), 1);
  }
  Environment(const Environment&) = delete;
  Environment& operator=(const Environment&) = delete;

 private:
  static constexpr const char* names_[] = {"TUTTI_INSECURE",
                                           "TUTTI_RANK",
                                           "TUTTI_SIZE",
                                           "TUTTI_LOCAL_RANK",
                                           "TUTTI_LOCAL_SIZE",
                                           "TUTTI_STORE",
                                           "TUTTI_TOKEN",
                                           "TUTTI_JOB_ID",
                                           "TUTTI_TRANSPORT",
                                           "OMPI_COMM_WORLD_RANK",
                                           "OMPI_COMM_WORLD_SIZE",
                                           "OMPI_COMM_WORLD_LOCAL_RANK",
                                           "OMPI_COMM_WORLD_LOCAL_SIZE",
                                           "OMPI_MCA_ess_base_jobid",
                                           "PMIX_NAMESPACE",
                                           "PMI_RANK",
                                           "PMI_SIZE",
                                           "MPI_LOCALRANKID",
                                           "MPI_LOCALNRANKS",
                                           "SLURM_PROCID",
                                           "SLURM_NTASKS",
                                           "SLURM_LOCALID",
                                           "SLURM_NTASKS_PER_NODE",
                                           "SLURM_TASKS_PER_NODE",
                                           "SLURM_NODEID",
                                           "SLURM_JOB_ID",
                                           "SLURM_STEP_ID",
                                           "RANK",
                                           "WORLD_SIZE",
                                           "LOCAL_RANK",
                                           "LOCAL_WORLD_SIZE",
                                           "TORCHELASTIC_RUN_ID",
                                           "TORCHELASTIC_RESTART_COUNT"};
  std::map<std::string, std::string> saved_;
};

TEST(DetectJob, NoLauncher) {
  Environment env({});
  const JobInfo job = detect_job();
  EXPECT_EQ(job.launcher, "none");
  EXPECT_EQ(job.rank, 0);
  EXPECT_EQ(job.size, 1);
  EXPECT_EQ(job.local_size, 1);
  EXPECT_TRUE(job.store.empty() && job.token.empty() && job.job_id.empty() && job.transport.empty());
}

TEST(DetectJob, TuttiRun) {
  {
    Environment env({{"TUTTI_RANK", "2"},
                     {"TUTTI_SIZE", "4"},
                     {"TUTTI_STORE", "file:///tmp/x"},
                     {"TUTTI_TOKEN", "abc"},
                     {"TUTTI_JOB_ID", "j1"},
                     {"TUTTI_TRANSPORT", "tcp"},
                     {"OMPI_COMM_WORLD_RANK", "0"},
                     {"OMPI_COMM_WORLD_SIZE", "1"}});  // tutti-run wins
    const JobInfo job = detect_job();
    EXPECT_EQ(job.launcher, "tutti-run");
    EXPECT_EQ(job.rank, 2);
    EXPECT_EQ(job.size, 4);
    EXPECT_EQ(job.local_rank, 2);
    EXPECT_EQ(job.local_size, 4);
    EXPECT_EQ(job.store, "file:///tmp/x");
    EXPECT_EQ(job.token, "abc");
    EXPECT_EQ(job.job_id, "j1");
    EXPECT_EQ(job.transport, "tcp");
  }
  Environment env({{"TUTTI_RANK", "5"}, {"TUTTI_SIZE", "8"}, {"TUTTI_LOCAL_RANK", "1"}, {"TUTTI_LOCAL_SIZE", "4"}});
  const JobInfo job = detect_job();
  EXPECT_EQ(job.local_rank, 1);
  EXPECT_EQ(job.local_size, 4);
}

TEST(DetectJob, OpenMpi) {
  {
    Environment env({{"OMPI_COMM_WORLD_RANK", "3"},
                     {"OMPI_COMM_WORLD_SIZE", "6"},
                     {"OMPI_COMM_WORLD_LOCAL_RANK", "0"},
                     {"OMPI_COMM_WORLD_LOCAL_SIZE", "3"},
                     {"OMPI_MCA_ess_base_jobid", "4242"},
                     {"PMIX_NAMESPACE", "ns"},
                     {"TUTTI_STORE", "tcp://h:1"}});
    const JobInfo job = detect_job();
    EXPECT_EQ(job.launcher, "mpirun");
    EXPECT_EQ(job.rank, 3);
    EXPECT_EQ(job.size, 6);
    EXPECT_EQ(job.local_rank, 0);
    EXPECT_EQ(job.local_size, 3);
    EXPECT_EQ(job.job_id, "4242");
    EXPECT_EQ(job.store, "tcp://h:1");
  }
  Environment env({{"OMPI_COMM_WORLD_RANK", "0"},
                   {"OMPI_COMM_WORLD_SIZE", "2"},
                   {"PMIX_NAMESPACE", "prterun-x@1"},
                   {"TUTTI_JOB_ID", "override"}});
  EXPECT_EQ(detect_job().job_id, "override");
  ::unsetenv("TUTTI_JOB_ID");
  EXPECT_EQ(detect_job().job_id, "prterun-x@1");
}

TEST(DetectJob, MpichHydra) {
  Environment env({{"PMI_RANK", "1"}, {"PMI_SIZE", "2"}, {"MPI_LOCALRANKID", "1"}, {"MPI_LOCALNRANKS", "2"}});
  const JobInfo job = detect_job();
  EXPECT_EQ(job.launcher, "mpirun");
  EXPECT_EQ(job.rank, 1);
  EXPECT_EQ(job.size, 2);
  EXPECT_EQ(job.local_rank, 1);
  EXPECT_EQ(job.local_size, 2);
}

TEST(DetectJob, Slurm) {
  {
    Environment env({{"SLURM_PROCID", "5"},
                     {"SLURM_NTASKS", "7"},
                     {"SLURM_LOCALID", "1"},
                     {"SLURM_TASKS_PER_NODE", "4,2(x2)"},
                     {"SLURM_NODEID", "2"},
                     {"SLURM_JOB_ID", "123"},
                     {"SLURM_STEP_ID", "0"}});
    const JobInfo job = detect_job();
    EXPECT_EQ(job.launcher, "srun");
    EXPECT_EQ(job.rank, 5);
    EXPECT_EQ(job.size, 7);
    EXPECT_EQ(job.local_rank, 1);
    EXPECT_EQ(job.local_size, 2);
    EXPECT_EQ(job.job_id, "123.0");
  }
  {
    // Runs are walked, not expanded: a repeat of two billion costs nothing (it was an 8 GiB vector).
    Environment env({{"SLURM_PROCID", "0"},
                     {"SLURM_NTASKS", "4"},
                     {"SLURM_LOCALID", "0"},
                     {"SLURM_TASKS_PER_NODE", "1(x2000000000),3"},
                     {"SLURM_NODEID", "2000000000"}});
    EXPECT_EQ(detect_job().local_size, 3);
  }
  Environment env({{"SLURM_PROCID", "3"},
                   {"SLURM_NTASKS", "8"},
                   {"SLURM_LOCALID", "3"},
                   {"SLURM_NTASKS_PER_NODE", "4"},
                   {"SLURM_TASKS_PER_NODE", "garbage"},
                   {"SLURM_JOB_ID", "9"}});
  const JobInfo job = detect_job();
  EXPECT_EQ(job.local_size, 4);
  EXPECT_EQ(job.job_id, "9");
}

TEST(DetectJob, Torchrun) {
  {
    Environment env({{"RANK", "3"},
                     {"WORLD_SIZE", "8"},
                     {"LOCAL_RANK", "1"},
                     {"LOCAL_WORLD_SIZE", "2"},
                     {"TORCHELASTIC_RUN_ID", "f00d-42"},
                     {"TORCHELASTIC_RESTART_COUNT", "2"},
                     {"SLURM_PROCID", "1"},  // torchrun under srun: the worker's variables win over the agent's
                     {"SLURM_NTASKS", "4"}});
    const JobInfo job = detect_job();
    EXPECT_EQ(job.launcher, "torchrun");
    EXPECT_EQ(job.rank, 3);
    EXPECT_EQ(job.size, 8);
    EXPECT_EQ(job.local_rank, 1);
    EXPECT_EQ(job.local_size, 2);
    EXPECT_EQ(job.job_id, "f00d-42.2");  // each restart is a job of its own
  }
  {
    // torchrun's default rendezvous id "none" is every job's: no id.
    Environment env({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"TORCHELASTIC_RUN_ID", "none"}});
    const JobInfo job = detect_job();
    EXPECT_EQ(job.launcher, "torchrun");
    EXPECT_TRUE(job.job_id.empty());
    EXPECT_EQ(job.local_size, 2);
  }
  {
    Environment env({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"TORCHELASTIC_RUN_ID", "a/b"}});
    std::string message;
    EXPECT_EQ(error_code_of([] { detect_job(); }, &message), ErrorCode::invalid_argument);
    EXPECT_NE(message.find("TUTTI_JOB_ID"), std::string::npos) << message;
  }
  {
    // A caller that gives rank and size itself (init(store, rank, size), the torch backend) is not
    // refused for the launcher's partial or odd rank variables (PyTorch's test harness exports
    // WORLD_SIZE alone); the job id is still read.
    Environment env({{"WORLD_SIZE", "3"}, {"TORCHELASTIC_RUN_ID", "r9"}, {"TUTTI_TOKEN", "t"}});
    EXPECT_EQ(error_code_of([] { detect_job(); }), ErrorCode::invalid_argument);
    const JobInfo job = detect_job(/*ranks_from_caller=*/true);
    EXPECT_EQ(job.launcher, "torchrun");
    EXPECT_EQ(job.job_id, "r9");
    EXPECT_EQ(job.token, "t");
  }
  // tutti-run's and mpirun's variables win over torchrun's.
  Environment env({{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "3"}});
  EXPECT_EQ(detect_job().launcher, "mpirun");
  EXPECT_EQ(detect_job().size, 3);
}

TEST(DetectJob, MalformedValuesNameTheVariable) {
  const std::vector<std::pair<std::map<std::string, std::string>, std::string>> cases = {
      {{{"TUTTI_RANK", "abc"}, {"TUTTI_SIZE", "4"}}, "TUTTI_RANK"},
      {{{"TUTTI_RANK", "1"}, {"TUTTI_SIZE", " 4"}}, "TUTTI_SIZE"},
      {{{"TUTTI_RANK", "+1"}, {"TUTTI_SIZE", "4"}}, "TUTTI_RANK"},
      {{{"TUTTI_RANK", "-1"}, {"TUTTI_SIZE", "4"}}, "TUTTI_RANK"},
      {{{"TUTTI_RANK", "1x"}, {"TUTTI_SIZE", "4"}}, "TUTTI_RANK"},
      {{{"TUTTI_RANK", "0"}, {"TUTTI_SIZE", "99999999999"}}, "TUTTI_SIZE"},
      {{{"TUTTI_RANK", "4"}, {"TUTTI_SIZE", "4"}}, "TUTTI_RANK"},
      {{{"TUTTI_RANK", "0"}, {"TUTTI_SIZE", "0"}}, "TUTTI_SIZE"},
      {{{"TUTTI_RANK", "0"}}, "TUTTI_SIZE"},
      {{{"TUTTI_RANK", "1"}, {"TUTTI_SIZE", "4"}, {"TUTTI_LOCAL_RANK", "2"}, {"TUTTI_LOCAL_SIZE", "2"}},
       "TUTTI_LOCAL_RANK"},
      {{{"TUTTI_RANK", "1"}, {"TUTTI_SIZE", "4"}, {"TUTTI_LOCAL_SIZE", "5"}}, "TUTTI_LOCAL_SIZE"},
      {{{"TUTTI_TRANSPORT", "udp"}}, "TUTTI_TRANSPORT"},
      {{{"OMPI_COMM_WORLD_RANK", "2"}}, "OMPI_COMM_WORLD_SIZE"},
      {{{"OMPI_COMM_WORLD_RANK", "2"}, {"OMPI_COMM_WORLD_SIZE", "2"}}, "OMPI_COMM_WORLD_RANK"},
      {{{"PMI_RANK", "0"}, {"PMI_SIZE", "1"}, {"MPI_LOCALRANKID", "x"}}, "MPI_LOCALRANKID"},
      {{{"WORLD_SIZE", "4"}}, "RANK"},  // never a quiet job of one rank
      {{{"RANK", "4"}, {"WORLD_SIZE", "4"}}, "RANK"},
      {{{"RANK", "0"}, {"WORLD_SIZE", "4"}, {"LOCAL_WORLD_SIZE", "x"}}, "LOCAL_WORLD_SIZE"},
      {{{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "4"}, {"SLURM_TASKS_PER_NODE", "2(x"}}, "SLURM_TASKS_PER_NODE"},
      {{{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "4"}, {"SLURM_TASKS_PER_NODE", "2"}, {"SLURM_NODEID", "1"}},
       "SLURM_TASKS_PER_NODE"},
  };
  for (const auto& [values, name] : cases) {
    Environment env(values);
    std::string message;
    EXPECT_EQ(error_code_of([] { detect_job(); }, &message), ErrorCode::invalid_argument) << name;
    EXPECT_NE(message.find(name), std::string::npos) << name << ": " << message;
  }
}

// ---- the token policy ---------------------------------------------------------------------------

void expect_names_the_token(const std::string& message) {
  EXPECT_NE(message.find("TUTTI_TOKEN is not set"), std::string::npos) << message;
  EXPECT_NE(message.find("openssl rand -hex 32"), std::string::npos) << message;  // how to make one
  EXPECT_NE(message.find("TUTTI_INSECURE=1"), std::string::npos) << message;      // and how to opt out
}

TEST(TokenPolicy, TcpStoreClientRefusesToStartWithoutAToken) {
  for (const char* insecure : {"", "0", "yes"}) {
    Environment env(*insecure ? std::map<std::string, std::string>{{"TUTTI_INSECURE", insecure}}
                              : std::map<std::string, std::string>{});
    std::string message;
    const auto start = Clock::now();
    EXPECT_EQ(error_code_of([&] { connect_store("tcp://127.0.0.1:9", "", 5s); }, &message),
              ErrorCode::invalid_argument);
    EXPECT_LT(Clock::now() - start, 1s);  // at once, before any connection
    expect_names_the_token(message);
    EXPECT_NE(message.find("TUTTI_STORE=tcp://127.0.0.1:9"), std::string::npos) << message;
  }
  Environment env({});
  auto file_store = connect_store(TempDir().url(), "", 1s);  // file:// needs no token
}

TEST(TokenPolicy, StoreServerRefusesToStartWithoutAToken) {
  Environment env({});
  std::string message;
  EXPECT_EQ(error_code_of([&] { StoreServer server("127.0.0.1", 0, ""); }, &message), ErrorCode::invalid_argument);
  expect_names_the_token(message);
  EXPECT_NE(message.find("store server"), std::string::npos) << message;
}

TEST(TokenPolicy, InitReportsAMissingTokenOnEveryRank) {
  const std::string store = "tcp://127.0.0.1:" + std::to_string(free_port());
  for (const char* rank : {"0", "1"}) {  // rank 0 would host the store; rank 1 only connects
    Environment env({{"TUTTI_RANK", rank}, {"TUTTI_SIZE", "2"}, {"TUTTI_STORE", store}, {"TUTTI_JOB_ID", "tok"}});
    std::string message;
    const auto start = Clock::now();
    EXPECT_EQ(error_code_of([] { tutti::init(); }, &message), ErrorCode::invalid_argument) << rank;
    EXPECT_LT(Clock::now() - start, 2s);
    expect_names_the_token(message);
  }
}

// Two jobs without ids sharing a store would join each other: every rank refuses at once.
TEST(JobId, InitWithoutAJobIdRefusesNamingTheVariable) {
  const TempDir dir;
  for (const char* rank : {"0", "1"}) {
    Environment env({{"TUTTI_RANK", rank}, {"TUTTI_SIZE", "2"}, {"TUTTI_STORE", dir.url()}});
    std::string message;
    const auto start = Clock::now();
    EXPECT_EQ(error_code_of([] { tutti::init(); }, &message), ErrorCode::invalid_argument) << rank;
    EXPECT_LT(Clock::now() - start, 2s);
    EXPECT_NE(message.find("no job id"), std::string::npos) << message;
    EXPECT_NE(message.find("set TUTTI_JOB_ID"), std::string::npos) << message;
  }
}

TEST(JobId, AMalformedJobIdIsRefusedNamingItsSource) {
  for (const char* id : {"a/b", "x y", "../up"}) {
    Environment env({{"TUTTI_RANK", "0"}, {"TUTTI_SIZE", "2"}, {"TUTTI_JOB_ID", id}});
    std::string message;
    EXPECT_EQ(error_code_of([] { detect_job(); }, &message), ErrorCode::invalid_argument) << id;
    EXPECT_NE(message.find("TUTTI_JOB_ID"), std::string::npos) << message;
  }
}

TEST(TokenPolicy, InsecureOptOutWorksAndWarns) {
  Environment env(std::map<std::string, std::string>{{"TUTTI_INSECURE", "1"}});
  ::testing::internal::CaptureStderr();
  {
    StoreServer server("127.0.0.1", 0, "");
    auto store = connect_store(server.url(), "", 5s);
    store->set("k", "v");
    EXPECT_EQ(store->get("k", 1s), "v");
  }
  const std::string said = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(said.find("WARN: TUTTI_INSECURE=1: the tcp:// store"), std::string::npos) << said;
  EXPECT_NE(said.find("WITHOUT authentication"), std::string::npos) << said;
}

}  // namespace
}  // namespace tutti::bootstrap
