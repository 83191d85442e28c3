// The shared-memory transport against another local user and against a peer that writes garbage
// into the segment. Ranks are threads of this process attached like processes would be; the
// "attacker" creates names in /dev/shm or writes into the mapping directly. Every call has a
// deadline, every test checks the named error and that the victim went on (no crash, no
// out-of-bounds access: the suite runs under ASan too), and nothing is left in /dev/shm.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "bootstrap/store.hpp"
#include "comm/access.hpp"
#include "comm/comm_impl.hpp"
#include "core/shared_memory.hpp"
#include "shm_names.hpp"
#include "transport/shm/direct.hpp"
#include "transport/shm/direct_run.hpp"
#include "transport/shm/segment.hpp"
#include "transport/shm/shm.hpp"
#include "transport/shm/shm_transport.hpp"
#include "tutti/tutti.hpp"

namespace tutti::testing {
namespace {

using namespace std::chrono_literals;
using transport::Channel;
using transport::Completion;
using transport::MessageKey;
using transport::shm::ShmTransport;

constexpr std::chrono::milliseconds attach_timeout{20000};
const int bounded_default_timeout = setenv("TUTTI_TIMEOUT_MS", "20000", 0);

class HostileShm : public ::testing::Test {
 protected:
  void TearDown() override { EXPECT_EQ(shm_leftovers(), std::vector<std::string>{}); }
};

// ---- a name taken before rank 0 creates it ----

// Another user's segment under `name`, simulated: this user's with `mode`, handed to `owner`
// when that is not this user (possible only as root). Removed when the object goes.
struct Squat {
  std::string path;
  Squat(const std::string& name, mode_t mode, uid_t owner) : path("/" + name) {
    const int fd = shm_open(path.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
    if (fd < 0) throw std::runtime_error("squat: shm_open failed");
    const bool ok = fchmod(fd, mode) == 0 && ftruncate(fd, 1 << 20) == 0 &&
                    (owner == geteuid() || fchown(fd, owner, static_cast<gid_t>(owner)) == 0);
    close(fd);
    if (!ok) {
      shm_unlink(path.c_str());
      throw std::runtime_error("squat: could not set mode or owner");
    }
  }
  ~Squat() { shm_unlink(path.c_str()); }
};

// What shm::open(name) as `rank` of 2 raised, as "code: message" ("" when it returned).
std::string open_error(const std::string& name, int rank) {
  try {
    transport::shm::open(name, rank, 2, 1, 300ms);
    return "";
  } catch (const Error& e) {
    return std::string(to_string(e.code())) + ": " + e.what();
  }
}

void expect_refused(const std::string& error, const std::string& name, uid_t owner, const std::string& mode) {
  EXPECT_EQ(error.rfind("system: shm: refusing segment /" + name + ":", 0), 0u) << error;
  EXPECT_NE(error.find("owned by uid " + std::to_string(owner) + " with mode " + mode), std::string::npos) << error;
}

TEST_F(HostileShm, NameTakenWithAWideModeIsRefused) {
  const std::string name = unique_shm_name();
  Squat squat(name, 0666, geteuid());
  // Rank 0 does not take over the name; the others do not attach to what they find under it.
  expect_refused(open_error(name, 0), name, geteuid(), "0666");
  expect_refused(open_error(name, 1), name, geteuid(), "0666");
}

TEST_F(HostileShm, NameTakenByAnotherUserIsRefused) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to make a segment of another user (uid 65534)";
  const std::string name = unique_shm_name();
  Squat squat(name, 0600, 65534);
  expect_refused(open_error(name, 0), name, 65534, "0600");
  expect_refused(open_error(name, 1), name, 65534, "0600");
}

// A segment open to the group is refused too (any bit beyond 0600).
TEST_F(HostileShm, NameTakenWithGroupReadIsRefused) {
  const std::string name = unique_shm_name();
  Squat squat(name, 0640, geteuid());
  expect_refused(open_error(name, 1), name, geteuid(), "0640");
}

// ---- names nobody can predict ----

// The world segment's name of a job with id `job_id`, p = 2, through a fresh file store; and the
// name of the segment of split id 99 of it.
// With `stale`, the store holds an earlier job's nonce and rank 0 starts 200 ms after rank 1.
std::pair<std::string, std::string> job_names(const std::string& job_id, bool stale = false) {
  char dir[] = "/tmp/tutti-hostile-store-XXXXXX";
  if (mkdtemp(dir) == nullptr) throw std::runtime_error("mkdtemp failed");
  if (stale)
    bootstrap::connect_store(std::string("file://") + dir, "", attach_timeout)
        ->set("tutti/" + job_id + "/shm-nonce", std::string(24, 'a'));
  std::string names[2], splits[2];
  std::vector<std::thread> ranks;
  std::mutex mutex;
  std::string failures;
  for (int r = 0; r < 2; ++r)
    ranks.emplace_back([&, r] {
      try {
        if (stale && r == 0) std::this_thread::sleep_for(200ms);
        auto store = bootstrap::connect_store(std::string("file://") + dir, "", attach_timeout);
        auto t = transport::shm::open_world(*store, "tutti/" + job_id + "/shm-nonce", job_id, r, 2, 1, attach_timeout);
        names[r] = static_cast<ShmTransport&>(*t).segment().name();
        auto child = t->split(99, {0, 1}, r);
        splits[r] = static_cast<ShmTransport&>(*child).segment().name();
      } catch (const std::exception& e) {
        std::lock_guard lock(mutex);
        failures += e.what();
      }
    });
  for (auto& t : ranks) t.join();
  std::filesystem::remove_all(dir);
  if (!failures.empty()) throw std::runtime_error(failures);
  EXPECT_EQ(names[0], names[1]);
  EXPECT_EQ(splits[0], splits[1]);
  return {names[0], splits[0]};
}

TEST_F(HostileShm, SegmentNamesCarryANonce) {
  const std::string job = "test-" + std::to_string(getpid()) + "-job";
  const auto [world1, split1] = job_names(job);
  const auto [world2, split2] = job_names(job);  // the same job id again
  const std::string prefix = "tutti-" + job + "-world-";
  for (const std::string& name : {world1, world2}) {
    ASSERT_EQ(name.rfind(prefix, 0), 0u) << name;  // tutti-run's cleanup finds it by "tutti-<job id>-"
    EXPECT_EQ(name.size(), prefix.size() + 24) << name;
    EXPECT_EQ(name.find_first_not_of("0123456789abcdef", prefix.size()), std::string::npos) << name;
  }
  EXPECT_NE(world1, world2);
  // A split's name is the parent's and a keyed hash of its id, not the id itself.
  EXPECT_EQ(split1.rfind(world1 + "-", 0), 0u) << split1;
  EXPECT_EQ(split2.rfind(world2 + "-", 0), 0u) << split2;
  EXPECT_EQ(split1.find("0000000000000063"), std::string::npos) << split1;
  EXPECT_NE(split1.substr(world1.size()), split2.substr(world2.size()));
}

// A store reused by a job with the same id: the ranks that read the earlier nonce before rank 0
// replaced it still find the new segment.
TEST_F(HostileShm, StaleNonceInAReusedStore) {
  const std::string job = "test-" + std::to_string(getpid()) + "-stale";
  const auto [world, split] = job_names(job, true);
  EXPECT_EQ(world.find(std::string(24, 'a')), std::string::npos) << world;
}

// ---- a peer that writes garbage ----

// Two ranks of one segment, both driven by this thread (transport level).
struct Pair {
  std::unique_ptr<transport::Transport> t[2];
  Pair() {
    const std::string name = unique_shm_name();
    std::thread other([&] { t[1] = transport::shm::open(name, 1, 2, 3, attach_timeout); });
    t[0] = transport::shm::open(name, 0, 2, 3, attach_timeout);
    other.join();
  }
  transport::shm::Segment& segment() const { return static_cast<ShmTransport&>(*t[0]).segment(); }
  // Writes `header` into the next slot of ring 0->1 as rank 0 would, and publishes it.
  void write_chunk(const transport::shm::ChunkHeader& header) const {
    auto& ring = segment().ring(0, 1);
    const std::uint64_t head = ring.head.load();
    std::memcpy(&segment().chunk(0, 1, head), &header, sizeof header);
    ring.head.store(head + 1);
  }
};

transport::shm::ChunkHeader chunk(std::uint64_t total, std::uint64_t offset, std::uint32_t bytes) {
  transport::shm::ChunkHeader h{};
  h.seq = 5;
  h.total = total;
  h.offset = offset;
  h.bytes = bytes;
  h.channel = static_cast<std::uint8_t>(Channel::point_to_point);
  return h;
}

// Rank 1 has a receive of 400 bytes posted (tag 5) when rank 0's `scribble` lands; after a
// progress it must be aborted with peer_failure naming rank 0 and `what`, its buffer untouched
// beyond the 400 bytes.
void expect_victim_fails(const std::function<void(const Pair&)>& scribble, const std::string& what) {
  Pair pair;
  std::vector<std::byte> buffer(400 + 4096, std::byte{0x5a});
  Completion received;
  pair.t[1]->post_recv(0, MessageKey{Channel::point_to_point, 5, 0}, buffer.data(), 400, &received);
  scribble(pair);
  for (int i = 0; i < 10; ++i) pair.t[1]->progress();
  const auto failure = pair.t[1]->aborted();
  ASSERT_TRUE(failure.has_value()) << what << ": rank 1 went on";
  EXPECT_EQ(failure->error.code(), ErrorCode::peer_failure) << failure->error.what();
  const std::string text = failure->error.what();
  EXPECT_NE(text.find("shm: rank 0 wrote "), std::string::npos) << text;
  EXPECT_NE(text.find(what), std::string::npos) << text;
  for (std::size_t i = 400; i < buffer.size(); ++i)
    ASSERT_EQ(buffer[i], std::byte{0x5a}) << "written past the receive at byte " << i;
  pair.t[1]->cancel(&received);
}

TEST_F(HostileShm, ChunkBytesBeyondTheSlot) {
  expect_victim_fails([](const Pair& p) { p.write_chunk(chunk(400, 0, 0xffffffffu)); }, "invalid chunk header");
}

TEST_F(HostileShm, ChunkOffsetBeyondTheTotal) {
  expect_victim_fails([](const Pair& p) { p.write_chunk(chunk(400, std::uint64_t{1} << 40, 0)); },
                      "invalid chunk header");
}

TEST_F(HostileShm, ChunkWithAnInvalidChannel) {
  expect_victim_fails(
      [](const Pair& p) {
        auto h = chunk(400, 0, 400);
        h.channel = 7;
        p.write_chunk(h);
      },
      "invalid chunk header");
}

// A chunk by reference must be the whole of a large point-to-point message, its payload the
// 8-byte address: any other form is refused before anything is read.
TEST_F(HostileShm, ChunkByReferenceOfAnotherForm) {
  const std::uint64_t big = transport::shm::reference_bytes;
  const auto by_reference = [](std::uint64_t total, std::uint64_t offset, std::uint32_t bytes) {
    auto h = chunk(total, offset, bytes);
    h.by_reference = 1;
    return h;
  };
  expect_victim_fails([&](const Pair& p) { p.write_chunk(by_reference(big, 0, 400)); }, "invalid chunk header");
  expect_victim_fails([&](const Pair& p) { p.write_chunk(by_reference(400, 0, 8)); }, "invalid chunk header");
  expect_victim_fails([&](const Pair& p) { p.write_chunk(by_reference(big, 4096, 8)); }, "invalid chunk header");
  expect_victim_fails(
      [&](const Pair& p) {
        auto h = by_reference(big, 0, 8);
        h.channel = static_cast<std::uint8_t>(Channel::collective);
        p.write_chunk(h);
      },
      "invalid chunk header");
  expect_victim_fails(
      [&](const Pair& p) {
        auto h = chunk(400, 0, 400);
        h.by_reference = 2;
        p.write_chunk(h);
      },
      "invalid chunk header");
}

// A chunk by reference whose address is not in the sender's memory: the posted receive's rank is
// aborted with peer_failure naming the sender, and nothing lands in its buffer.
TEST_F(HostileShm, ChunkByReferenceToAnAddressThatIsNotThere) {
  Pair pair;
  const std::size_t bytes = transport::shm::reference_bytes;
  std::vector<std::byte> buffer(bytes, std::byte{0x5a});
  Completion received;
  pair.t[1]->post_recv(0, MessageKey{Channel::point_to_point, 5, 0}, buffer.data(), bytes, &received);
  auto h = chunk(bytes, 0, 8);
  h.by_reference = 1;
  const std::uint64_t nowhere = 4096;  // the first page is never mapped
  std::memcpy(pair.segment().payload(0, 1, pair.segment().ring(0, 1).head.load()), &nowhere, sizeof nowhere);
  pair.write_chunk(h);
  for (int i = 0; i < 10; ++i) pair.t[1]->progress();
  const auto failure = pair.t[1]->aborted();
  ASSERT_TRUE(failure.has_value());
  EXPECT_EQ(failure->error.code(), ErrorCode::peer_failure) << failure->error.what();
  EXPECT_NE(std::string(failure->error.what())
                .find("shm: rank 0 wrote the address of a 4194304-byte message that its memory does not hold"),
            std::string::npos)
      << failure->error.what();
  EXPECT_EQ(std::count(buffer.begin(), buffer.end(), std::byte{0x5a}), static_cast<std::ptrdiff_t>(bytes));
  pair.t[1]->cancel(&received);
}

// A chunk claiming to continue the message where nothing arrived yet (an offset the receive has
// not reached), and one claiming another total than the first chunk did.
TEST_F(HostileShm, ChunksOutOfOrder) {
  const std::uint32_t payload = transport::shm::Layout::for_size(2).payload;
  const std::uint64_t big = 3 * std::uint64_t{payload};
  expect_victim_fails([&](const Pair& p) { p.write_chunk(chunk(big, payload, payload)); }, "chunk out of order");
  expect_victim_fails(
      [&](const Pair& p) {
        auto first = chunk(400, 0, 400);
        first.seq = 6;  // unexpected: kept on the heap
        p.write_chunk(first);
        auto next = chunk(big, payload, payload);
        next.seq = 6;
        p.write_chunk(next);
      },
      "chunk out of order");
}

// A huge total in a well-formed first chunk: an unexpected message is not allocated blindly,
// and a posted receive fails with the size mismatch (the message is what rank 0 claims).
TEST_F(HostileShm, HugeTotal) {
  Pair pair;
  const std::uint32_t payload = transport::shm::Layout::for_size(2).payload;
  auto unexpected = chunk(std::uint64_t{1} << 62, 0, payload);
  unexpected.seq = 9;
  pair.write_chunk(unexpected);
  for (int i = 0; i < 10; ++i) pair.t[1]->progress();
  EXPECT_FALSE(pair.t[1]->aborted().has_value());
  std::vector<std::byte> buffer(400);
  Completion received;
  pair.t[1]->post_recv(0, MessageKey{Channel::point_to_point, 5, 0}, buffer.data(), 400, &received);
  pair.write_chunk(chunk(std::uint64_t{1} << 62, 0, payload));
  for (int i = 0; i < 10; ++i) pair.t[1]->progress();
  ASSERT_EQ(received.state(), Completion::failed);
  EXPECT_NE(received.error.find("message size mismatch: rank 0 sent 4611686018427387904 bytes but rank 1 expected 400"),
            std::string::npos)
      << received.error;
}

TEST_F(HostileShm, RingHeadFarBeyondTheTail) {
  expect_victim_fails(
      [](const Pair& p) {
        auto& ring = p.segment().ring(0, 1);
        ring.head.store(ring.tail.load() + 1000);
      },
      "invalid indices of the data ring from rank 0 to rank 1");
}

TEST_F(HostileShm, AckRingHeadFarBeyondTheTail) {
  Pair pair;
  std::vector<std::byte> data(64);
  Completion sent;
  pair.t[1]->post_send(0, MessageKey{Channel::point_to_point, 5, 0}, data.data(), data.size(), &sent);
  auto& ring = pair.segment().ring(1, 0);  // its acks are written by rank 0, read by rank 1
  ring.ack_head.store(ring.ack_tail.load() + 5 * transport::shm::ack_entries);
  for (int i = 0; i < 10; ++i) pair.t[1]->progress();
  const auto failure = pair.t[1]->aborted();
  ASSERT_TRUE(failure.has_value());
  EXPECT_EQ(failure->error.code(), ErrorCode::peer_failure);
  EXPECT_NE(std::string(failure->error.what())
                .find("shm: rank 0 wrote invalid indices of the ack ring from rank 0 to rank 1"),
            std::string::npos)
      << failure->error.what();
  pair.t[1]->cancel(&sent);
}

// The tail rank 0 keeps of ring 1->0 (its consumer index) moved past rank 1's head. Rank 1 reads
// the tail again only when the ring looks full by the one it read last: by then at the latest
// (its slots' worth of eager messages, nothing read meanwhile) the bad tail is refused.
TEST_F(HostileShm, RingTailPastTheHead) {
  Pair pair;
  auto& ring = pair.segment().ring(1, 0);
  ring.tail.store(ring.head.load() + 1000);  // still past the head once rank 1 has filled its slots
  std::vector<std::byte> data(64);
  const std::size_t slots = pair.segment().layout().slots;
  std::vector<Completion> sent(slots + 1);
  for (std::uint32_t m = 0; m <= slots && !pair.t[1]->aborted(); ++m)
    pair.t[1]->post_send(0, MessageKey{Channel::point_to_point, 5, m}, data.data(), data.size(), &sent[m]);
  const auto failure = pair.t[1]->aborted();
  ASSERT_TRUE(failure.has_value());
  EXPECT_EQ(failure->error.code(), ErrorCode::peer_failure);
  EXPECT_NE(std::string(failure->error.what())
                .find("shm: rank 0 wrote invalid indices of the data ring from rank 1 to rank 0"),
            std::string::npos)
      << failure->error.what();
  for (auto& completion : sent)
    if (completion.state() == Completion::posted) pair.t[1]->cancel(&completion);
}

// An abort record whose text length is far beyond its buffer, and one with an invalid code.
TEST_F(HostileShm, AbortRecordWithAHugeLength) {
  for (int variant = 0; variant < 2; ++variant) {
    Pair pair;
    auto& record = pair.segment().header().abort;
    record.code = variant == 0 ? static_cast<std::int32_t>(ErrorCode::mismatch) : 1000;
    record.rank = 0;
    record.seq = 0;
    record.length = variant == 0 ? 0xffffffffu : 10;
    record.state.store(2);
    const auto failure = pair.t[1]->aborted();
    ASSERT_TRUE(failure.has_value());
    EXPECT_EQ(failure->error.code(), ErrorCode::peer_failure);
    EXPECT_NE(std::string(failure->error.what()).find("shm: rank 0 wrote an invalid abort record"), std::string::npos)
        << failure->error.what();
  }
}

// A signature slot full of garbage (names and enums out of range) under the seq rank 1 announces:
// a named mismatch, not a crash while describing it.
TEST_F(HostileShm, GarbageSignatureSlot) {
  Pair pair;
  auto& slot = pair.segment().signature_slot(0, 0);
  for (auto& word : slot.words) word.store(~std::uint64_t{0});
  slot.tag.store(1);
  slot.arrivals.store(std::uint64_t{1} << 32 | 1);  // rank 0 counted in, as its publication would
  transport::Signature mine;
  mine.seq = 0;
  mine.collective = Collective::allreduce;
  mine.count = 4;
  mine.type = DataType::f32;
  mine.op = ReduceOp::sum;
  pair.t[1]->announce(mine);
  const auto failure = pair.t[1]->aborted();
  ASSERT_TRUE(failure.has_value());
  EXPECT_EQ(failure->error.code(), ErrorCode::mismatch);
  EXPECT_NE(std::string(failure->error.what()).find("mismatched collective: rank 0 called"), std::string::npos)
      << failure->error.what();
}

// Rank 0 publishes `bytes` at `description` as its description of collective 0 (`signature`),
// then rank 1's `run` progresses until it completes or throws: the error's text ("" if none),
// whose code must be `code`.
std::string attack_with_description(Pair& pair, transport::shm::DirectCollective& run,
                                    const transport::Signature& signature, const void* description, std::size_t bytes,
                                    ErrorCode code) {
  auto& attacker = static_cast<ShmTransport&>(*pair.t[0]);
  attacker.carry_inline(0, static_cast<const std::byte*>(description), bytes, transport::to_wire(signature));
  attacker.announce(signature);
  try {
    for (int i = 0; i < 1000 && !run.progress(); ++i) std::this_thread::sleep_for(1ms);
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), code) << e.what();
    return e.what();
  }
  return "";
}

// A zero-copy allreduce whose peer describes its buffers falsely (see DirectRun::describe): past
// the end of its shared buffer, or as another file than the one it names. The victim fails with a
// named error before it reads anything of the peer's, never maps what was not described.
void expect_zero_copy_refused(const std::function<void(core::SharedLocation&)>& lie, const std::string& what) {
  Pair pair;
  const std::size_t n = 4 * transport::shm::zero_copy_bytes / sizeof(float), bytes = n * sizeof(float);
  const Communicator none;
  SharedBuffer send = none.allocate(bytes), recv = none.allocate(bytes);
  transport::Signature signature;
  signature.seq = 0;
  signature.collective = Collective::allreduce;
  signature.count = n;
  signature.type = DataType::f32;
  signature.op = ReduceOp::sum;
  signature.algorithm = Algorithm::direct;
  auto run = transport::shm::start_direct(
      *pair.t[1],
      comm::make_call(Collective::allreduce, send.data(), recv.data(), n, DataType::f32, ReduceOp::sum, -1, {}),
      2000ms);
  run->bind(signature);
  pair.t[1]->announce(signature);
  struct {
    core::SharedLocation send, recv;
  } described{*core::locate_shared(send.data(), bytes), *core::locate_shared(recv.data(), bytes)};
  lie(described.send);
  const std::string error =
      attack_with_description(pair, *run, signature, &described, sizeof described, ErrorCode::system);
  EXPECT_NE(error.find("shm direct allreduce on rank 1: rank 0"), std::string::npos) << error;
  EXPECT_NE(error.find(what), std::string::npos) << error;
  EXPECT_TRUE(pair.t[1]->aborted().has_value());
  EXPECT_TRUE(std::all_of(recv.data(), recv.data() + bytes, [](std::byte b) { return b == std::byte{0}; }))
      << "the victim wrote into its result";
  core::forget_peer_regions();
}

TEST_F(HostileShm, ZeroCopyBufferDescribedPastItsEnd) {
  expect_zero_copy_refused([](core::SharedLocation& at) { at.offset = at.region_bytes - 64; },
                           "described its send buffer as");
}

TEST_F(HostileShm, ZeroCopyBufferDescribedAsAnotherFile) {
  expect_zero_copy_refused([](core::SharedLocation& at) { at.inode += 1; }, "it is not the buffer the peer described");
}

// An alltoall or allgather in place whose peer's description carries an in-place flag other than
// 0 or 1 (see DirectRun::describe): the victim fails with peer_failure naming rank 0 before it
// moves any block, and its buffer is as it was.
void expect_bad_in_place_flag_refused(Collective collective) {
  setenv("TUTTI_SHM_COLLECTIVE_COPY", "single", 1);  // where single copy serves it, the call describes
  Pair pair;
  unsetenv("TUTTI_SHM_COLLECTIVE_COPY");
  if (!pair.segment().single_copy()) GTEST_SKIP() << "process_vm_readv is not permitted here: nothing described";
  const std::size_t n = transport::shm::single_copy_bytes / sizeof(float);
  std::vector<float> buffer(2 * n, 1.0f);
  // In place: an alltoall's input is its result, an allgather's is rank 1's block of it.
  const float* send = collective == Collective::allgather ? buffer.data() + n : buffer.data();
  const auto call = comm::make_call(collective, send, buffer.data(), n, DataType::f32, std::nullopt, -1, {});
  transport::Signature signature = transport::Signature::of(call, Algorithm::direct);
  signature.seq = 0;
  auto run = transport::shm::start_direct(*pair.t[1], call, 2000ms);
  run->bind(signature);
  pair.t[1]->announce(signature);
  struct {
    core::SharedLocation send, recv;
    std::uint64_t in_place;
  } described{{}, {}, 7};
  const std::string error =
      attack_with_description(pair, *run, signature, &described, sizeof described, ErrorCode::peer_failure);
  EXPECT_NE(error.find("rank 0 wrote an in-place flag of 7"), std::string::npos) << error;
  EXPECT_TRUE(pair.t[1]->aborted().has_value());
  EXPECT_TRUE(std::all_of(buffer.begin(), buffer.end(), [](float x) { return x == 1.0f; })) << "the victim wrote";
}

TEST_F(HostileShm, AlltoallDescribedWithABadInPlaceFlag) { expect_bad_in_place_flag_refused(Collective::alltoall); }

TEST_F(HostileShm, AllgatherDescribedWithABadInPlaceFlag) { expect_bad_in_place_flag_refused(Collective::allgather); }

// Through the public API: a receive in progress when rank 0 writes a corrupt chunk fails with
// peer_failure naming rank 0, and the communicator is aborted (later calls too), well before the
// deadline.
// An alltoallv whose peer publishes a slot that no alltoallv writes (see
// alltoallv_publication): a flag other than 0 or 1, displacements that do not start at 0 or
// shrink, or an input larger than the slot. The victim fails with peer_failure naming rank 0
// before it copies anything; counts that are well formed but disagree are a mismatch instead.
void expect_alltoallv_slot_refused(const std::function<void(std::uint64_t*)>& lie, ErrorCode code,
                                   const std::string& what) {
  Pair pair;
  const std::vector<std::size_t> counts{3, 5};
  std::vector<float> in(8, 1.0f), out(8, -1.0f);
  const auto call = comm::make_call(Collective::alltoallv, in.data(), out.data(), 0, DataType::f32, std::nullopt, -1,
                                    {}, counts, counts);
  transport::Signature signature = transport::Signature::of(call, Algorithm::direct);
  signature.seq = 0;
  auto run = transport::shm::start_direct(*pair.t[1], call, 2000ms);
  run->bind(signature);
  pair.t[1]->announce(signature);
  // Rank 0's honest slot for the same call, then the lie.
  std::vector<std::byte> slot(transport::shm::slot_data_bytes);
  const std::vector<std::size_t> starts{0, 3, 8};
  slot.resize(transport::shm::alltoallv_publication(slot.data(), reinterpret_cast<const std::byte*>(in.data()), starts,
                                                    starts, sizeof(float)));
  lie(reinterpret_cast<std::uint64_t*>(slot.data()));
  auto& attacker = static_cast<ShmTransport&>(*pair.t[0]);
  attacker.carry_inline(0, slot.data(), slot.size(), transport::to_wire(signature));
  attacker.announce(signature);
  std::string error;
  try {
    for (int i = 0; i < 1000 && !run->progress(); ++i) std::this_thread::sleep_for(1ms);
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), code) << e.what();
    error = e.what();
  }
  EXPECT_NE(error.find(what), std::string::npos) << error;
  EXPECT_TRUE(pair.t[1]->aborted().has_value());
  EXPECT_TRUE(std::all_of(out.begin(), out.end(), [](float x) { return x == -1.0f; })) << "the victim wrote";
}

// Words of the slot: [flag, 3 send displacements, 3 receive displacements] (p = 2).
TEST_F(HostileShm, AlltoallvSlotWithABadFlag) {
  expect_alltoallv_slot_refused([](std::uint64_t* w) { w[0] = 2; }, ErrorCode::peer_failure,
                                "rank 0 wrote an alltoallv flag of 2");
}

TEST_F(HostileShm, AlltoallvSlotWithShrinkingDisplacements) {
  expect_alltoallv_slot_refused([](std::uint64_t* w) { w[2] = 9; }, ErrorCode::peer_failure,
                                "rank 0 wrote alltoallv displacements that do not fit");
}

TEST_F(HostileShm, AlltoallvSlotWithAnInputPastTheSlot) {
  expect_alltoallv_slot_refused([](std::uint64_t* w) { w[2] = w[3] = 1u << 20; }, ErrorCode::peer_failure,
                                "rank 0 wrote alltoallv displacements that do not fit");
}

TEST_F(HostileShm, AlltoallvSlotWhoseCountsDisagree) {
  expect_alltoallv_slot_refused([](std::uint64_t* w) { w[2] = 4; }, ErrorCode::mismatch,
                                "rank 0 sends 4 elements to rank 0, which expects 3 (recv_counts[0])");
}

TEST_F(HostileShm, VictimCommunicatorFailsWithANamedError) {
  const std::string name = unique_shm_name();
  std::unique_ptr<transport::Transport> attacker;
  std::thread other([&] { attacker = transport::shm::open(name, 0, 2, 3, attach_timeout); });
  auto victim_transport = transport::shm::open(name, 1, 2, 3, attach_timeout);
  other.join();
  auto& segment = static_cast<ShmTransport&>(*attacker).segment();
  Communicator victim = comm::Access::make(std::make_shared<comm::CommImpl>(std::move(victim_transport)));
  std::thread scribbler([&] {
    std::this_thread::sleep_for(50ms);
    auto& ring = segment.ring(0, 1);
    const std::uint64_t head = ring.head.load();
    auto h = chunk(400, 0, 400);
    h.seq = 0;  // the receive's tag
    h.bytes = 1u << 31;
    std::memcpy(&segment.chunk(0, 1, head), &h, sizeof h);
    ring.head.store(head + 1);
    transport::shm::ring_doorbell(segment.rank_block(1));
  });
  std::vector<float> data(100, 0.0f);
  const auto start = std::chrono::steady_clock::now();
  try {
    victim.recv(data.data(), data.size(), DataType::f32, 0, 0);
    ADD_FAILURE() << "the receive succeeded";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::peer_failure) << e.what();
    EXPECT_NE(std::string(e.what()).find("shm: rank 0 wrote an invalid chunk header"), std::string::npos) << e.what();
  }
  scribbler.join();
  EXPECT_LT(std::chrono::steady_clock::now() - start, 5s);
  try {
    victim.barrier();
    ADD_FAILURE() << "a barrier after the corruption succeeded";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::aborted) << e.what();
  }
}

}  // namespace
}  // namespace tutti::testing
