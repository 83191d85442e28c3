// The shared-memory transport. The segment is shared memory whoever maps it, so most tests run
// ranks as threads of this process, each attaching with shm::open like a process would; the
// tests about processes (a killed rank) fork. Every call has a deadline, every forked child is
// reaped (killed on timeout), and no /dev/shm/tutti-test-<pid>-* may be left after any test.
#include <dirent.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <thread>

#include "collective_cases.hpp"
#include "comm/access.hpp"
#include "comm/comm_impl.hpp"
#include "processes.hpp"
#include "shm_names.hpp"
#include "threads.hpp"
#include "transport/matching.hpp"
#include "transport/shm/segment.hpp"
#include "transport/shm/shm.hpp"
#include "transport/shm/shm_transport.hpp"

namespace tutti::testing {
namespace {

using namespace std::chrono_literals;
using transport::Completion;
using transport::MessageKey;

constexpr std::chrono::milliseconds timeout{30000};
constexpr std::chrono::milliseconds attach_timeout{20000};

// Point-to-point calls take the communicator's default deadline: keep it bounded too.
const int bounded_default_timeout = setenv("TUTTI_TIMEOUT_MS", "30000", 0);

Communicator communicator(std::unique_ptr<transport::Transport> transport) {
  return comm::Access::make(std::make_shared<comm::CommImpl>(std::move(transport)));
}

// Runs fn(comm) on p threads, rank r attaching to a fresh segment as rank r; returns the failures.
std::string run_shm(int p, const std::function<void(Communicator&)>& fn) {
  const std::string name = unique_shm_name();
  return on_threads(p, [&](int r) {
    Communicator comm = communicator(transport::shm::open(name, r, p, 7, attach_timeout));
    fn(comm);
  });
}

// Two ranks of a fresh segment, for one thread to drive both (transport level); `collective_copy`,
// where given, is the TUTTI_SHM_COLLECTIVE_COPY they attach with (unset again afterwards).
std::array<std::unique_ptr<transport::Transport>, 2> open_pair(const char* collective_copy = nullptr) {
  if (collective_copy != nullptr) setenv("TUTTI_SHM_COLLECTIVE_COPY", collective_copy, 1);
  const std::string name = unique_shm_name();
  std::array<std::unique_ptr<transport::Transport>, 2> t;
  std::thread other([&] { t[1] = transport::shm::open(name, 1, 2, 3, attach_timeout); });
  t[0] = transport::shm::open(name, 0, 2, 3, attach_timeout);
  other.join();
  if (collective_copy != nullptr) unsetenv("TUTTI_SHM_COLLECTIVE_COPY");
  return t;
}

class Shm : public ::testing::Test {
 protected:
  void TearDown() override { EXPECT_EQ(shm_leftovers(), std::vector<std::string>{}); }
};

TEST_F(Shm, AttachUnlinksTheName) {
  const std::string name = unique_shm_name();
  std::atomic<int> wrong{0};
  std::vector<std::thread> threads;
  for (int r = 0; r < 3; ++r)
    threads.emplace_back([&, r] {
      auto t = transport::shm::open(name, r, 3, 42, attach_timeout);
      if (t->rank() != r || t->size() != 3 || t->id() != 42) ++wrong;
    });
  for (auto& t : threads) t.join();
  EXPECT_EQ(wrong.load(), 0);
  EXPECT_NE(access(("/dev/shm/" + name).c_str(), F_OK), 0);
}

TEST_F(Shm, AttachTimesOutWhenARankIsMissing) {
  const std::string name = unique_shm_name();
  try {
    transport::shm::open(name, 0, 2, 1, 200ms);
    FAIL() << "open returned without rank 1";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::timeout) << e.what();
  }
  try {
    transport::shm::open(unique_shm_name(), 1, 2, 1, 200ms);
    FAIL() << "open returned without rank 0";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::timeout) << e.what();
  }
}

// Exact integer values: element i of rank r is (r + 1) * (i % 7 + 1); the sum is p(p+1)/2 * (i % 7 + 1).
TEST_F(Shm, AllreduceEveryAlgorithmAndSize) {
  for (int p : {1, 2, 3, 5, 8}) {
    std::atomic<int> wrong{0};
    const std::string failures = run_shm(p, [&](Communicator& comm) {
      const int r = comm.rank();
      for (Algorithm a : algorithms_with_automatic(Collective::allreduce))
        for (std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{1000}, std::size_t{1000003}}) {
          std::vector<float> send(n), recv(n, std::nanf(""));
          for (std::size_t i = 0; i < n; ++i) send[i] = static_cast<float>((r + 1) * static_cast<int>(i % 7 + 1));
          comm.allreduce(send.data(), recv.data(), n, DataType::f32, ReduceOp::sum, {a, timeout});
          const float scale = static_cast<float>(p * (p + 1) / 2);
          for (std::size_t i = 0; i < n; ++i)
            if (recv[i] != scale * static_cast<float>(i % 7 + 1)) {
              ADD_FAILURE() << to_string(a) << " p=" << p << " n=" << n << " rank " << r << " element " << i << " = "
                            << recv[i];
              ++wrong;
              break;
            }
        }
    });
    EXPECT_EQ(failures, "") << "p=" << p;
    EXPECT_EQ(wrong.load(), 0) << "p=" << p;
  }
}

// The in-process suite's sweep (every collective × algorithm × count × place), run over shm:
// all cases of one p on one communicator, so that sequence numbers and rings are reused.
std::string run_cases(int p, const std::vector<Case>& cases) {
  return run_shm(p, [&](Communicator& comm) {
    for (const Case& c : cases) {
      if (c.p != p) continue;
      const std::string wrong = run_rank(comm, c);
      if (!wrong.empty()) throw std::runtime_error(name_of(c) + ": " + wrong);
    }
  });
}

TEST_F(Shm, CollectiveSweep) {
  const auto cases = sweep_cases();
  for (int p : {1, 2, 3, 5, 8}) EXPECT_EQ(run_cases(p, cases), "") << "p=" << p;
}

TEST_F(Shm, CollectiveTypes) {
  const auto cases = type_cases();
  for (int p : {3, 5, 8}) EXPECT_EQ(run_cases(p, cases), "") << "p=" << p;
}

TEST_F(Shm, CollectiveMidCountsAutomatic) {
  for (int p : {2, 3, 5}) EXPECT_EQ(run_cases(p, mid_cases({p})), "") << "p=" << p;
}

// Two tests (p = 3 and p = 8) so that a run can take one: TSan takes p = 3 only.
TEST_F(Shm, CollectiveLargeCountsThreeRanks) { EXPECT_EQ(run_cases(3, large_cases()), ""); }

TEST_F(Shm, CollectiveLargeCountsEightRanks) { EXPECT_EQ(run_cases(8, large_cases()), ""); }

// Messages many times the ring, zero-byte messages, and messages that arrive before their
// receive is posted (received in the reverse order of sending).
TEST_F(Shm, SendRecvLargeEmptyAndUnexpected) {
  const std::size_t ring_bytes =
      std::size_t{transport::shm::Layout::for_size(3).slots} * transport::shm::Layout::for_size(3).payload;
  const std::size_t big = 5 * ring_bytes / sizeof(std::int32_t) + 13;
  const std::string failures = run_shm(3, [&](Communicator& comm) {
    const int r = comm.rank(), p = comm.size();
    const int right = (r + 1) % p, left = (r + p - 1) % p;
    std::vector<std::int32_t> out(big), in(big, -1);
    for (std::size_t i = 0; i < big; ++i) out[i] = static_cast<std::int32_t>(i * 31 + static_cast<std::size_t>(r));
    Request s = comm.isend(out.data(), big, DataType::i32, right, 5);
    comm.recv(in.data(), big, DataType::i32, left, 5);
    s.wait();
    for (std::size_t i = 0; i < big; ++i)
      if (in[i] != static_cast<std::int32_t>(i * 31 + static_cast<std::size_t>(left)))
        throw std::runtime_error("large message wrong at " + std::to_string(i));
    // Sends complete once matched (as over inproc): a ring of blocking sends would deadlock.
    Request empty = comm.isend(nullptr, 0, DataType::u8, right, 6);
    comm.recv(nullptr, 0, DataType::u8, left, 6);
    empty.wait();
    // Three tagged messages, received last first: the first two wait in the unexpected store.
    std::vector<Request> sends;
    std::vector<std::vector<std::int64_t>> data(3), got(3);
    for (int tag = 0; tag < 3; ++tag) {
      data[static_cast<std::size_t>(tag)].assign(1000 + static_cast<std::size_t>(tag) * 70000, r * 100 + tag);
      got[static_cast<std::size_t>(tag)].assign(data[static_cast<std::size_t>(tag)].size(), -1);
      auto& d = data[static_cast<std::size_t>(tag)];
      sends.push_back(comm.isend(d.data(), d.size(), DataType::i64, right, tag));
    }
    std::this_thread::sleep_for(20ms);
    for (int tag = 2; tag >= 0; --tag) {
      auto& g = got[static_cast<std::size_t>(tag)];
      comm.recv(g.data(), g.size(), DataType::i64, left, tag);
      for (std::int64_t v : g)
        if (v != left * 100 + tag) throw std::runtime_error("tag " + std::to_string(tag) + " got " + std::to_string(v));
    }
    for (auto& s2 : sends) s2.wait();
    // To itself, through its own ring.
    std::vector<std::int32_t> mine(100000, r), back(100000, -1);
    Request to_self = comm.isend(mine.data(), mine.size(), DataType::i32, r, 8);
    comm.recv(back.data(), back.size(), DataType::i32, r, 8);
    to_self.wait();
    if (back != mine) throw std::runtime_error("message to itself differs");
  });
  EXPECT_EQ(failures, "");
}

// Messages of reference_bytes and more (where the segment allows single copy, as between threads
// of one process): one chunk, read by the receiver from the sender's buffer; received before and
// after its receive was posted, from any source, to itself, by sendrecv around the ring; every
// element is the sender's and the index's. Then the same calls where single copy is off.
TEST_F(Shm, LargeMessagesTravelByReferenceExactly) {
  const std::size_t n = transport::shm::reference_bytes / sizeof(std::int32_t) + 13;
  const auto value = [](int from, std::size_t i, int tag) {
    return static_cast<std::int32_t>(static_cast<std::size_t>(from) * 1'000'003 + i * 7 +
                                     static_cast<std::size_t>(tag));
  };
  for (const char* single_copy : {"1", "0"}) {
    setenv("TUTTI_SHM_SINGLE_COPY", single_copy, 1);
    const std::string failures = run_shm(3, [&](Communicator& comm) {
      const int r = comm.rank(), p = comm.size();
      const int right = (r + 1) % p, left = (r + p - 1) % p;
      std::vector<std::int32_t> out(n), in(n);
      const auto fill = [&](int tag) {
        for (std::size_t i = 0; i < n; ++i) out[i] = value(r, i, tag);
        std::fill(in.begin(), in.end(), -1);
      };
      const auto check = [&](int from, int tag, const std::string& what) {
        for (std::size_t i = 0; i < n; ++i)
          if (in[i] != value(from, i, tag))
            throw std::runtime_error(what + ": element " + std::to_string(i) + " is " + std::to_string(in[i]));
      };
      fill(1);  // the receive posted first
      Request received = comm.irecv(in.data(), n, DataType::i32, left, 1);
      comm.barrier();
      comm.send(out.data(), n, DataType::i32, right, 1);
      received.wait();
      check(left, 1, "posted first");
      fill(2);  // the message first: kept as unexpected until its receive
      Request sent = comm.isend(out.data(), n, DataType::i32, right, 2);
      std::this_thread::sleep_for(20ms);
      comm.barrier();
      comm.recv(in.data(), n, DataType::i32, left, 2);
      sent.wait();
      check(left, 2, "unexpected");
      fill(3);
      if (comm.sendrecv(out.data(), n, right, in.data(), n, any_source, DataType::i32, 3, 3) != left)
        throw std::runtime_error("any source: another sender");
      check(left, 3, "any source");
      fill(4);
      comm.sendrecv(out.data(), n, r, in.data(), n, r, DataType::i32, 4, 4);
      check(r, 4, "to itself");
    });
    EXPECT_EQ(failures, "") << "TUTTI_SHM_SINGLE_COPY=" << single_copy;
  }
  unsetenv("TUTTI_SHM_SINGLE_COPY");
}

// Transport level: a message of reference_bytes is one chunk that says so and carries the
// sender's address; the send completes only once the receiver has read it; a receive of another
// size fails both sides with the sizes, and nothing is read into it.
TEST_F(Shm, AMessageByReferenceIsOneChunkReadBeforeItsAck) {
  auto t = open_pair();
  auto& segment = static_cast<transport::shm::ShmTransport&>(*t[0]).segment();
  ASSERT_TRUE(segment.single_copy());
  const std::size_t bytes = transport::shm::reference_bytes;
  std::vector<std::byte> out(bytes), in(bytes + 64, std::byte{0x5a});
  for (std::size_t i = 0; i < bytes; ++i) out[i] = static_cast<std::byte>(i * 13 % 251);
  Completion sent, received;
  const MessageKey key{transport::Channel::point_to_point, 9, 0};
  t[0]->post_send(1, key, out.data(), bytes, &sent);
  auto& ring = segment.ring(0, 1);
  ASSERT_EQ(ring.head.load(), 1u);
  const auto header = transport::shm::read_chunk(segment, 0, 1, 0);
  EXPECT_EQ(header.by_reference, 1);
  EXPECT_EQ(header.total, bytes);
  std::uint64_t address = 0;
  std::memcpy(&address, segment.payload(0, 1, 0), sizeof address);
  EXPECT_EQ(address, reinterpret_cast<std::uintptr_t>(out.data()));
  for (int i = 0; i < 5; ++i) t[0]->progress();
  EXPECT_EQ(sent.state(), Completion::posted);  // nobody read it yet
  t[1]->progress();                             // unexpected: only the address is kept
  t[1]->post_recv(0, key, in.data(), bytes, &received);
  EXPECT_EQ(received.state(), Completion::done);
  for (int i = 0; i < 5 && sent.state() == Completion::posted; ++i) t[0]->progress();
  EXPECT_EQ(sent.state(), Completion::done);
  EXPECT_TRUE(std::equal(out.begin(), out.end(), in.begin()));
  EXPECT_EQ(std::count(in.begin() + static_cast<std::ptrdiff_t>(bytes), in.end(), std::byte{0x5a}), 64);
  // Another size: both sides fail, naming both sizes; the receive is left as it was.
  std::fill(in.begin(), in.end(), std::byte{0x5a});
  Completion sent2, received2;
  const MessageKey key2{transport::Channel::point_to_point, 9, 1};
  t[1]->post_recv(0, key2, in.data(), bytes + 64, &received2);
  t[0]->post_send(1, key2, out.data(), bytes, &sent2);
  for (int i = 0; i < 5; ++i) {
    t[1]->progress();
    t[0]->progress();
  }
  const std::string want = transport::size_mismatch(0, bytes, 1, bytes + 64, key2);
  ASSERT_EQ(received2.state(), Completion::failed);
  ASSERT_EQ(sent2.state(), Completion::failed);
  EXPECT_NE(received2.error.find(want), std::string::npos) << received2.error;
  EXPECT_NE(sent2.error.find(want), std::string::npos) << sent2.error;
  EXPECT_EQ(std::count(in.begin(), in.end(), std::byte{0x5a}), static_cast<std::ptrdiff_t>(in.size()));
}

// Where the attach probe chose single copy, messages travel by reference from
// probed_reference_bytes; where it chose the data sets, from reference_bytes. Either way the
// bytes arrive exactly, on both sides of the threshold.
TEST_F(Shm, MessagesTravelByReferenceFromTheProbedThreshold) {
  for (const char* copy : {"single", "sets"}) {
    auto t = open_pair(copy);
    auto& segment = static_cast<transport::shm::ShmTransport&>(*t[0]).segment();
    ASSERT_TRUE(segment.single_copy());
    const bool single = std::string(copy) == "single";
    EXPECT_EQ(segment.reference_from(),
              single ? transport::shm::probed_reference_bytes : transport::shm::reference_bytes);
    std::uint32_t tag = 0;
    for (std::size_t bytes : {transport::shm::probed_reference_bytes - 1, transport::shm::probed_reference_bytes}) {
      std::vector<std::byte> out(bytes), in(bytes, std::byte{0});
      for (std::size_t i = 0; i < bytes; ++i) out[i] = static_cast<std::byte>((i * 7 + bytes) % 253);
      Completion sent, received;
      const MessageKey key{transport::Channel::point_to_point, 9, tag++};
      const std::uint64_t head = segment.ring(0, 1).head.load();
      t[0]->post_send(1, key, out.data(), bytes, &sent);
      EXPECT_EQ(transport::shm::read_chunk(segment, 0, 1, head).by_reference,
                single && bytes >= transport::shm::probed_reference_bytes ? 1 : 0)
          << copy << ", " << bytes << " bytes";
      t[1]->post_recv(0, key, in.data(), bytes, &received);
      for (int i = 0; i < 100 && (sent.state() == Completion::posted || received.state() == Completion::posted); ++i) {
        t[1]->progress();
        t[0]->progress();
      }
      EXPECT_EQ(sent.state(), Completion::done) << copy << ", " << bytes << " bytes: " << sent.error;
      EXPECT_EQ(received.state(), Completion::done) << copy << ", " << bytes << " bytes: " << received.error;
      EXPECT_TRUE(out == in) << copy << ", " << bytes << " bytes";
    }
  }
}

// A sender whose ring is full asks its receiver to ring it once there is room (waiters do not
// poll their own rings' tails): the receiver that frees slots clears the request and rings the
// sender's doorbell, and every message then arrives exactly. Where ranks outnumber cores every
// write rings anyway, and the request is not made.
TEST_F(Shm, AFullRingAsksItsReceiverToRingWhenItFreesRoom) {
  if (sysconf(_SC_NPROCESSORS_ONLN) < 2) GTEST_SKIP() << "one core: every write rings, no request to test";
  auto t = open_pair("sets");  // these messages go through the ring either way
  auto& segment = static_cast<transport::shm::ShmTransport&>(*t[0]).segment();
  const std::size_t slots = segment.layout().slots, bytes = transport::shm::eager_bytes + 100, n = slots + 3;
  std::vector<std::vector<std::byte>> out(n), in(n);
  std::vector<Completion> sent(n), received(n);
  for (std::size_t m = 0; m < n; ++m) {
    out[m].assign(bytes, static_cast<std::byte>(m + 1));
    in[m].assign(bytes, std::byte{0});
    t[0]->post_send(1, MessageKey{transport::Channel::point_to_point, 9, static_cast<std::uint32_t>(m)}, out[m].data(),
                    bytes, &sent[m]);
  }
  auto& ring = segment.ring(0, 1);
  EXPECT_EQ(ring.head.load(), slots);  // full: the rest wait in the sender's queue
  EXPECT_EQ(ring.wants_room.load(), 1u);
  const std::uint32_t generation = segment.rank_block(0).generation.load();
  for (std::size_t m = 0; m < n; ++m)
    t[1]->post_recv(0, MessageKey{transport::Channel::point_to_point, 9, static_cast<std::uint32_t>(m)}, in[m].data(),
                    bytes, &received[m]);
  t[1]->progress();
  EXPECT_EQ(ring.wants_room.load(), 0u);
  EXPECT_GT(segment.rank_block(0).generation.load(), generation) << "the full sender was not rung";
  for (int i = 0; i < 100 && sent[n - 1].state() == Completion::posted; ++i) {
    t[0]->progress();
    t[1]->progress();
  }
  for (std::size_t m = 0; m < n; ++m) {
    EXPECT_EQ(sent[m].state(), Completion::done) << "message " << m << ": " << sent[m].error;
    EXPECT_EQ(received[m].state(), Completion::done) << "message " << m << ": " << received[m].error;
    EXPECT_TRUE(in[m] == out[m]) << "message " << m;
  }
}

// An eager message of up to header_payload_bytes travels in its chunk header's first line (the
// slot's payload is not written), a larger one after the header; every byte arrives either way.
TEST_F(Shm, SmallEagerMessagesTravelInTheirChunkHeader) {
  auto t = open_pair();
  auto& segment = static_cast<transport::shm::ShmTransport&>(*t[0]).segment();
  const std::size_t small = transport::shm::header_payload_bytes;
  std::uint32_t index = 0;
  for (std::size_t bytes : {std::size_t{1}, small - 1, small, small + 1, transport::shm::eager_bytes}) {
    const std::uint64_t head = segment.ring(0, 1).head.load();
    std::byte* after = segment.payload(0, 1, head);
    std::memset(after, 0x77, 64);
    std::vector<std::byte> out(bytes), in(bytes, std::byte{0});
    for (std::size_t i = 0; i < bytes; ++i) out[i] = static_cast<std::byte>(i * 11 + bytes);
    Completion sent, received;
    const MessageKey key{transport::Channel::point_to_point, 4, index++};
    t[0]->post_send(1, key, out.data(), bytes, &sent);
    EXPECT_EQ(sent.state(), Completion::done) << bytes << " bytes: eager";
    const auto header = transport::shm::read_chunk(segment, 0, 1, head);
    EXPECT_EQ(header.eager, 1) << bytes << " bytes";
    EXPECT_EQ(std::count(after, after + 64, std::byte{0x77}) == 64, bytes <= small)
        << bytes << " bytes: the payload after the header was " << (bytes <= small ? "" : "not ") << "written";
    t[1]->post_recv(0, key, in.data(), bytes, &received);
    for (int i = 0; i < 10 && received.state() == Completion::posted; ++i) t[1]->progress();
    EXPECT_EQ(received.state(), Completion::done) << bytes << " bytes: " << received.error;
    EXPECT_TRUE(in == out) << bytes << " bytes";
  }
}

// A collective's small message of a call that runs ahead (MessageKey::runs_ahead: a gather's or
// reduce's leaf, a broadcast's root, bounded by the communicator's RunAheadWindow) is eager too:
// complete for its sender once it is in the ring, its signature in its header and its payload
// after it (never in the header, where the signature is), delivered exactly whether its receive
// was posted first or not; the receiver still compares the signature and aborts on a mismatch.
// The same message of a call that does not run ahead completes only once its receiver took it.
TEST_F(Shm, SmallMessagesOfCallsThatRunAheadAreEager) {
  auto t = open_pair();
  auto& segment = static_cast<transport::shm::ShmTransport&>(*t[0]).segment();
  const auto signature_of = [](std::uint64_t seq, std::size_t count) {
    transport::Signature s;
    s.seq = seq;
    s.collective = Collective::gather;
    s.count = count;
    s.type = DataType::u8;
    s.algorithm = Algorithm::binomial_tree;
    s.root = 1;
    return s;
  };
  std::uint64_t seq = 0;
  for (std::size_t bytes :
       {std::size_t{8}, transport::shm::header_payload_bytes, std::size_t{1000}, transport::shm::eager_bytes})
    for (bool posted_first : {false, true}) {
      const transport::Signature signature = signature_of(seq, bytes);
      t[0]->announce(signature);
      t[1]->announce(signature);
      std::vector<std::byte> out(bytes), in(bytes, std::byte{0});
      for (std::size_t i = 0; i < bytes; ++i) out[i] = static_cast<std::byte>(i * 7 + seq);
      const MessageKey key{transport::Channel::collective, seq++, 0, true};
      Completion sent, received;
      if (posted_first) t[1]->post_recv(0, key, in.data(), bytes, &received);
      const std::uint64_t head = segment.ring(0, 1).head.load();
      t[0]->post_send(1, key, out.data(), bytes, &sent);
      EXPECT_EQ(sent.state(), Completion::done) << bytes << " bytes: eager";
      const auto header = transport::shm::read_chunk(segment, 0, 1, head);
      EXPECT_EQ(header.eager, 1) << bytes << " bytes";
      EXPECT_EQ(header.has_signature, 1) << bytes << " bytes";
      EXPECT_TRUE(header.signature == transport::to_wire(signature)) << bytes << " bytes";
      std::fill(out.begin(), out.end(), std::byte{0xee});  // the sender's buffer is its own again
      if (!posted_first) {
        for (int i = 0; i < 5; ++i) t[1]->progress();  // arrives before its receive: kept
        t[1]->post_recv(0, key, in.data(), bytes, &received);
      }
      for (int i = 0; i < 10 && received.state() == Completion::posted; ++i) t[1]->progress();
      ASSERT_EQ(received.state(), Completion::done) << bytes << " bytes: " << received.error;
      for (std::size_t i = 0; i < bytes; ++i)
        ASSERT_EQ(in[i], static_cast<std::byte>(i * 7 + seq - 1)) << bytes << " bytes, byte " << i;
    }
  // Not running ahead: the sender waits for its receiver's ack.
  const transport::Signature signature = signature_of(seq, 8);
  t[0]->announce(signature);
  t[1]->announce(signature);
  std::vector<std::byte> out(8, std::byte{5}), in(8, std::byte{0});
  const MessageKey key{transport::Channel::collective, seq++, 0, false};
  Completion sent, received;
  t[0]->post_send(1, key, out.data(), 8, &sent);
  for (int i = 0; i < 5; ++i) t[0]->progress();
  EXPECT_EQ(sent.state(), Completion::posted);
  t[1]->post_recv(0, key, in.data(), 8, &received);
  for (int i = 0; i < 10 && (received.state() == Completion::posted || sent.state() == Completion::posted); ++i) {
    t[1]->progress();
    t[0]->progress();
  }
  EXPECT_EQ(received.state(), Completion::done) << received.error;
  EXPECT_EQ(sent.state(), Completion::done) << sent.error;
  EXPECT_EQ(in, out);
  // A receiver in another call learns of it from the eager message's signature: both abort.
  t[0]->announce(signature_of(seq, 8));
  t[1]->announce(signature_of(seq, 9));
  Completion mismatched_send, mismatched_recv;
  const MessageKey next{transport::Channel::collective, seq, 0, true};
  t[0]->post_send(1, next, out.data(), 8, &mismatched_send);
  EXPECT_EQ(mismatched_send.state(), Completion::done);
  t[1]->post_recv(0, next, in.data(), 9, &mismatched_recv);
  for (int i = 0; i < 10 && mismatched_recv.state() == Completion::posted; ++i) t[1]->progress();
  EXPECT_EQ(mismatched_recv.state(), Completion::failed);
  ASSERT_TRUE(t[1]->aborted().has_value());
  EXPECT_EQ(t[1]->aborted()->error.code(), ErrorCode::mismatch) << t[1]->aborted()->error.what();
  ASSERT_TRUE(t[0]->aborted().has_value());
}

// A chunk is taken by its stamp, before (and without) its head: the receiver neither waits for the
// head nor takes a head that lags behind its tail for a bad one. A chunk that only the head
// publishes (no stamp) is still read, and every sent chunk carries the stamp of its slot.
TEST_F(Shm, ChunksAreTakenByTheirStampsAndByTheHeadAlone) {
  auto t = open_pair();
  auto& segment = static_cast<transport::shm::ShmTransport&>(*t[0]).segment();
  auto& ring = segment.ring(0, 1);
  const auto message = [](std::uint32_t index, std::uint32_t bytes) {
    transport::shm::ChunkHeader h{};
    h.seq = 6;
    h.index = index;
    h.total = bytes;
    h.bytes = bytes;
    h.eager = 1;
    h.channel = static_cast<std::uint8_t>(transport::Channel::point_to_point);
    return h;
  };
  std::vector<std::byte> in(16, std::byte{0});
  // Slot 0 by its stamp alone: the head stays at 0.
  auto first = message(0, 16);
  first.stamp = transport::shm::stamp_for(0);
  std::memcpy(static_cast<void*>(&segment.chunk(0, 1, 0)), &first, transport::shm::header_fields_bytes);
  std::memset(segment.payload(0, 1, 0, true, false, 16), 0x21, 16);
  Completion received;
  t[1]->post_recv(0, MessageKey{transport::Channel::point_to_point, 6, 0}, in.data(), 16, &received);
  for (int i = 0; i < 5; ++i) t[1]->progress();
  ASSERT_EQ(received.state(), Completion::done) << received.error;
  EXPECT_EQ(std::count(in.begin(), in.end(), std::byte{0x21}), 16);
  EXPECT_EQ(ring.tail.load(), 1u);
  EXPECT_EQ(ring.head.load(), 0u);
  EXPECT_FALSE(t[1]->aborted().has_value());  // a head behind the tail is not a lie
  // Slot 1 by the head alone (no stamp): read once the head says so.
  auto second = message(1, 8);
  std::memcpy(static_cast<void*>(&segment.chunk(0, 1, 1)), &second, transport::shm::header_fields_bytes);
  std::memset(segment.payload(0, 1, 1, true, false, 8), 0x42, 8);
  Completion received2;
  t[1]->post_recv(0, MessageKey{transport::Channel::point_to_point, 6, 1}, in.data(), 8, &received2);
  for (int i = 0; i < 5; ++i) t[1]->progress();
  EXPECT_EQ(received2.state(), Completion::posted);  // neither stamp nor head yet
  ring.head.store(2);
  for (int i = 0; i < 5 && received2.state() == Completion::posted; ++i) t[1]->progress();
  ASSERT_EQ(received2.state(), Completion::done) << received2.error;
  EXPECT_EQ(std::count(in.begin(), in.begin() + 8, std::byte{0x42}), 8);
  EXPECT_EQ(ring.tail.load(), 2u);
  // What the transport sends is stamped with its slot, head after.
  std::vector<std::byte> out(40, std::byte{0x63});
  Completion sent;
  t[0]->post_send(1, MessageKey{transport::Channel::point_to_point, 7, 0}, out.data(), out.size(), &sent);
  EXPECT_EQ(ring.head.load(), 3u);
  EXPECT_EQ(transport::shm::stamp_of(segment.chunk(0, 1, 2)).load(), transport::shm::stamp_for(2));
  EXPECT_NE(transport::shm::stamp_for(2), transport::shm::stamp_for(2 + segment.layout().slots));
}

TEST_F(Shm, TimeoutAbortsForEveryRank) {
  std::atomic<int> timeouts{0};
  const std::string failures = run_shm(2, [&](Communicator& comm) {
    std::vector<float> data(8, 1.0f);
    if (comm.rank() == 1) std::this_thread::sleep_for(500ms);  // late: rank 0 gives up first
    try {
      comm.allreduce(data.data(), data.data(), 8, DataType::f32, ReduceOp::sum,
                     {Algorithm::ring, comm.rank() == 0 ? 100ms : timeout});
    } catch (const Error& e) {
      if (e.code() != ErrorCode::timeout) throw;
      ++timeouts;
    }
  });
  EXPECT_EQ(failures, "");
  EXPECT_EQ(timeouts.load(), 2);
}

// Transport level: a receive cancelled while its message is half received gets no more bytes.
TEST_F(Shm, CancelStopsAPartialReceive) {
  auto t = open_pair("sets");         // messages by reference from reference_bytes
  const std::size_t bytes = 3 << 20;  // 6 times the ring; below reference_bytes, so in chunks
  static_assert((3 << 20) < transport::shm::reference_bytes);
  std::vector<std::byte> out(bytes, std::byte{1}), in(bytes, std::byte{0});
  Completion sent, received;
  const MessageKey key{transport::Channel::point_to_point, 9, 0};
  t[0]->post_send(1, key, out.data(), bytes, &sent);
  t[1]->post_recv(0, key, in.data(), bytes, &received);
  t[1]->progress();
  t[1]->cancel(&received);
  EXPECT_EQ(received.state(), Completion::cancelled);
  std::fill(in.begin(), in.end(), std::byte{7});
  for (int i = 0; i < 200 && sent.state() == Completion::posted; ++i) {
    t[0]->progress();
    t[1]->progress();
  }
  EXPECT_EQ(sent.state(), Completion::done);  // the receiver matched it before cancelling
  EXPECT_EQ(std::count(in.begin(), in.end(), std::byte{7}), static_cast<std::ptrdiff_t>(bytes));
  Completion never;
  t[0]->post_recv(1, key, in.data(), 8, &never);
  t[0]->cancel(&never);
  EXPECT_EQ(never.state(), Completion::cancelled);
}

// ---- processes ----

// In a child: rank `r` of `p` runs allreduces until an error, then _exits with a code saying what
// happened: 0 = peer_failure naming rank `victim`, 2 = another error, 3 = no error at all.
[[noreturn]] void child_allreduce_loop(const std::string& name, int r, int p, int victim, int ready_fd) {
  int code = 3;
  try {
    Communicator comm = communicator(transport::shm::open(name, r, p, 11, attach_timeout));
    std::vector<float> data(200000, 1.0f);
    const auto stop = std::chrono::steady_clock::now() + 20s;
    for (int i = 0; std::chrono::steady_clock::now() < stop; ++i) {
      comm.allreduce(data.data(), data.data(), data.size(), DataType::f32, ReduceOp::max, {Algorithm::ring, timeout});
      if (i == 0 && write(ready_fd, "x", 1) != 1) _exit(2);
    }
  } catch (const Error& e) {
    const std::string what = e.what();
    code = e.code() == ErrorCode::peer_failure &&
                   what.find("rank " + std::to_string(victim) + " (pid") != std::string::npos
               ? 0
               : 2;
    if (code != 0) std::fprintf(stderr, "rank %d: %s\n", r, what.c_str());
  } catch (...) {
    code = 2;
  }
  _exit(code);
}

TEST_F(Shm, KilledProcessIsReportedToTheOthers) {
  constexpr int p = 4, victim = 2;
  const std::string name = unique_shm_name();
  int fds[2];
  ASSERT_EQ(pipe(fds), 0);
  std::vector<pid_t> pids;
  for (int r = 0; r < p; ++r) {
    const pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      close(fds[0]);
      child_allreduce_loop(name, r, p, victim, fds[1]);
    }
    pids.push_back(pid);
  }
  close(fds[1]);
  int ready = 0;
  char buffer[8];
  const auto start = std::chrono::steady_clock::now();
  while (ready < p && std::chrono::steady_clock::now() - start < 20s) {
    pollfd pfd{fds[0], POLLIN, 0};
    if (poll(&pfd, 1, 100) > 0) {
      const ssize_t n = read(fds[0], buffer, sizeof buffer);
      if (n <= 0) break;
      ready += static_cast<int>(n);
    }
  }
  close(fds[0]);
  EXPECT_EQ(ready, p) << "not every rank finished its first allreduce";
  std::this_thread::sleep_for(50ms);  // mid-operation: the loop runs back to back
  kill(pids[victim], SIGKILL);
  const auto killed = std::chrono::steady_clock::now();
  // The victim is reaped last on purpose: a dead child its parent has not reaped yet (a zombie,
  // which kill(pid, 0) still finds) must be reported as dead too.
  for (int r = 0; r < p; ++r) {
    const int status = reap(pids[static_cast<std::size_t>(r)], killed + 10s);
    if (r == victim) continue;
    ASSERT_TRUE(status >= 0 && WIFEXITED(status)) << "rank " << r << " hung or crashed";
    EXPECT_EQ(WEXITSTATUS(status), 0) << "rank " << r;
  }
  const auto took = std::chrono::steady_clock::now() - killed;
  std::printf("survivors reported the death after %lld ms\n",
              static_cast<long long>(std::chrono::duration_cast<std::chrono::milliseconds>(took).count()));
  EXPECT_LT(took, 5s);
}

// Real processes run a few collectives and point-to-point messages and exit cleanly.
TEST_F(Shm, ForkedRanksRunCollectives) {
  constexpr int p = 3;
  const std::string name = unique_shm_name();
  const std::vector<int> codes = on_processes(
      p,
      [&](int r) {
        int code = 0;
        Communicator comm = communicator(transport::shm::open(name, r, p, 5, attach_timeout));
        std::vector<std::int64_t> data(1000003, r + 1);
        comm.allreduce(std::span<std::int64_t>(data), ReduceOp::sum, {Algorithm::automatic, timeout});
        for (std::int64_t v : data) code |= v != 6;
        std::int64_t token = r == 0 ? 77 : -1;
        if (r == 0) comm.send(&token, 1, DataType::i64, 1);
        if (r > 0) comm.recv(&token, 1, DataType::i64, r - 1);
        if (r > 0 && r + 1 < p) comm.send(&token, 1, DataType::i64, r + 1);
        code |= token != 77;
        comm.barrier({Algorithm::automatic, timeout});
        return code;
      },
      60s);
  for (int r = 0; r < p; ++r)
    EXPECT_EQ(codes[static_cast<std::size_t>(r)], 0) << "rank " << r << " (-1: hung or crashed)";
}

// Waits yield the core where the job's ranks on this machine outnumber its cores, however few
// ranks a communicator has: a world as init() counts it (ranks_on_machine), and every part split
// from a communicator whose waits yield. Where ranks fit the cores a 2-rank world spins.
TEST_F(Shm, CrowdedMachinesAndTheirSplitsYieldWhileWaiting) {
  const long cores = sysconf(_SC_NPROCESSORS_ONLN);
  ASSERT_GT(cores, 0);
  EXPECT_EQ(transport::shm::ranks_on_machine(), 0) << "init() never ran in this process";
  EXPECT_EQ(transport::shm::ranks_outnumber_cores(static_cast<int>(cores) + 1), true);
  EXPECT_EQ(transport::shm::ranks_outnumber_cores(static_cast<int>(cores)), false);
  for (const int on_machine : {0, static_cast<int>(cores) + 1}) {
    const std::string name = unique_shm_name();
    const std::vector<int> codes = on_processes(
        2,
        [&](int r) {
          transport::shm::set_ranks_on_machine(on_machine);
          auto world = transport::shm::open(name, r, 2, 23, attach_timeout);
          auto& shm = static_cast<transport::shm::ShmTransport&>(*world);
          const bool crowded = on_machine > cores;
          int code = shm.yields_while_waiting() != crowded ? 1 : 0;
          code |= transport::shm::ranks_outnumber_cores(1) != crowded ? 2 : 0;
          // A part of the world (both ranks, split as CommImpl::split does) waits as the world does;
          // a world told to yield (routed: the TCP I/O thread shares the core) passes that on too.
          auto part = world->split(101, {0, 1}, r);
          code |= static_cast<transport::shm::ShmTransport&>(*part).yields_while_waiting() != crowded ? 4 : 0;
          shm.yield_while_waiting();
          auto yielding = world->split(102, {0, 1}, r);
          code |= static_cast<transport::shm::ShmTransport&>(*yielding).yields_while_waiting() ? 0 : 8;
          return code;
        },
        30s);
    for (int r = 0; r < 2; ++r)
      EXPECT_EQ(codes[static_cast<std::size_t>(r)], 0)
          << "ranks on the machine " << on_machine << ", rank " << r
          << " (-1: hung or crashed, 1: the world's waits, 2: ranks_outnumber_cores, 4: a split's, 8: a "
             "yielding world's split)";
  }
}

// The link init() measured prices the calls that cross it: a communicator over shared memory,
// split from one that has it, is priced by shared memory's own costs.
TEST_F(Shm, ASplitWithinOneHostDoesNotInheritTheLink) {
  const std::string name = unique_shm_name();
  const std::vector<int> codes = on_processes(
      2,
      [&](int r) {
        Communicator world = communicator(transport::shm::open(name, r, 2, 29, attach_timeout));
        static const transport::CostParams link{5.5e-6, 7.65e-9, 2e-10};
        comm::Access::impl(world)->set_link_cost(&link);
        const Communicator part = world.split(0, r);
        int code = comm::Access::impl(world)->link_cost() != &link ? 1 : 0;
        code |= comm::Access::impl(part)->transport_kind() != transport::Kind::shm ? 2 : 0;
        code |= comm::Access::impl(part)->link_cost() != nullptr ? 4 : 0;
        return code;
      },
      30s);
  for (int r = 0; r < 2; ++r)
    EXPECT_EQ(codes[static_cast<std::size_t>(r)], 0)
        << "rank " << r
        << " (-1: hung or crashed, 1: the world lost its link, 2: the part is not shm, 4: the part "
           "inherited the link)";
}

}  // namespace
}  // namespace tutti::testing
