// The shared-memory direct collectives (transport/shm/direct.hpp), ranks as threads each
// attached with shm::open like a process would. Results are checked exactly on every element
// of every rank (outputs poisoned first); every call has a deadline; no segment is left behind.
#include "transport/shm/direct.hpp"

#include <dirent.h>
#include <signal.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <mutex>
#include <numeric>
#include <optional>
#include <random>
#include <thread>

#include <gtest/gtest.h>

#include "comm/access.hpp"
#include "comm/comm_impl.hpp"
#include "core/shared_memory.hpp"
#include "processes.hpp"
#include "shm_names.hpp"
#include "threads.hpp"
#include "transport/inproc/inproc.hpp"
#include "transport/shm/direct_run.hpp"
#include "transport/shm/segment.hpp"
#include "transport/shm/shm.hpp"
#include "transport/shm/shm_transport.hpp"
#include "tutti/tutti.hpp"

namespace tutti::testing {
namespace {

using namespace std::chrono_literals;
using clock = std::chrono::steady_clock;

constexpr std::chrono::milliseconds timeout{60000};
const int bounded_default_timeout = setenv("TUTTI_TIMEOUT_MS", "60000", 0);

// One rank: its transport (for direct calls) and a communicator over it (for message-based ones).
struct Rank {
  transport::Transport* transport;
  Communicator comm;
};

// Runs fn on p threads, each rank attached to a fresh segment; returns the failures.
std::string run_ranks(int p, const std::function<void(Rank&)>& fn) {
  const std::string name = unique_shm_name();
  return on_threads(p, [&](int r) {
    auto t = transport::shm::open(name, r, p, 11, 20000ms);
    transport::Transport* raw = t.get();
    Rank rank{raw, comm::Access::make(std::make_shared<comm::CommImpl>(std::move(t)))};
    fn(rank);
  });
}

// Runs a direct collective to completion on the caller's thread (start_direct, then the transport's
// finish, as the executor would). False, and nothing done, if `transport` is not shared memory.
bool direct_collective(transport::Transport& transport, Collective kind, const void* send, void* recv,
                       std::size_t count, DataType type, std::optional<ReduceOp> op, int root,
                       std::chrono::milliseconds limit) {
  auto run =
      transport::shm::start_direct(transport, comm::make_call(kind, send, recv, count, type, op, root, {}), limit);
  if (!run) return false;
  transport::Signature signature;  // for the errors only: nothing was announced
  signature.seq = transport::no_seq;
  signature.collective = kind;
  signature.count = count;
  signature.type = type;
  signature.op = op;
  signature.root = root;
  signature.algorithm = Algorithm::direct;
  transport::finish(*run, transport, signature, limit);
  return true;
}

void direct(Rank& rank, Collective kind, const void* send, void* recv, std::size_t count, DataType type,
            std::optional<ReduceOp> op = std::nullopt, int root = -1, std::chrono::milliseconds limit = timeout) {
  if (!direct_collective(*rank.transport, kind, send, recv, count, type, op, root, limit))
    throw std::runtime_error("direct_collective declined a shm transport");
}

// Element i of rank r for the f32 sweeps: small integers, so that every sum is exact.
float value(int r, std::size_t i) { return static_cast<float>((r + 1) * static_cast<int>(i % 7 + 1)); }
float sum_value(int p, std::size_t i) { return static_cast<float>(p * (p + 1) / 2 * static_cast<int>(i % 7 + 1)); }

void expect_equal(const std::vector<float>& got, const std::function<float(std::size_t)>& want,
                  const std::string& what) {
  for (std::size_t i = 0; i < got.size(); ++i)
    if (got[i] != want(i))
      throw std::runtime_error(what + ": element " + std::to_string(i) + " = " + std::to_string(got[i]) +
                               ", expected " + std::to_string(want(i)));
}

// Throws at the first element of rank r's alltoallv result (the blocks of ranks 0 to p - 1, one
// after the other, from `out`) that is not what rank q sent it: rank q sends sent(q, t) elements
// to rank t, its blocks in order of t, and element i of rank q's input is input(q, i).
void expect_alltoallv_result(const float* out, int p, int r,
                             const std::function<std::size_t(std::size_t, std::size_t)>& sent,
                             const std::function<float(std::size_t, std::size_t)>& input, const std::string& what) {
  const auto up = static_cast<std::size_t>(p), ur = static_cast<std::size_t>(r);
  std::size_t got = 0;
  for (std::size_t q = 0; q < up; ++q) {
    std::size_t from = 0;  // where rank q's block for r starts in its input
    for (std::size_t t = 0; t < ur; ++t) from += sent(q, t);
    for (std::size_t i = 0; i < sent(q, ur); ++i, ++got)
      if (out[got] != input(q, from + i))
        throw std::runtime_error(what + ": block " + std::to_string(q) + " element " + std::to_string(i) + " = " +
                                 std::to_string(out[got]) + ", expected " + std::to_string(input(q, from + i)));
  }
}

std::vector<std::size_t> counts_for(int p, std::size_t large) {
  const auto up = static_cast<std::size_t>(p);
  return {0, 1, up - 1, up + 1, 1000, large};
}

// TUTTI_SHM_SINGLE_COPY and TUTTI_SHM_COLLECTIVE_COPY settings that together reach every path:
// the collectives single copy, through the data sets, and single copy off (which wins).
constexpr std::pair<const char*, const char*> copy_settings[] = {{"1", "single"}, {"1", "sets"}, {"0", "single"}};

class ShmDirect : public ::testing::Test {
 protected:
  void TearDown() override { EXPECT_EQ(shm_leftovers(), std::vector<std::string>{}); }
};

TEST_F(ShmDirect, AllreduceCountsSizesAndPlaces) {
  for (int p : {1, 2, 3, 5, 8})
    EXPECT_EQ(run_ranks(p,
                        [&](Rank& rank) {
                          const int r = rank.comm.rank();
                          for (std::size_t n : counts_for(p, 1000003))
                            for (bool in_place : {false, true}) {
                              std::vector<float> send(n), recv(n, std::nanf(""));
                              for (std::size_t i = 0; i < n; ++i) send[i] = value(r, i);
                              float* out = in_place ? send.data() : recv.data();
                              direct(rank, Collective::allreduce, send.data(), out, n, DataType::f32, ReduceOp::sum);
                              expect_equal(
                                  in_place ? send : recv, [&](std::size_t i) { return sum_value(p, i); },
                                  "allreduce n=" + std::to_string(n) + (in_place ? " in place" : ""));
                            }
                        }),
              "")
        << "p=" << p;
}

TEST_F(ShmDirect, ReduceScatterCountsSizesAndPlaces) {
  for (int p : {1, 2, 3, 5, 8})
    EXPECT_EQ(run_ranks(p,
                        [&](Rank& rank) {
                          const int r = rank.comm.rank();
                          const auto up = static_cast<std::size_t>(p), ur = static_cast<std::size_t>(r);
                          for (std::size_t n : counts_for(p, 300007))
                            for (bool in_place : {false, true}) {
                              std::vector<float> send(up * n), recv(n, std::nanf(""));
                              for (std::size_t i = 0; i < up * n; ++i) send[i] = value(r, i);
                              float* out = in_place ? send.data() + ur * n : recv.data();
                              direct(rank, Collective::reduce_scatter, send.data(), out, n, DataType::f32,
                                     ReduceOp::sum);
                              if (in_place) recv.assign(out, out + n);
                              expect_equal(
                                  recv, [&](std::size_t i) { return sum_value(p, ur * n + i); },
                                  "reduce_scatter n=" + std::to_string(n) + (in_place ? " in place" : ""));
                            }
                        }),
              "")
        << "p=" << p;
}

// Runs `body` with each way the block collectives copy forced (TUTTI_SHM_COLLECTIVE_COPY).
void with_each_collective_copy(const std::function<void(const char* copy)>& body) {
  for (const char* copy : {"single", "sets"}) {
    setenv("TUTTI_SHM_COLLECTIVE_COPY", copy, 1);
    body(copy);
  }
  unsetenv("TUTTI_SHM_COLLECTIVE_COPY");
}

TEST_F(ShmDirect, AllgatherCountsSizesAndPlaces) {
  with_each_collective_copy([&](const char* copy) {
    for (int p : {1, 2, 3, 5, 8})
      EXPECT_EQ(run_ranks(p,
                          [&](Rank& rank) {
                            const int r = rank.comm.rank();
                            const auto up = static_cast<std::size_t>(p), ur = static_cast<std::size_t>(r);
                            for (std::size_t n : counts_for(p, 300007))
                              for (bool in_place : {false, true}) {
                                std::vector<float> send(n), recv(up * n, std::nanf(""));
                                for (std::size_t i = 0; i < n; ++i) send[i] = value(r, i);
                                const float* in = send.data();
                                if (in_place) {
                                  std::copy(send.begin(), send.end(), recv.begin() + static_cast<long>(ur * n));
                                  in = recv.data() + ur * n;
                                }
                                direct(rank, Collective::allgather, in, recv.data(), n, DataType::f32);
                                expect_equal(
                                    recv, [&](std::size_t i) { return value(static_cast<int>(i / n), i % n); },
                                    "allgather n=" + std::to_string(n) + (in_place ? " in place" : ""));
                                // Through the communicator: a bound run, where single copy writes
                                // into the peers' results instead of reading their inputs.
                                std::fill(recv.begin(), recv.end(), std::nanf(""));
                                if (in_place)
                                  std::copy(send.begin(), send.end(), recv.begin() + static_cast<long>(ur * n));
                                rank.comm.allgather(in, recv.data(), n, DataType::f32, {Algorithm::direct, timeout});
                                expect_equal(
                                    recv, [&](std::size_t i) { return value(static_cast<int>(i / n), i % n); },
                                    "bound allgather n=" + std::to_string(n) + (in_place ? " in place" : ""));
                              }
                          }),
                "")
          << "p=" << p << " TUTTI_SHM_COLLECTIVE_COPY=" << copy;
  });
}

// Alltoall: inline (p blocks within a signature slot), through the data sets in chunks, and
// single copy (blocks of 16 KiB or more, where the collectives single copy: read from the peers
// in an unbound run, written into them in a bound one, through the communicator); in place (a
// snapshot of the input) and not. Block q of rank r's result is block r of rank q's input, exactly.
TEST_F(ShmDirect, AlltoallCountsSizesAndPlaces) {
  // Every element of every rank's input distinct (exact in f32: below 2^24).
  const auto unique = [](int q, std::size_t i) { return static_cast<float>(q * 200000 + static_cast<int>(i)); };
  with_each_collective_copy([&](const char* copy) {
    for (int p : {1, 2, 3, 5, 8})
      EXPECT_EQ(run_ranks(p,
                          [&](Rank& rank) {
                            const int r = rank.comm.rank();
                            const auto up = static_cast<std::size_t>(p), ur = static_cast<std::size_t>(r);
                            // 4096: single copy's first block; 20000: several chunks of the data sets.
                            for (std::size_t n : {std::size_t{0}, std::size_t{1}, up + 1, std::size_t{100},
                                                  std::size_t{4095}, std::size_t{4096}, std::size_t{20000}})
                              for (bool in_place : {false, true})
                                for (bool bound : {false, true}) {
                                  // Block q of rank r's input: value(r, q * n + i).
                                  std::vector<float> send(up * n), recv(up * n, std::nanf(""));
                                  for (std::size_t i = 0; i < up * n; ++i) send[i] = unique(r, i);
                                  if (in_place) recv = send;
                                  const float* in = in_place ? recv.data() : send.data();
                                  if (bound)
                                    rank.comm.alltoall(in, recv.data(), n, DataType::f32, {Algorithm::direct, timeout});
                                  else
                                    direct(rank, Collective::alltoall, in, recv.data(), n, DataType::f32);
                                  expect_equal(
                                      recv,
                                      [&](std::size_t i) { return unique(static_cast<int>(i / n), ur * n + i % n); },
                                      std::string(bound ? "bound " : "") + "alltoall n=" + std::to_string(n) +
                                          (in_place ? " in place" : ""));
                                }
                          }),
                "")
          << "p=" << p << " TUTTI_SHM_COLLECTIVE_COPY=" << copy;
  });
}

// Alltoall in place, several calls outstanding at once: a single-copy run snapshots only the
// blocks for its peers, into memory that each thread keeps for its next call (the larger of the
// last two it dropped); runs in flight together never share it, a smaller call reuses a larger
// one's, and a rank's own block stays in place. Two rounds, sizes growing then shrinking, every
// block exact; the data sets (no snapshot at all) the same way.
TEST_F(ShmDirect, AlltoallInPlaceOutstandingCallsKeepTheirOwnSnapshots) {
  const auto unique = [](int c, int q, std::size_t i) {
    return static_cast<float>(c * 2000000 + q * 200000 + static_cast<int>(i));
  };
  with_each_collective_copy([&](const char* copy) {
    for (int p : {2, 3})
      EXPECT_EQ(run_ranks(p,
                          [&](Rank& rank) {
                            const int r = rank.comm.rank();
                            const auto up = static_cast<std::size_t>(p), ur = static_cast<std::size_t>(r);
                            const std::vector<std::size_t> sizes{4096, 30000, 5000, 30000, 4096, 9000};
                            for (int round = 0; round < 2; ++round) {
                              std::vector<std::vector<float>> bufs(sizes.size());
                              std::vector<Request> pending;
                              for (std::size_t c = 0; c < sizes.size(); ++c) {
                                const std::size_t n = sizes[c];
                                bufs[c].resize(up * n);
                                for (std::size_t i = 0; i < up * n; ++i) bufs[c][i] = unique(static_cast<int>(c), r, i);
                                pending.push_back(rank.comm.ialltoall(bufs[c].data(), bufs[c].data(), n, DataType::f32,
                                                                      {Algorithm::direct, timeout}));
                              }
                              for (Request& request : pending) request.wait();
                              for (std::size_t c = 0; c < sizes.size(); ++c) {
                                const std::size_t n = sizes[c];
                                expect_equal(
                                    bufs[c],
                                    [&](std::size_t i) {
                                      return unique(static_cast<int>(c), static_cast<int>(i / n), ur * n + i % n);
                                    },
                                    "round " + std::to_string(round) + " call " + std::to_string(c) +
                                        " n=" + std::to_string(n));
                              }
                            }
                          }),
                "")
          << "p=" << p << " TUTTI_SHM_COLLECTIVE_COPY=" << copy;
  });
}

bool can_read_other_processes();

// Whether a call went through the data sets (`sets`) or not, by the data-set uses its rank
// reserved (`uses` before it).
void expect_data_sets(const transport::shm::ShmTransport& shm, std::uint64_t uses, bool sets, const std::string& what) {
  if (sets)
    EXPECT_GT(shm.direct_uses(), uses) << what;
  else
    EXPECT_EQ(shm.direct_uses(), uses) << what;
}

// An alltoall that every rank runs in place goes through the data sets (no snapshot of the blocks
// the peers read) below in_place_alltoall_single_copy_bytes of input, where single copy would
// serve it out of place; where only some ranks run it in place (each rank says so with its
// signature), or from that size, every rank moves the blocks by single copy, those in place
// snapshotting theirs. Every block exact either way; which way each call went shows in the
// data-set uses the ranks reserved.
TEST_F(ShmDirect, AlltoallEveryRankInPlaceTakesTheDataSets) {
  if (!can_read_other_processes()) GTEST_SKIP() << "process_vm_readv is not permitted here: no single copy to leave";
  const auto unique = [](int q, std::size_t i) {
    return static_cast<float>(q * 200000 + static_cast<int>(i % 150000));
  };
  setenv("TUTTI_SHM_COLLECTIVE_COPY", "single", 1);
  for (int p : {2, 3})
    EXPECT_EQ(
        run_ranks(p,
                  [&](Rank& rank) {
                    auto& shm = dynamic_cast<transport::shm::ShmTransport&>(*rank.transport);
                    const int r = rank.comm.rank();
                    const auto up = static_cast<std::size_t>(p), ur = static_cast<std::size_t>(r);
                    const std::size_t large = (transport::shm::in_place_alltoall_single_copy_bytes / 4 + up - 1) / up;
                    // who: 0 every rank in place, 1 rank 0 only, 2 none.
                    for (std::size_t n : {std::size_t{4096}, std::size_t{20000}, large})
                      for (int who : {0, 1, 2}) {
                        const bool in_place = who == 0 || (who == 1 && r == 0);
                        std::vector<float> send(up * n), recv(up * n, std::nanf(""));
                        for (std::size_t i = 0; i < up * n; ++i) send[i] = unique(r, i);
                        if (in_place) recv = send;
                        const std::uint64_t uses = shm.direct_uses();
                        rank.comm.alltoall(in_place ? recv.data() : send.data(), recv.data(), n, DataType::f32,
                                           {Algorithm::direct, timeout});
                        const std::string what = "alltoall n=" + std::to_string(n) + " who=" + std::to_string(who);
                        expect_equal(
                            recv, [&](std::size_t i) { return unique(static_cast<int>(i / n), ur * n + i % n); }, what);
                        expect_data_sets(shm, uses, who == 0 && n != large, what);
                      }
                  }),
        "")
        << "p=" << p;
  unsetenv("TUTTI_SHM_COLLECTIVE_COPY");
}

// An allgather goes by single copy below single_copy_allgather_limit of result per rank, and from
// it only where every rank runs it in place (each says so with its signature); otherwise the data
// sets, whose streaming stores win there. Every block exact either way; which way each call went
// shows in the data-set uses the ranks reserved.
TEST_F(ShmDirect, AllgatherPastTheLimitBySingleCopyOnlyWhereEveryRankIsInPlace) {
  if (!can_read_other_processes()) GTEST_SKIP() << "process_vm_readv is not permitted here: no single copy to leave";
  const auto unique = [](int q, std::size_t i) {
    return static_cast<float>(q * 200000 + static_cast<int>(i % 150000));
  };
  setenv("TUTTI_SHM_COLLECTIVE_COPY", "single", 1);
  for (int p : {2, 3})
    EXPECT_EQ(run_ranks(p,
                        [&](Rank& rank) {
                          auto& shm = dynamic_cast<transport::shm::ShmTransport&>(*rank.transport);
                          const int r = rank.comm.rank();
                          const auto up = static_cast<std::size_t>(p), ur = static_cast<std::size_t>(r);
                          const std::size_t large = (transport::shm::single_copy_allgather_limit / 4 + up - 1) / up;
                          // Past the limit only at p = 2 (results of 64 MiB on every rank: the
                          // checks of both sizes at p = 3 too took 27 s under TSan).
                          const std::vector<std::size_t> sizes =
                              p == 2 ? std::vector<std::size_t>{20000, large} : std::vector<std::size_t>{20000};
                          // who: 0 every rank in place, 1 rank 0 only, 2 none.
                          for (std::size_t n : sizes)
                            for (int who : {0, 1, 2}) {
                              const bool in_place = who == 0 || (who == 1 && r == 0);
                              std::vector<float> send(n), recv(up * n, std::nanf(""));
                              for (std::size_t i = 0; i < n; ++i) send[i] = unique(r, i);
                              if (in_place)
                                std::copy(send.begin(), send.end(), recv.begin() + static_cast<std::ptrdiff_t>(ur * n));
                              const std::uint64_t uses = shm.direct_uses();
                              rank.comm.allgather(in_place ? recv.data() + ur * n : send.data(), recv.data(), n,
                                                  DataType::f32, {Algorithm::direct, timeout});
                              const std::string what =
                                  "allgather n=" + std::to_string(n) + " who=" + std::to_string(who);
                              expect_equal(
                                  recv, [&](std::size_t i) { return unique(static_cast<int>(i / n), i % n); }, what);
                              expect_data_sets(shm, uses, n == large && who != 0, what);
                            }
                        }),
              "")
        << "p=" << p;
  unsetenv("TUTTI_SHM_COLLECTIVE_COPY");
}

// A rank whose alltoall is out of place while its peer's is in place, the rank's description of
// it waiting to be published (the rank ran ahead: broadcasts it roots fill its signature slots, the
// peer asleep), and the slot it will take holding an earlier in-place alltoall's description: the
// rank must publish its own (not in place) before the peer decides, so that both move the blocks
// by single copy. Every block exact, well within the deadline.
TEST_F(ShmDirect, AnAlltoallOutOfPlaceWaitingToBePublishedStillSaysSo) {
  if (!can_read_other_processes()) GTEST_SKIP() << "process_vm_readv is not permitted here: nothing described";
  const auto unique = [](int q, std::size_t i) { return static_cast<float>(q * 200000 + static_cast<int>(i)); };
  constexpr auto slots = static_cast<int>(transport::shm::signature_slots);
  setenv("TUTTI_SHM_COLLECTIVE_COPY", "single", 1);
  EXPECT_EQ(
      run_ranks(
          2,
          [&](Rank& rank) {
            const int r = rank.comm.rank();
            const Options options{Algorithm::direct, 10000ms};
            const std::size_t n = transport::shm::single_copy_bytes / sizeof(float);
            std::vector<float> buffer(2 * n);
            const auto fill = [&] {
              for (std::size_t i = 0; i < 2 * n; ++i) buffer[i] = unique(r, i);
            };
            // Every slot of both ranks once holds an in-place alltoall's description.
            for (int i = 0; i < slots; ++i) {
              fill();
              rank.comm.alltoall(buffer.data(), buffer.data(), n, DataType::f32, options);
            }
            if (r == 1) std::this_thread::sleep_for(200ms);
            std::vector<std::uint64_t> got(static_cast<std::size_t>(slots));
            std::vector<Request> pending;
            for (int i = 0; i < slots; ++i) {
              got[static_cast<std::size_t>(i)] = r == 0 ? 7000 + static_cast<std::uint64_t>(i) : 0;
              pending.push_back(rank.comm.ibroadcast(&got[static_cast<std::size_t>(i)], 1, DataType::u64, 0, options));
            }
            fill();
            std::vector<float> out(2 * n, std::nanf(""));
            pending.push_back(
                rank.comm.ialltoall(buffer.data(), r == 0 ? out.data() : buffer.data(), n, DataType::f32, options));
            for (Request& request : pending) request.wait();
            for (int i = 0; i < slots; ++i)
              if (got[static_cast<std::size_t>(i)] != 7000 + static_cast<std::uint64_t>(i))
                throw std::runtime_error("broadcast " + std::to_string(i));
            expect_equal(
                r == 0 ? out : buffer,
                [&](std::size_t i) { return unique(static_cast<int>(i / n), static_cast<std::size_t>(r) * n + i % n); },
                "rank " + std::to_string(r) + " alltoall");
          }),
      "");
  unsetenv("TUTTI_SHM_COLLECTIVE_COPY");
}

TEST_F(ShmDirect, BroadcastCountsSizesAndRoots) {
  for (int p : {1, 2, 3, 5, 8})
    EXPECT_EQ(run_ranks(p,
                        [&](Rank& rank) {
                          const int r = rank.comm.rank();
                          for (std::size_t n : counts_for(p, 1000003))
                            for (int root : {0, p - 1, p / 2}) {
                              std::vector<float> buffer(n, std::nanf(""));
                              if (r == root)
                                for (std::size_t i = 0; i < n; ++i) buffer[i] = value(root, i);
                              direct(rank, Collective::broadcast, buffer.data(), buffer.data(), n, DataType::f32,
                                     std::nullopt, root);
                              expect_equal(
                                  buffer, [&](std::size_t i) { return value(root, i); },
                                  "broadcast n=" + std::to_string(n) + " root " + std::to_string(root));
                            }
                        }),
              "")
        << "p=" << p;
}

// Every type and op, exactly: sum/min/max of 1..3, prod of 1..2 (integers wrap alike on both
// sides), avg of values whose sum is a multiple of p. Expected values are encoded in the type.
constexpr DataType all_types[] = {DataType::i8,  DataType::u8,  DataType::i32,  DataType::u32, DataType::i64,
                                  DataType::u64, DataType::f16, DataType::bf16, DataType::f32, DataType::f64};
constexpr ReduceOp all_ops[] = {ReduceOp::sum, ReduceOp::prod, ReduceOp::min, ReduceOp::max, ReduceOp::avg};

template <typename T>
void put_as(std::byte* at, double v) {
  T x;
  if constexpr (std::is_integral_v<T>)
    x = static_cast<T>(static_cast<std::int64_t>(v));  // modular, like the kernels' wrapping
  else
    x = T(static_cast<float>(v));
  std::memcpy(at, &x, sizeof x);
}

void put(DataType type, std::byte* at, double v) {
  switch (type) {
    case DataType::i8:
      return put_as<std::int8_t>(at, v);
    case DataType::u8:
      return put_as<std::uint8_t>(at, v);
    case DataType::i32:
      return put_as<std::int32_t>(at, v);
    case DataType::u32:
      return put_as<std::uint32_t>(at, v);
    case DataType::i64:
      return put_as<std::int64_t>(at, v);
    case DataType::u64:
      return put_as<std::uint64_t>(at, v);
    case DataType::f16:
      return put_as<f16>(at, v);
    case DataType::bf16:
      return put_as<bf16>(at, v);
    case DataType::f32: {
      const float x = static_cast<float>(v);
      std::memcpy(at, &x, sizeof x);
      return;
    }
    case DataType::f64:
      std::memcpy(at, &v, sizeof v);
      return;
  }
}

double input(ReduceOp op, int p, int r, std::size_t i) {
  const int k = static_cast<int>(i % 3);
  if (op == ReduceOp::prod) return (r + k) % 2 + 1;
  if (op != ReduceOp::avg) return (r + k) % 3 + 1;
  const int offset = (p % 2 == 1 && r == p - 1) ? 0 : (r % 2 == 1 ? 1 : -1);  // the offsets sum to 0
  return k + 2 + offset;
}

double expected(ReduceOp op, int p, std::size_t i) {
  double result = input(op, p, 0, i);
  for (int r = 1; r < p; ++r) {
    const double v = input(op, p, r, i);
    if (op == ReduceOp::sum || op == ReduceOp::avg) result += v;
    if (op == ReduceOp::prod) result *= v;
    if (op == ReduceOp::min) result = std::min(result, v);
    if (op == ReduceOp::max) result = std::max(result, v);
  }
  return op == ReduceOp::avg ? result / p : result;
}

std::vector<std::byte> encode(DataType type, std::size_t n, const std::function<double(std::size_t)>& v) {
  std::vector<std::byte> out(n * size_of(type));
  for (std::size_t i = 0; i < n; ++i) put(type, out.data() + i * size_of(type), v(i));
  return out;
}

// First differing element of `got` against `want`, or "" when equal.
std::string difference(const std::byte* got, const std::vector<std::byte>& want, DataType type) {
  const std::size_t esize = size_of(type);
  for (std::size_t i = 0; i < want.size() / esize; ++i)
    if (std::memcmp(got + i * esize, want.data() + i * esize, esize) != 0) return "element " + std::to_string(i);
  return "";
}

TEST_F(ShmDirect, EveryTypeAndOp) {
  for (int p : {3, 8})
    EXPECT_EQ(run_ranks(p,
                        [&](Rank& rank) {
                          const int r = rank.comm.rank();
                          const auto up = static_cast<std::size_t>(p), ur = static_cast<std::size_t>(r);
                          for (DataType type : all_types)
                            for (ReduceOp op : all_ops)
                              for (std::size_t n : {std::size_t{37}, std::size_t{20011}}) {
                                const std::string what = std::string(to_string(type)) + " " +
                                                         std::string(to_string(op)) + " n=" + std::to_string(n);
                                auto send = encode(type, up * n, [&](std::size_t i) { return input(op, p, r, i); });
                                auto want = encode(type, up * n, [&](std::size_t i) { return expected(op, p, i); });
                                std::vector<std::byte> recv(up * n * size_of(type), std::byte{0xa5});
                                direct(rank, Collective::allreduce, send.data(), recv.data(), up * n, type, op);
                                if (const auto d = difference(recv.data(), want, type); !d.empty())
                                  throw std::runtime_error("allreduce " + what + ": " + d);
                                std::byte* mine = send.data() + ur * n * size_of(type);  // in place
                                direct(rank, Collective::reduce_scatter, send.data(), mine, n, type, op);
                                const std::vector<std::byte> block(
                                    want.begin() + static_cast<long>(ur * n * size_of(type)),
                                    want.begin() + static_cast<long>((ur + 1) * n * size_of(type)));
                                if (const auto d = difference(mine, block, type); !d.empty())
                                  throw std::runtime_error("reduce_scatter " + what + ": " + d);
                              }
                        }),
              "")
        << "p=" << p;
}

// Many calls in a row, of every kind and size, reuse both data sets many times; message-based
// collectives on the same communicator work before, between and after them.
TEST_F(ShmDirect, ManyCallsInterleavedWithMessages) {
  for (int p : {2, 5, 8})
    EXPECT_EQ(
        run_ranks(p,
                  [&](Rank& rank) {
                    const int r = rank.comm.rank();
                    const auto up = static_cast<std::size_t>(p);
                    for (int call = 0; call < 60; ++call) {
                      const std::size_t n =
                          call % 3 == 0 ? 70001 + static_cast<std::size_t>(call) : 5 + static_cast<std::size_t>(call);
                      std::vector<float> send(n), recv(n, std::nanf(""));
                      for (std::size_t i = 0; i < n; ++i) send[i] = value(r, i + static_cast<std::size_t>(call));
                      const auto want = [&](std::size_t i) { return sum_value(p, i + static_cast<std::size_t>(call)); };
                      direct(rank, Collective::allreduce, send.data(), recv.data(), n, DataType::f32, ReduceOp::sum);
                      expect_equal(recv, want, "direct call " + std::to_string(call));
                      if (call % 10 == 0) {
                        recv.assign(n, std::nanf(""));
                        rank.comm.allreduce(send.data(), recv.data(), n, DataType::f32, ReduceOp::sum,
                                            {Algorithm::ring, timeout});
                        expect_equal(recv, want, "ring call " + std::to_string(call));
                        std::vector<float> all(up * n, std::nanf(""));
                        rank.comm.allgather(send.data(), all.data(), n, DataType::f32, {Algorithm::automatic, timeout});
                        expect_equal(
                            all,
                            [&](std::size_t i) {
                              return value(static_cast<int>(i / n), i % n + static_cast<std::size_t>(call));
                            },
                            "message allgather " + std::to_string(call));
                      }
                      std::vector<float> gathered(up * n, std::nanf(""));
                      direct(rank, Collective::allgather, send.data(), gathered.data(), n, DataType::f32);
                      expect_equal(
                          gathered,
                          [&](std::size_t i) {
                            return value(static_cast<int>(i / n), i % n + static_cast<std::size_t>(call));
                          },
                          "direct allgather " + std::to_string(call));
                    }
                  }),
        "")
        << "p=" << p;
}

// A rank that never calls: the others time out naming it, and the communicator is aborted, so
// that the late rank fails too instead of waiting.
TEST_F(ShmDirect, DeadlineWhenARankNeverCalls) {
  std::atomic<int> timed_out{0}, late_failed{0};
  std::atomic<int> finished{0};
  const std::string failures = run_ranks(3, [&](Rank& rank) {
    std::vector<float> data(100, 1.0f);
    if (rank.comm.rank() == 2) {
      while (finished.load() < 2) std::this_thread::sleep_for(1ms);
    } else {
      try {
        direct(rank, Collective::allreduce, data.data(), data.data(), data.size(), DataType::f32, ReduceOp::sum, -1,
               300ms);
      } catch (const Error& e) {
        if (e.code() == ErrorCode::timeout && std::string(e.what()).find("rank(s) 2") != std::string::npos)
          ++timed_out;
        else
          ADD_FAILURE() << e.what();
      }
      ++finished;
      return;
    }
    try {
      direct(rank, Collective::allreduce, data.data(), data.data(), data.size(), DataType::f32, ReduceOp::sum, -1,
             300ms);
    } catch (const Error&) {
      ++late_failed;
    }
  });
  EXPECT_EQ(failures, "");
  EXPECT_EQ(timed_out.load(), 2);
  EXPECT_EQ(late_failed.load(), 1);
}

// Alltoallv goes direct only where the segment allows single copy: elsewhere it is refused as
// unsupported, and the communicator stays usable. Another transport declines altogether.
TEST_F(ShmDirect, UnsupportedKindAndOtherTransports) {
  setenv("TUTTI_SHM_SINGLE_COPY", "0", 1);
  EXPECT_EQ(run_ranks(2,
                      [&](Rank& rank) {
                        float x = 1.0f;
                        if (rank.comm.serves_direct(Collective::alltoallv))
                          throw std::runtime_error("alltoallv is direct without single copy");
                        try {
                          direct(rank, Collective::alltoallv, &x, &x, 1, DataType::f32);
                          throw std::runtime_error("alltoallv did not throw");
                        } catch (const Error& e) {
                          if (e.code() != ErrorCode::unsupported) throw;
                        }
                        // Declining a kind leaves the communicator usable.
                        direct(rank, Collective::allreduce, &x, &x, 1, DataType::f32, ReduceOp::sum);
                        if (x != 2.0f)
                          throw std::runtime_error("allreduce after unsupported gave " + std::to_string(x));
                      }),
            "");
  unsetenv("TUTTI_SHM_SINGLE_COPY");
  auto group = transport::inproc::make_group(1);
  float x = 1.0f;
  EXPECT_FALSE(
      direct_collective(*group[0], Collective::allreduce, &x, &x, 1, DataType::f32, ReduceOp::sum, -1, timeout));
}

// ---- a mismatch among many outstanding collectives ----

// What one rank saw of one call: ok (with exact results or not) or the error's code and text,
// raised by the call itself (a rank that finds the mismatch, or learns of it, when it starts a
// call) or by the wait.
struct CallOutcome {
  bool ok = false;
  bool wrong = false;  // ok, but some element differs from the exact sum
  ErrorCode code = ErrorCode::system;
  std::string what;
};

// p ranks each start `calls` nonblocking allreduces (algorithm `algorithm`) before waiting for
// any; rank 1 passes one element more to call `bad`. Rank 0 starts all of its calls before any
// other rank starts one, so that its signatures run far ahead of theirs (past the table's slots
// when calls > signature_slots). Returns outcomes[rank][call]; `later` gets what a later call
// raised on each rank.
std::vector<std::vector<CallOutcome>> run_outstanding(int p, int calls, int bad, Algorithm algorithm,
                                                      std::vector<std::string>& later, std::size_t base = 64) {
  std::vector<std::vector<CallOutcome>> outcomes(static_cast<std::size_t>(p),
                                                 std::vector<CallOutcome>(static_cast<std::size_t>(calls)));
  later.assign(static_cast<std::size_t>(p), "");
  std::atomic<bool> first_started{false};
  const std::string failures = run_ranks(p, [&](Rank& rank) {
    const int r = rank.comm.rank();
    if (r != 0)
      for (const auto until = clock::now() + 20s; !first_started.load() && clock::now() < until;)
        std::this_thread::sleep_for(1ms);
    const auto uc_calls = static_cast<std::size_t>(calls);
    std::vector<std::vector<float>> send(uc_calls), recv(uc_calls);
    std::vector<std::optional<Request>> requests(uc_calls);
    auto& mine = outcomes[static_cast<std::size_t>(r)];
    for (std::size_t c = 0; c < uc_calls; ++c) {
      const std::size_t n = base + (r == 1 && c == static_cast<std::size_t>(bad) ? 1 : 0);
      send[c].resize(base + 1);
      recv[c].assign(base + 1, std::nanf(""));
      for (std::size_t i = 0; i <= base; ++i) send[c][i] = value(r, i + c);
      try {
        requests[c] =
            rank.comm.iallreduce(send[c].data(), recv[c].data(), n, DataType::f32, ReduceOp::sum, {algorithm, 20000ms});
      } catch (const Error& e) {
        mine[c].code = e.code();
        mine[c].what = e.what();
      }
    }
    if (r == 0) first_started = true;
    for (std::size_t c = 0; c < uc_calls; ++c) {
      if (!requests[c]) continue;
      try {
        requests[c]->wait();
        mine[c].ok = true;
        for (std::size_t i = 0; i < base; ++i) mine[c].wrong = mine[c].wrong || recv[c][i] != sum_value(p, i + c);
      } catch (const Error& e) {
        mine[c].code = e.code();
        mine[c].what = e.what();
      }
    }
    try {
      rank.comm.barrier({Algorithm::automatic, 20000ms});
      later[static_cast<std::size_t>(r)] = "no error";
    } catch (const Error& e) {
      later[static_cast<std::size_t>(r)] = to_string(e.code());
    }
  });
  EXPECT_EQ(failures, "");
  return outcomes;
}

// On every rank: no call returns a wrong result and none from `bad` on succeeds; the first error
// is the mismatch of call `bad`, naming rank 1 and its count; the calls that fail after it fail
// with that error or as aborted, and so do later calls.
void expect_mismatch_caught(int p, int calls, int bad, Algorithm algorithm, std::size_t base = 64) {
  std::vector<std::string> later;
  const auto outcomes = run_outstanding(p, calls, bad, algorithm, later, base);
  const std::string where = "p=" + std::to_string(p) + " calls=" + std::to_string(calls) +
                            " bad=" + std::to_string(bad) + " " + std::string(to_string(algorithm));
  for (int r = 0; r < p; ++r) {
    bool first_error = true;
    for (int c = 0; c < calls; ++c) {
      const CallOutcome& out = outcomes[static_cast<std::size_t>(r)][static_cast<std::size_t>(c)];
      const std::string call = where + ": rank " + std::to_string(r) + " call " + std::to_string(c);
      EXPECT_FALSE(out.ok && out.wrong) << call << " returned a wrong result";
      if (c >= bad) {
        EXPECT_FALSE(out.ok) << call << " succeeded";
      }
      if (out.ok) continue;
      if (first_error || out.code == ErrorCode::mismatch) {
        EXPECT_EQ(out.code, ErrorCode::mismatch) << call << ": " << out.what;
        EXPECT_NE(out.what.find("mismatched collective"), std::string::npos) << call << ": " << out.what;
        EXPECT_NE(out.what.find("#" + std::to_string(bad) + ", count=" + std::to_string(base + 1)), std::string::npos)
            << call << ": " << out.what;
        EXPECT_NE(out.what.find("rank 1 called"), std::string::npos) << call << ": " << out.what;
      } else {
        EXPECT_EQ(out.code, ErrorCode::aborted) << call << ": " << out.what;
      }
      first_error = false;
    }
    EXPECT_FALSE(first_error) << where << ": rank " << r << " saw no error";
    EXPECT_EQ(later[static_cast<std::size_t>(r)], "aborted") << where << ": rank " << r;
  }
}

TEST_F(ShmDirect, MismatchAmongManyOutstandingCallsIsCaught) {
  for (int p : {2, 3}) {
    expect_mismatch_caught(p, 24, 3, Algorithm::direct);
    expect_mismatch_caught(p, 100, 3, Algorithm::direct);
    expect_mismatch_caught(p, 100, 80, Algorithm::direct);
  }
}

// The calls carry their input in the signature table (inline, 1040 bytes at most), except rank 1's
// bad one, one element over: the inline ranks and the one on barriers still all see the mismatch.
TEST_F(ShmDirect, MismatchAcrossTheInlineLimitIsCaught) {
  const std::size_t limit = transport::shm::inline_bytes / sizeof(float);
  for (int p : {2, 3}) {
    expect_mismatch_caught(p, 24, 3, Algorithm::direct, limit);
    expect_mismatch_caught(p, 100, 80, Algorithm::direct, limit);
  }
}

TEST_F(ShmDirect, MismatchAmongManyOutstandingMessageCollectivesIsCaught) {
  for (int p : {2, 3}) {
    expect_mismatch_caught(p, 24, 3, Algorithm::ring);
    expect_mismatch_caught(p, 100, 80, Algorithm::ring);
  }
}

// Many outstanding calls that agree: all succeed with exact results (the table's slots are reused
// many times over while ranks run far apart).
TEST_F(ShmDirect, ManyOutstandingCallsThatAgreeSucceed) {
  for (int p : {2, 3}) {
    std::vector<std::string> later;
    const auto outcomes = run_outstanding(p, 300, 300, Algorithm::direct, later);
    for (int r = 0; r < p; ++r) {
      for (int c = 0; c < 300; ++c) {
        const CallOutcome& out = outcomes[static_cast<std::size_t>(r)][static_cast<std::size_t>(c)];
        EXPECT_TRUE(out.ok && !out.wrong) << "p=" << p << " rank " << r << " call " << c << ": " << out.what;
      }
      EXPECT_EQ(later[static_cast<std::size_t>(r)], "no error");
    }
  }
}

// Through the communicator (so with signatures: inline up to inline_bytes of input, on barriers
// above), every direct collective at the counts around the inline limit, in and out of place.
TEST_F(ShmDirect, InlineAndBarrierCollectivesAroundTheLimit) {
  const std::size_t limit = transport::shm::inline_bytes / sizeof(float);
  for (int p : {1, 2, 3, 5, 8})
    EXPECT_EQ(
        run_ranks(
            p,
            [&](Rank& rank) {
              const int r = rank.comm.rank();
              const auto up = static_cast<std::size_t>(p);
              const Options direct_options{Algorithm::direct, 20000ms};
              for (std::size_t n : {std::size_t{1}, limit / up, limit / up + 1, limit - 1, limit, limit + 1, 2 * limit})
                for (bool in_place : {false, true}) {
                  const std::string what = "n=" + std::to_string(n) + (in_place ? " in place" : "");
                  // allreduce
                  std::vector<float> send(n), recv(n, std::nanf(""));
                  for (std::size_t i = 0; i < n; ++i) send[i] = value(r, i);
                  float* out = in_place ? send.data() : recv.data();
                  rank.comm.allreduce(send.data(), out, n, DataType::f32, ReduceOp::sum, direct_options);
                  expect_equal(
                      in_place ? send : recv, [&](std::size_t i) { return sum_value(p, i); }, "allreduce " + what);
                  // reduce_scatter: block b of rank r's input is value(r, b * n + i)
                  std::vector<float> rs(up * n), block(n, std::nanf(""));
                  for (std::size_t i = 0; i < up * n; ++i) rs[i] = value(r, i);
                  rank.comm.reduce_scatter(rs.data(), in_place ? rs.data() : block.data(), n, DataType::f32,
                                           ReduceOp::sum, direct_options);
                  if (in_place) block.assign(rs.begin(), rs.begin() + static_cast<std::ptrdiff_t>(n));
                  expect_equal(
                      block, [&](std::size_t i) { return sum_value(p, static_cast<std::size_t>(r) * n + i); },
                      "reduce_scatter " + what);
                  // allgather: rank q's block is value(q, i)
                  std::vector<float> all(up * n, std::nanf(""));
                  std::vector<float> mine(n);
                  for (std::size_t i = 0; i < n; ++i) mine[i] = all[static_cast<std::size_t>(r) * n + i] = value(r, i);
                  rank.comm.allgather(in_place ? all.data() + static_cast<std::size_t>(r) * n : mine.data(), all.data(),
                                      n, DataType::f32, direct_options);
                  expect_equal(
                      all, [&](std::size_t i) { return value(static_cast<int>(i / n), i % n); }, "allgather " + what);
                  // broadcast from the last rank
                  std::vector<float> b(n);
                  for (std::size_t i = 0; i < n; ++i) b[i] = r == p - 1 ? value(r, i) : std::nanf("");
                  rank.comm.broadcast(b.data(), n, DataType::f32, p - 1, direct_options);
                  expect_equal(
                      b, [&](std::size_t i) { return value(p - 1, i); }, "broadcast " + what);
                }
            }),
        "")
        << "p=" << p;
}

// Alltoallv around the slot's limit (slot_data_bytes: its header of 3 + 2p words, then its input):
// every rank's input fits (inline), none does (the data sets), and one rank's fits while the
// others' do not and the reverse (every rank must take the data sets alike). Uneven blocks, exact
// results, every element distinct. Direct alltoallv needs single copy: refused elsewhere.
TEST_F(ShmDirect, AlltoallvAroundTheSlotLimit) {
  for (int p : {2, 3, 5})
    EXPECT_EQ(
        run_ranks(
            p,
            [&](Rank& rank) {
              const int r = rank.comm.rank();
              const auto up = static_cast<std::size_t>(p), ur = static_cast<std::size_t>(r);
              const std::size_t limit = (transport::shm::slot_data_bytes -
                                         transport::shm::alltoallv_header_words(up) * sizeof(std::uint64_t)) /
                                        sizeof(float);
              const auto distinct = [](std::size_t q, std::size_t i) { return static_cast<float>(q * 1000000 + i); };
              // Rank q's input of total(q) elements, block t of it: an uneven share (the last block
              // takes the rest), so that blocks differ in size.
              const auto block = [&](std::size_t total, std::size_t t) {
                const std::size_t share = total / (up + 1);
                return t + 1 < up ? share : total - share * (up - 1);
              };
              const std::size_t cases[][2] = {{limit, limit},     {limit + 1, limit + 1}, {limit, limit + 1},
                                              {limit + 1, limit}, {1024, 1024},           {limit - 1, 3}};
              for (const auto& [first, rest] : cases) {
                const auto total = [&](std::size_t q) { return q == 0 ? first : rest; };
                std::vector<std::size_t> sends(up), recvs(up);
                for (std::size_t q = 0; q < up; ++q) sends[q] = block(total(ur), q), recvs[q] = block(total(q), ur);
                std::vector<float> in(total(ur)), out(std::accumulate(recvs.begin(), recvs.end(), std::size_t{0}), -1);
                for (std::size_t i = 0; i < in.size(); ++i) in[i] = distinct(ur, i);
                const std::string what = "p=" + std::to_string(p) + " totals " + std::to_string(first) + "/" +
                                         std::to_string(rest) + " (limit " + std::to_string(limit) + ")";
                try {
                  rank.comm.alltoallv(in.data(), sends, out.data(), recvs, DataType::f32,
                                      Options{Algorithm::direct, 20000ms});
                } catch (const Error& e) {
                  if (rank.comm.serves_direct(Collective::alltoallv) || e.code() != ErrorCode::unsupported) throw;
                  return;
                }
                expect_alltoallv_result(
                    out.data(), p, r, [&](std::size_t q, std::size_t t) { return block(total(q), t); }, distinct, what);
              }
            }),
        "")
        << "p=" << p;
}

// Inline and barrier collectives of every kind, mixed at random (the same draw on every rank), in
// nonblocking batches and blocking calls: every result exact.
TEST_F(ShmDirect, InlineAndBarrierCollectivesMixed) {
  for (int p : {3, 4})
    EXPECT_EQ(
        run_ranks(
            p,
            [&](Rank& rank) {
              const int r = rank.comm.rank();
              const auto up = static_cast<std::size_t>(p);
              std::mt19937 rng(7);
              const Options o{Algorithm::direct, 20000ms};
              struct Call {
                int kind;
                std::size_t n;
                int salt;
                std::vector<float> in, out;
              };
              for (int batch = 0; batch < 150; ++batch) {
                std::vector<Call> calls(1 + rng() % 4);
                std::vector<Request> requests;
                const bool blocking = rng() % 2 == 0;
                for (Call& c : calls) {
                  c.kind = static_cast<int>(rng() % 4);
                  c.n = rng() % 3 == 0 ? 500 + rng() % 3000 : 1 + rng() % 300;
                  c.salt = static_cast<int>(rng() % 100);
                  const std::size_t in = c.kind == 1 ? up * c.n : c.n, out = c.kind == 2 ? up * c.n : c.n;
                  c.in.resize(in);
                  c.out.assign(out, std::nanf(""));
                  for (std::size_t i = 0; i < in; ++i) c.in[i] = value(r, i + static_cast<std::size_t>(c.salt));
                  Request q;
                  if (c.kind == 0)
                    q = rank.comm.iallreduce(c.in.data(), c.out.data(), c.n, DataType::f32, ReduceOp::sum, o);
                  else if (c.kind == 1)
                    q = rank.comm.ireduce_scatter(c.in.data(), c.out.data(), c.n, DataType::f32, ReduceOp::sum, o);
                  else if (c.kind == 2)
                    q = rank.comm.iallgather(c.in.data(), c.out.data(), c.n, DataType::f32, o);
                  else {
                    if (r != 0) c.in.assign(c.n, std::nanf(""));
                    q = rank.comm.ibroadcast(c.in.data(), c.n, DataType::f32, 0, o);
                  }
                  if (blocking)
                    q.wait();
                  else
                    requests.push_back(q);
                }
                for (Request& q : requests) q.wait();
                for (const Call& c : calls) {
                  const auto salt = static_cast<std::size_t>(c.salt);
                  const std::string what = "batch " + std::to_string(batch) + " kind " + std::to_string(c.kind) +
                                           " n=" + std::to_string(c.n);
                  if (c.kind == 0)
                    expect_equal(
                        c.out, [&](std::size_t i) { return sum_value(p, i + salt); }, what);
                  else if (c.kind == 1)
                    expect_equal(
                        c.out,
                        [&](std::size_t i) { return sum_value(p, static_cast<std::size_t>(r) * c.n + i + salt); },
                        what);
                  else if (c.kind == 2)
                    expect_equal(
                        c.out, [&](std::size_t i) { return value(static_cast<int>(i / c.n), i % c.n + salt); }, what);
                  else
                    expect_equal(
                        c.in, [&](std::size_t i) { return value(0, i + salt); }, what);
                }
              }
            }),
        "")
        << "p=" << p;
}

// "ok", or the code of the Error `call` raised.
std::string outcome(const std::function<void()>& call) {
  try {
    call();
    return "ok";
  } catch (const Error& e) {
    return std::string(to_string(e.code()));
  }
}

// A mismatched call: `culprit` raised mismatch from it with its buffer untouched (-1); every rank
// raised the mismatch (or the abort that carries it) from that call or the barrier after it.
void expect_mismatch_everywhere(const std::vector<std::string>& first, const std::vector<std::string>& second,
                                const std::vector<float>& untouched, int culprit) {
  EXPECT_EQ(first[static_cast<std::size_t>(culprit)], "mismatch");
  EXPECT_EQ(untouched[static_cast<std::size_t>(culprit)], -1.0f);
  for (std::size_t u = 0; u < first.size(); ++u) {
    EXPECT_TRUE(first[u] == "ok" || first[u] == "mismatch" || first[u] == "aborted") << u << ": " << first[u];
    EXPECT_TRUE(second[u] == "mismatch" || second[u] == "aborted") << u << ": " << second[u];
  }
}

// Mismatched calls in which no rank reads another's input (a broadcast's root beside the
// non-roots of a gather), made by all ranks at the same moment, many times: each pair of ranks
// is compared by the later of the two to arrive (ShmTransport::arrive), so one of them raises the
// mismatch and every rank raises it (or the abort) by its next call. With more than 32 ranks the
// arrivals are counted instead of marked, and the same holds; small collectives stay exact.
TEST_F(ShmDirect, MismatchOfCallsThatReadNoPeerIsCaughtWhenRanksArriveTogether) {
  for (const auto& [p, rounds] : {std::pair{2, 40}, std::pair{3, 20}, std::pair{34, 2}}) {
    for (int round = 0; round < rounds; ++round) {
      std::vector<std::string> first(static_cast<std::size_t>(p)), second(static_cast<std::size_t>(p));
      std::atomic<int> arrived{0};
      EXPECT_EQ(run_ranks(p,
                          [&](Rank& rank) {
                            const int r = rank.comm.rank();
                            const Options o{Algorithm::direct, 20000ms};
                            if (p > 32) {  // the counted arrivals compare exactly as the marked ones
                              std::vector<float> in(3), out(3, -1.0f);
                              for (std::size_t i = 0; i < in.size(); ++i) in[i] = value(r, i);
                              rank.comm.allreduce(in.data(), out.data(), in.size(), DataType::f32, ReduceOp::sum, o);
                              expect_equal(
                                  out, [&](std::size_t i) { return sum_value(p, i); }, "allreduce");
                            }
                            // Every rank leaves this spin within a few microseconds of the others.
                            arrived.fetch_add(1);
                            const auto until = clock::now() + 20s;
                            while (arrived.load() < p && clock::now() < until) std::this_thread::yield();
                            std::vector<float> b(2, static_cast<float>(r)), all(2 * static_cast<std::size_t>(p));
                            first[static_cast<std::size_t>(r)] = outcome([&] {
                              if (r == 0)
                                rank.comm.broadcast(b.data(), 2, DataType::f32, 0, o);
                              else
                                rank.comm.gather(b.data(), all.data(), 2, DataType::f32, 0, o);
                            });
                            second[static_cast<std::size_t>(r)] = outcome([&] { rank.comm.barrier(o); });
                          }),
                "")
          << "p=" << p;
      const bool raised = std::find(first.begin(), first.end(), "mismatch") != first.end() ||
                          std::find(second.begin(), second.end(), "mismatch") != second.end();
      EXPECT_TRUE(raised) << "p=" << p << " round " << round << ": no rank raised the mismatch";
      for (std::size_t u = 0; u < first.size(); ++u) {
        EXPECT_TRUE(first[u] == "ok" || first[u] == "mismatch" || first[u] == "aborted") << u << ": " << first[u];
        EXPECT_TRUE(second[u] == "mismatch" || second[u] == "aborted")
            << "p=" << p << " rank " << u << ": " << second[u];
      }
    }
  }
}

// Alltoallv counts on which two ranks disagree (rank 0 sends rank 1 one element more, or one
// fewer, than rank 1 expects), with inputs small enough for the data set and too large for it
// (read from the peer): the direct exchange raises mismatch on every rank from that call, naming
// both counts, and the rank that expected another count finds nothing written into its buffer
// (it used to return with its peer's next block, or bytes past its input, in its result).
TEST_F(ShmDirect, AlltoallvCountsThatDisagreeRaiseMismatchOnEveryRankBeforeAnythingIsRead) {
  const int p = 3;
  for (const std::size_t n : {std::size_t{2}, std::size_t{100'000}})
    for (const int extra : {1, -1}) {
      std::vector<std::string> errors(p);
      std::vector<int> untouched(p, 0);
      EXPECT_EQ(
          run_ranks(
              p,
              [&](Rank& rank) {
                const int r = rank.comm.rank();
                std::vector<std::size_t> send(p, n), recv(p, n);
                if (r == 1) recv[0] = n + static_cast<std::size_t>(static_cast<long>(extra));
                std::vector<float> in(p * n + 1, static_cast<float>(r)), out(p * n + 1, -1.0f);
                try {
                  rank.comm.alltoallv(in.data(), send, out.data(), recv, DataType::f32, {Algorithm::direct, timeout});
                  errors[static_cast<std::size_t>(r)] = "ok";
                } catch (const Error& e) {
                  errors[static_cast<std::size_t>(r)] = std::string(to_string(e.code())) + ": " + e.what();
                }
                untouched[static_cast<std::size_t>(r)] = static_cast<int>(std::count(out.begin(), out.end(), -1.0f));
              }),
          "");
      const std::string want = "rank 0 sends " + std::to_string(n) + " elements to rank 1, which expects " +
                               std::to_string(n + static_cast<std::size_t>(static_cast<long>(extra))) +
                               " (recv_counts[0])";
      for (int r = 0; r < p; ++r) {
        const std::string& e = errors[static_cast<std::size_t>(r)];
        EXPECT_EQ(e.rfind("mismatch: ", 0), 0u) << "n=" << n << " extra=" << extra << " rank " << r << ": " << e;
        EXPECT_NE(e.find(want), std::string::npos) << e;
      }
      EXPECT_EQ(untouched[1], static_cast<int>(p * n + 1)) << "n=" << n << " extra=" << extra;
    }
}

// Alltoallv tries inline on every rank: where every rank's input fits in its signature slot each
// takes its blocks from the slots, else every rank goes on through the data set, as it sees the
// flags. Here one rank's input fits and another's does not (rank `big` sends large blocks), on the
// short way (blocking) and as a run with others outstanding (nonblocking, several at once); every
// block exact, in place and not. Large blocks single copy, written into the receivers (bound
// runs) or read from the senders (unbound).
TEST_F(ShmDirect, AlltoallvTakesTheSlotsOnlyWhereEveryRanksInputFits) {
  for (int p : {2, 3, 5})
    EXPECT_EQ(run_ranks(p,
                        [&](Rank& rank) {
                          const int r = rank.comm.rank();
                          const auto up = static_cast<std::size_t>(p), ur = static_cast<std::size_t>(r);
                          const Options options{Algorithm::direct, timeout};
                          // Unbound (straight on the transport, no signature: single copy reads
                          // rather than writes), blocks of 20000 elements from each rank.
                          {
                            const std::size_t n = 20000;
                            std::vector<std::size_t> counts(up, n);
                            std::vector<float> in(up * n), out(up * n, -1.0f);
                            for (std::size_t i = 0; i < in.size(); ++i)
                              in[i] = static_cast<float>(r * 200000 + static_cast<int>(i));
                            auto run = transport::shm::start_direct(
                                *rank.transport,
                                comm::make_call(Collective::alltoallv, in.data(), out.data(), 0, DataType::f32,
                                                std::nullopt, -1, {}, counts, counts),
                                timeout);
                            transport::Signature signature;
                            signature.seq = transport::no_seq;
                            signature.collective = Collective::alltoallv;
                            transport::finish(*run, *rank.transport, signature, timeout);
                            expect_equal(
                                out,
                                [&](std::size_t i) { return static_cast<float>((i / n) * 200000 + ur * n + i % n); },
                                "unbound alltoallv");
                          }
                          for (int big : {-1, 0, p - 1})  // -1: every input fits
                            for (bool in_place : {false, true}) {
                              // Rank q sends v(q, t) elements to rank t; in place, each receives as much as it sends.
                              const auto v = [&](std::size_t q, std::size_t t) -> std::size_t {
                                if (in_place)
                                  return static_cast<int>(q) == big || static_cast<int>(t) == big ? 300 : (q + t) % 3;
                                return static_cast<int>(q) == big ? 300 : (q + 2 * t) % 4;
                              };
                              const int calls = 3;
                              std::vector<std::vector<float>> ins(calls), outs(calls);
                              std::vector<std::size_t> sends(up), recvs(up);
                              for (std::size_t t = 0; t < up; ++t) sends[t] = v(ur, t), recvs[t] = v(t, ur);
                              const std::size_t total_in = std::accumulate(sends.begin(), sends.end(), std::size_t{0});
                              const std::size_t total_out = std::accumulate(recvs.begin(), recvs.end(), std::size_t{0});
                              std::vector<Request> pending;
                              for (int c = 0; c < calls; ++c) {
                                ins[c].resize(total_in);
                                for (std::size_t i = 0; i < total_in; ++i)
                                  ins[c][i] = static_cast<float>(c * 100000 + r * 10000 + static_cast<int>(i));
                                outs[c].assign(std::max(total_in, total_out), -1.0f);
                                if (in_place) std::copy(ins[c].begin(), ins[c].end(), outs[c].begin());
                                const float* send = in_place ? outs[c].data() : ins[c].data();
                                if (c == 0)
                                  rank.comm.alltoallv(send, sends, outs[c].data(), recvs, DataType::f32, options);
                                else
                                  pending.push_back(
                                      rank.comm.ialltoallv(send, sends, outs[c].data(), recvs, DataType::f32, options));
                              }
                              for (Request& request : pending) request.wait();
                              for (int c = 0; c < calls; ++c)
                                expect_alltoallv_result(
                                    outs[c].data(), p, r, v,
                                    [&](std::size_t q, std::size_t i) {
                                      return static_cast<float>(c * 100000 + static_cast<int>(q) * 10000 +
                                                                static_cast<int>(i));
                                    },
                                    "alltoallv call " + std::to_string(c) + " big " + std::to_string(big) +
                                        (in_place ? " in place" : ""));
                            }
                        }),
              "")
        << "p=" << p;
}

// An inline broadcast waits for the root only, so a rank may return from a broadcast that another
// rank mismatched; the communicator is aborted all the same, and that rank's next call raises it.
// The rank that disagrees with the root fails in the broadcast itself, its buffer untouched.
TEST_F(ShmDirect, InlineBroadcastMismatchReachesEveryRank) {
  const int p = 3;
  std::vector<std::string> first(p), second(p);
  std::vector<float> untouched(p, 0);
  EXPECT_EQ(run_ranks(p,
                      [&](Rank& rank) {
                        const int r = rank.comm.rank();
                        std::vector<float> b(5, r == 0 ? 7.0f : -1.0f);
                        const auto u = static_cast<std::size_t>(r);
                        first[u] = outcome([&] {
                          rank.comm.broadcast(b.data(), r == 2 ? 5 : 4, DataType::f32, 0, {Algorithm::direct, 20000ms});
                        });
                        untouched[u] = b[0];
                        second[u] = outcome([&] { rank.comm.barrier({Algorithm::automatic, 20000ms}); });
                      }),
            "");
  expect_mismatch_everywhere(first, second, untouched, 2);
}

// A collective of no elements waits for no rank (it is done once its signature is published):
// every count-0 call of a run of them returns, with nothing written, and one whose count disagrees
// with another rank's still fails on every rank, at that call or at the next.
TEST_F(ShmDirect, ZeroCountCollectivesWaitForNoRankYetMismatchesReachEveryRank) {
  const int p = 3;
  std::vector<std::string> first(p), second(p);
  std::vector<float> untouched(p, 0);
  std::atomic<bool> rank0_returned{false};
  EXPECT_EQ(
      run_ranks(
          p,
          [&](Rank& rank) {
            const int r = rank.comm.rank();
            // Rank 0's first calls return before any other rank has made one.
            if (r == 0) {
              float none = 0;
              rank.comm.allreduce(&none, &none, 0, DataType::f32, ReduceOp::sum, {Algorithm::direct, 20000ms});
              rank.comm.broadcast(&none, 0, DataType::f32, 1, {Algorithm::direct, 20000ms});
              rank0_returned = true;
            } else {
              const auto until = std::chrono::steady_clock::now() + 20s;
              while (!rank0_returned && std::chrono::steady_clock::now() < until) std::this_thread::yield();
              if (!rank0_returned) throw std::runtime_error("rank 0's count-0 calls waited for the other ranks");
              float none = 0;
              rank.comm.allreduce(&none, &none, 0, DataType::f32, ReduceOp::sum, {Algorithm::direct, 20000ms});
              rank.comm.broadcast(&none, 0, DataType::f32, 1, {Algorithm::direct, 20000ms});
            }
            std::vector<float> in(p, 1.0f), out(p, -1.0f);
            for (int i = 0; i < 200; ++i) {  // more than the table's slots
              rank.comm.allreduce(in.data(), out.data(), 0, DataType::f32, ReduceOp::sum, {Algorithm::direct, 20000ms});
              rank.comm.allgather(in.data(), out.data(), 0, DataType::f32, {Algorithm::direct, 20000ms});
              rank.comm.broadcast(out.data(), 0, DataType::f32, i % p, {Algorithm::direct, 20000ms});
            }
            if (out != std::vector<float>(p, -1.0f)) throw std::runtime_error("a count-0 call wrote");
            rank.comm.barrier({Algorithm::automatic, 20000ms});  // none is still in the loop
            const auto u = static_cast<std::size_t>(r);
            first[u] = outcome([&] {
              rank.comm.allreduce(in.data(), out.data(), r == 1 ? 1 : 0, DataType::f32, ReduceOp::sum,
                                  {Algorithm::direct, 20000ms});
            });
            untouched[u] = out[0];
            second[u] = outcome([&] { rank.comm.barrier({Algorithm::automatic, 20000ms}); });
          }),
      "");
  // Rank 1 waits for every rank's input, so it sees the others' signatures.
  expect_mismatch_everywhere(first, second, untouched, 1);
}

// A blocking small direct collective on an idle communicator takes the short way
// (ShmTransport::run_now): published and read under one lock. A rank whose peers are late hands
// it to a DirectRun after its spin; whichever rank is late, every result is exact, and the calls
// after it (short again) too. Allgatherv with uneven blocks (one empty) and alltoallv, in place
// and not.
TEST_F(ShmDirect, ALateRankMakesTheShortWayHandOverWithExactResults) {
  const int p = 3;
  const auto up = static_cast<std::size_t>(p);
  const std::size_t n = 3;
  for (int late = 0; late < p; ++late)
    EXPECT_EQ(
        run_ranks(
            p,
            [&](Rank& rank) {
              const int r = rank.comm.rank();
              const Options o{Algorithm::direct, 20000ms};
              for (int call = 0; call < 36; ++call) {  // the late rank late once in each kind
                if (r == late && call % 6 == (call / 6) % 6) std::this_thread::sleep_for(20ms);
                const std::string what = "late rank " + std::to_string(late) + ", call " + std::to_string(call);
                switch (call % 6) {
                  case 0: {
                    std::vector<float> in(n), out(n, std::nanf(""));
                    for (std::size_t i = 0; i < n; ++i) in[i] = value(r, i + call);
                    rank.comm.allreduce(in.data(), out.data(), n, DataType::f32, ReduceOp::sum, o);
                    expect_equal(
                        out, [&](std::size_t i) { return sum_value(p, i + call); }, "allreduce " + what);
                    break;
                  }
                  case 1: {
                    std::vector<float> in(up * n), out(n, std::nanf(""));
                    for (std::size_t i = 0; i < up * n; ++i) in[i] = value(r, i);
                    rank.comm.reduce_scatter(in.data(), out.data(), n, DataType::f32, ReduceOp::sum, o);
                    expect_equal(
                        out, [&](std::size_t i) { return sum_value(p, r * n + i); }, "reduce_scatter " + what);
                    break;
                  }
                  case 2: {
                    std::vector<float> in(n), out(up * n, std::nanf(""));
                    for (std::size_t i = 0; i < n; ++i) in[i] = value(r, i);
                    rank.comm.allgather(in.data(), out.data(), n, DataType::f32, o);
                    expect_equal(
                        out, [&](std::size_t i) { return value(static_cast<int>(i / n), i % n); }, "allgather " + what);
                    break;
                  }
                  case 3: {
                    const bool in_place = call % 2 == 1;
                    std::vector<std::size_t> counts(up), starts(up + 1, 0);
                    for (std::size_t q = 0; q < up; ++q) counts[q] = q == 1 ? 0 : n + q;
                    for (std::size_t q = 0; q < up; ++q) starts[q + 1] = starts[q] + counts[q];
                    const auto ur = static_cast<std::size_t>(r);
                    std::vector<float> in(counts[ur]), out(starts[up], std::nanf(""));
                    for (std::size_t i = 0; i < in.size(); ++i) in[i] = value(r, i + call);
                    if (in_place) std::copy(in.begin(), in.end(), out.begin() + static_cast<long>(starts[ur]));
                    rank.comm.allgatherv(in_place ? out.data() + starts[ur] : in.data(), counts[ur], out.data(), counts,
                                         DataType::f32, o);
                    for (std::size_t q = 0; q < up; ++q)
                      expect_equal(
                          std::vector<float>(out.begin() + static_cast<long>(starts[q]),
                                             out.begin() + static_cast<long>(starts[q + 1])),
                          [&](std::size_t i) { return value(static_cast<int>(q), i + call); },
                          "allgatherv block " + std::to_string(q) + (in_place ? " in place " : " ") + what);
                    break;
                  }
                  case 4: {  // rank q sends q + t + 1 elements to rank t (in place: the reverse)
                    const bool in_place = call % 2 == 1;
                    const auto ur = static_cast<std::size_t>(r);
                    const auto v = [&](std::size_t from, std::size_t to) {
                      return in_place ? from + to + 1 : from + 2 * to + 1;
                    };
                    std::vector<std::size_t> sends(up), recvs(up), at(up + 1, 0);
                    for (std::size_t q = 0; q < up; ++q) sends[q] = v(ur, q), recvs[q] = v(q, ur);
                    for (std::size_t q = 0; q < up; ++q) at[q + 1] = at[q] + sends[q];
                    std::vector<float> in(at[up]),
                        out(std::max(at[up], std::accumulate(recvs.begin(), recvs.end(), std::size_t{0})),
                            std::nanf(""));
                    for (std::size_t i = 0; i < in.size(); ++i) in[i] = value(r, i + call);
                    if (in_place) std::copy(in.begin(), in.end(), out.begin());
                    rank.comm.alltoallv(in_place ? out.data() : in.data(), sends, out.data(), recvs, DataType::f32, o);
                    // Block q: what rank q sent from its block r, after its blocks 0..r-1.
                    std::size_t from = 0;
                    for (std::size_t q = 0; q < up; ++q) {
                      std::size_t skip = 0;
                      for (std::size_t t = 0; t < ur; ++t) skip += v(q, t);
                      expect_equal(
                          std::vector<float>(out.begin() + static_cast<long>(from),
                                             out.begin() + static_cast<long>(from + recvs[q])),
                          [&](std::size_t i) { return value(static_cast<int>(q), skip + i + call); },
                          "alltoallv block " + std::to_string(q) + (in_place ? " in place " : " ") + what);
                      from += recvs[q];
                    }
                    break;
                  }
                  default: {
                    const int root = call % p;
                    std::vector<float> b(n);
                    for (std::size_t i = 0; i < n; ++i) b[i] = r == root ? value(root, i) : std::nanf("");
                    rank.comm.broadcast(b.data(), n, DataType::f32, root, o);
                    expect_equal(
                        b, [&](std::size_t i) { return value(root, i); }, "broadcast " + what);
                  }
                }
              }
            }),
        "")
        << "late rank " << late;
}

// Two ranks disagree on a small call that both take the short way, either one arriving first: both
// raise the mismatch from that call with their buffers untouched, and the next call raises it too.
TEST_F(ShmDirect, MismatchOnTheShortWayIsCaughtWhicheverRankComesFirst) {
  for (int late = 0; late < 2; ++late) {
    std::vector<std::string> first(2), second(2);
    std::vector<float> untouched(2, 0);
    EXPECT_EQ(
        run_ranks(2,
                  [&](Rank& rank) {
                    const int r = rank.comm.rank();
                    const auto u = static_cast<std::size_t>(r);
                    std::vector<float> in(4, 1.0f), out(8, -1.0f);
                    if (r == late) std::this_thread::sleep_for(20ms);
                    first[u] = outcome([&] {
                      if (r == 0)
                        rank.comm.allreduce(in.data(), out.data(), 4, DataType::f32, ReduceOp::sum,
                                            {Algorithm::direct, 20000ms});
                      else
                        rank.comm.allgather(in.data(), out.data(), 4, DataType::f32, {Algorithm::direct, 20000ms});
                    });
                    untouched[u] = *std::max_element(out.begin(), out.end());
                    second[u] = outcome([&] { rank.comm.barrier({Algorithm::automatic, 20000ms}); });
                  }),
        "");
    for (int r = 0; r < 2; ++r) {
      const auto u = static_cast<std::size_t>(r);
      EXPECT_EQ(first[u], "mismatch") << "rank " << r << ", late rank " << late;
      EXPECT_EQ(untouched[u], -1.0f) << "rank " << r << ", late rank " << late;
      EXPECT_TRUE(second[u] == "mismatch" || second[u] == "aborted") << second[u];
    }
  }
}

// Small calls the short way does not take, because they are invalid or in a form it leaves to the
// general path: the invalid ones fail with invalid_argument on every rank before anything is
// sent (the communicator stays usable), the others give exact results.
TEST_F(ShmDirect, SmallCallsOutsideTheShortWayAreValidatedOrRunAsBefore) {
  const int p = 2;
  EXPECT_EQ(
      run_ranks(
          p,
          [&](Rank& rank) {
            const int r = rank.comm.rank();
            for (const Algorithm a : {Algorithm::direct, Algorithm::automatic}) {
              const Options o{a, 20000ms};
              std::vector<float> in(8, 1.0f), out(16, 0.0f);
              const std::vector<std::function<void()>> invalid = {
                  [&] { rank.comm.allreduce(nullptr, out.data(), 2, DataType::f32, ReduceOp::sum, o); },
                  [&] { rank.comm.allreduce(in.data(), nullptr, 2, DataType::f32, ReduceOp::sum, o); },
                  [&] { rank.comm.allreduce(in.data(), in.data() + 1, 2, DataType::f32, ReduceOp::sum, o); },
                  [&] { rank.comm.allreduce(in.data(), out.data(), 2, static_cast<DataType>(99), ReduceOp::sum, o); },
                  [&] { rank.comm.allreduce(in.data(), out.data(), 2, DataType::f32, static_cast<ReduceOp>(99), o); },
                  [&] {
                    rank.comm.allreduce(in.data(), out.data(), 2, DataType::f32, ReduceOp::sum, {a, -1ms});
                  },
                  [&] { rank.comm.broadcast(in.data(), 2, DataType::f32, p, o); },
                  [&] { rank.comm.broadcast(nullptr, 2, DataType::f32, 0, o); },
                  [&] { rank.comm.allgather(in.data(), in.data() + 1, 2, DataType::f32, o); },
                  [&] { rank.comm.reduce_scatter(in.data() + 1, in.data(), 2, DataType::f32, ReduceOp::sum, o); },
              };
              for (std::size_t i = 0; i < invalid.size(); ++i)
                if (outcome(invalid[i]) != "invalid_argument")
                  throw std::runtime_error("invalid call " + std::to_string(i) + " with " + std::string(to_string(a)) +
                                           ": " + outcome(invalid[i]));
              // reduce_scatter in the MPI form with the result in this rank's block.
              std::vector<float> rs(4);
              for (std::size_t i = 0; i < 4; ++i) rs[i] = value(r, i);
              rank.comm.reduce_scatter(rs.data(), rs.data() + 2 * r, 2, DataType::f32, ReduceOp::sum, o);
              expect_equal(
                  std::vector<float>(rs.begin() + 2 * r, rs.begin() + 2 * r + 2),
                  [&](std::size_t i) { return sum_value(p, 2 * r + i); },
                  "reduce_scatter with its result in its block");
              // allgather in the MPI form with this rank's block already in place.
              std::vector<float> all(4, std::nanf(""));
              for (std::size_t i = 0; i < 2; ++i) all[2 * r + i] = value(r, i);
              rank.comm.allgather(all.data() + 2 * r, all.data(), 2, DataType::f32, o);
              expect_equal(
                  all, [&](std::size_t i) { return value(static_cast<int>(i / 2), i % 2); },
                  "allgather with its block in place");
            }
          }),
      "");
}

// Ranks far apart: collectives that exchange no data let some ranks run hundreds of signatures
// ahead (their publication deferred until the table's slots are free), then an inline allreduce
// needs every rank's publications to move on: it must finish, with the right sum.
TEST_F(ShmDirect, InlineCollectiveAfterRanksRanFarApart) {
  for (int p : {2, 4})
    EXPECT_EQ(
        run_ranks(
            p,
            [&](Rank& rank) {
              const int r = rank.comm.rank();
              if (r % 2 == 1) std::this_thread::sleep_for(20ms);
              for (int i = 0; i < 500; ++i)
                rank.comm.reduce_scatter(nullptr, nullptr, 0, DataType::f32, ReduceOp::sum, {Algorithm::ring, 20000ms});
              float x = static_cast<float>(r + 1), sum = 0;
              rank.comm.allreduce(&x, &sum, 1, DataType::f32, ReduceOp::sum, {Algorithm::direct, 20000ms});
              if (sum != static_cast<float>(p * (p + 1) / 2)) throw std::runtime_error("sum " + std::to_string(sum));
            }),
        "")
        << "p=" << p;
}

// A broadcast's root returns once its input is published, so it runs ahead of its receivers until
// the signature table is full; then it waits for slot_slack free slots at once, woken by the
// receiver whose consumption reaches its threshold. Receivers that pause (in bursts, and one that
// starts late) still get every value exactly, blocking and nonblocking, and nobody times out.
TEST_F(ShmDirect, ARootRunningAheadWaitsForFreeSlotsAndGetsThem) {
  constexpr int calls = 3 * static_cast<int>(transport::shm::signature_slots) + 7;
  for (int p : {2, 3})
    EXPECT_EQ(run_ranks(p,
                        [&](Rank& rank) {
                          const int r = rank.comm.rank();
                          const Options options{Algorithm::direct, 20000ms};
                          if (r == p - 1) std::this_thread::sleep_for(30ms);
                          std::vector<Request> pending;
                          std::vector<std::uint64_t> got(calls);
                          for (int i = 0; i < calls; ++i) {
                            if (r != 0 && i % 50 == 49) std::this_thread::sleep_for(3ms);
                            got[i] = r == 0 ? 1000 + static_cast<std::uint64_t>(i) : 0;
                            if (i % 3 == 0)
                              pending.push_back(rank.comm.ibroadcast(&got[i], 1, DataType::u64, 0, options));
                            else
                              rank.comm.broadcast(&got[i], 1, DataType::u64, 0, options);
                          }
                          for (Request& request : pending) request.wait();
                          for (int i = 0; i < calls; ++i)
                            if (got[i] != 1000 + static_cast<std::uint64_t>(i))
                              throw std::runtime_error("rank " + std::to_string(r) + " call " + std::to_string(i) +
                                                       ": " + std::to_string(got[i]));
                        }),
              "")
        << "p=" << p;
}

// In a child: rank r of 3 runs direct allreduces; rank 2 runs one and exits. The others must
// stop with peer_failure naming rank 2 (exit 0), not wait for their deadline (exit 2 or 3).
[[noreturn]] void child_direct_loop(const std::string& name, int r) {
  int code = 3;
  try {
    auto t = transport::shm::open(name, r, 3, 13, 20000ms);
    std::vector<float> data(100000, 1.0f);
    for (int i = 0; i < (r == 2 ? 1 : 1000000); ++i)
      if (!direct_collective(*t, Collective::allreduce, data.data(), data.data(), data.size(), DataType::f32,
                             ReduceOp::max, -1, 20000ms))
        _exit(2);
    if (r == 2) _exit(0);
  } catch (const Error& e) {
    code =
        e.code() == ErrorCode::peer_failure && std::string(e.what()).find("rank 2 died") != std::string::npos ? 0 : 2;
    if (code != 0) std::fprintf(stderr, "rank %d: %s\n", r, e.what());
  } catch (...) {
    code = 2;
  }
  _exit(code);
}

TEST_F(ShmDirect, ExitedProcessIsReportedToTheOthers) {
  const std::string name = unique_shm_name();
  std::vector<pid_t> pids;
  for (int r = 0; r < 3; ++r) {
    const pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) child_direct_loop(name, r);
    pids.push_back(pid);
  }
  const auto deadline = clock::now() + 15s;
  for (int r = 0; r < 3; ++r) {
    const int status = reap(pids[static_cast<std::size_t>(r)], deadline);
    ASSERT_TRUE(status >= 0 && WIFEXITED(status)) << "rank " << r << " hung or crashed";
    EXPECT_EQ(WEXITSTATUS(status), 0) << "rank " << r;
  }
}

// Allgather, reduce_scatter and broadcast from single_copy_bytes on move blocks straight between
// the ranks' buffers: exact results on both sides of single_copy_bytes, in and out of place,
// every root, with single copy on (where the system allows it) and off, and with the collectives'
// copy forced each way (TUTTI_SHM_COLLECTIVE_COPY). A broadcast's root writes a 1/p share of
// whole pages into every receiver while they read the rest from shared_broadcast_bytes: on both
// sides of that, and shares of many pages, buffers of whole pages and not.
TEST_F(ShmDirect, SizesAroundTheSingleCopyLimits) {
  const std::size_t low = transport::shm::single_copy_bytes / sizeof(float);
  const std::size_t high = 512 * 1024 / sizeof(float);
  for (const auto& [setting, copy] : copy_settings) {
    setenv("TUTTI_SHM_SINGLE_COPY", setting, 1);
    setenv("TUTTI_SHM_COLLECTIVE_COPY", copy, 1);
    for (int p : {2, 3, 5})
      EXPECT_EQ(run_ranks(p,
                          [&](Rank& rank) {
                            const int r = rank.comm.rank();
                            const auto up = static_cast<std::size_t>(p);
                            const Options options{Algorithm::direct, 20000ms};
                            for (std::size_t n : {low - 1, low, 3 * low + 1}) {
                              for (bool in_place : {false, true}) {
                                std::vector<float> out(n * up, -1.0f), in(n);
                                for (std::size_t i = 0; i < n; ++i) in[i] = value(r, i);
                                if (in_place) std::copy(in.begin(), in.end(), out.begin() + r * n);
                                rank.comm.allgather(in_place ? out.data() + r * n : in.data(), out.data(), n,
                                                    DataType::f32, options);
                                for (int q = 0; q < p; ++q)
                                  expect_equal(
                                      std::vector<float>(out.begin() + q * n, out.begin() + (q + 1) * n),
                                      [&](std::size_t i) { return value(q, i); },
                                      "allgather n=" + std::to_string(n) + " block " + std::to_string(q));
                              }
                            }
                            // Blocks around 16 KiB and an input around 128 KiB (where reduce_scatter once
                            // changed paths), through the data sets now.
                            const std::size_t rs_high = 128 * 1024 / sizeof(float) / up;
                            for (std::size_t n : {low - 1, low, rs_high - 1, rs_high})
                              for (int place : {0, 1, 2}) {  // out of place; in place NCCL's way; MPI's
                                std::vector<float> in(n * up), out(n, -1.0f);
                                for (std::size_t i = 0; i < n * up; ++i) in[i] = value(r, i);
                                const void* send = in.data();
                                void* recv = place == 0   ? static_cast<void*>(out.data())
                                             : place == 1 ? static_cast<void*>(in.data() + r * n)
                                                          : static_cast<void*>(in.data());
                                rank.comm.reduce_scatter(send, recv, n, DataType::f32, ReduceOp::sum, options);
                                const float* got = static_cast<const float*>(recv);
                                expect_equal(
                                    std::vector<float>(got, got + n),
                                    [&](std::size_t i) { return sum_value(p, r * n + i); },
                                    "reduce_scatter n=" + std::to_string(n) + " place " + std::to_string(place));
                              }
                            const std::size_t shared = transport::shm::shared_broadcast_bytes / sizeof(float);
                            for (std::size_t n : {low - 1, low, shared - 1, shared, high - 1, high})
                              for (int root : {0, p - 1}) {
                                std::vector<float> data(n, -1.0f);
                                if (r == root)
                                  for (std::size_t i = 0; i < n; ++i) data[i] = value(root, i);
                                rank.comm.broadcast(data.data(), n, DataType::f32, root, options);
                                expect_equal(
                                    data, [&](std::size_t i) { return value(root, i); },
                                    "broadcast n=" + std::to_string(n) + " root " + std::to_string(root));
                              }
                          }),
                "")
          << "TUTTI_SHM_SINGLE_COPY=" << setting << " TUTTI_SHM_COLLECTIVE_COPY=" << copy << " p=" << p;
  }
  unsetenv("TUTTI_SHM_SINGLE_COPY");
  unsetenv("TUTTI_SHM_COLLECTIVE_COPY");
}

// Gather, scatter, reduce, alltoallv and allgatherv (uneven blocks, some empty) inline, through the data sets (one
// and several chunks) and single copy: exact results on both sides of single_copy_bytes and past
// a chunk, in and out of place, the first and the last rank as root, with single copy on (where
// the system allows it) and off.
TEST_F(ShmDirect, EveryRootedAndUnevenCollectiveOnEveryPath) {
  const std::size_t low = transport::shm::single_copy_bytes / sizeof(float);
  // Element i of rank q's input: distinct everywhere (exact in f32 for these sizes), so that a
  // block taken from the wrong place or rank shows.
  const auto value = [](int q, std::size_t i) { return static_cast<float>(static_cast<std::size_t>(q) * 2000000 + i); };
  for (const auto& [setting, copy] : copy_settings) {
    setenv("TUTTI_SHM_SINGLE_COPY", setting, 1);
    setenv("TUTTI_SHM_COLLECTIVE_COPY", copy, 1);
    for (int p : {2, 3, 5})
      EXPECT_EQ(
          run_ranks(
              p,
              [&](Rank& rank) {
                const int r = rank.comm.rank();
                const auto up = static_cast<std::size_t>(p), ur = static_cast<std::size_t>(r);
                const Options options{Algorithm::direct, 20000ms};
                for (std::size_t n : {std::size_t{3}, low - 1, low, 3 * low + 1, std::size_t{200003}})
                  for (bool in_place : {false, true})
                    for (int root : {0, p - 1}) {
                      const std::string what =
                          " n=" + std::to_string(n) + " root " + std::to_string(root) + (in_place ? " in place" : "");
                      std::vector<float> in(n), out(n * up, -1.0f);
                      for (std::size_t i = 0; i < n; ++i) in[i] = value(r, i);
                      const bool here = in_place && r == root;
                      if (here) std::copy(in.begin(), in.end(), out.begin() + static_cast<long>(ur * n));
                      rank.comm.gather(here ? out.data() + ur * n : in.data(), r == root ? out.data() : nullptr, n,
                                       DataType::f32, root, options);
                      if (r == root)
                        for (int q = 0; q < p; ++q)
                          expect_equal(
                              std::vector<float>(out.begin() + static_cast<long>(q * n),
                                                 out.begin() + static_cast<long>((q + 1) * n)),
                              [&](std::size_t i) { return value(q, i); }, "gather block " + std::to_string(q) + what);
                      std::vector<float> all(n * up), mine(n, -1.0f);
                      if (r == root)
                        for (std::size_t i = 0; i < n * up; ++i) all[i] = value(root, i);
                      rank.comm.scatter(r == root ? all.data() : nullptr, here ? all.data() + ur * n : mine.data(), n,
                                        DataType::f32, root, options);
                      expect_equal(
                          here ? std::vector<float>(all.begin() + static_cast<long>(ur * n),
                                                    all.begin() + static_cast<long>((ur + 1) * n))
                               : mine,
                          [&](std::size_t i) { return value(root, ur * n + i); }, "scatter" + what);
                    }
                // Reduce (f64: sums of these values stay exact), the root's result only.
                for (std::size_t n : {std::size_t{3}, low - 1, low, 3 * low + 1, std::size_t{200003}})
                  for (bool in_place : {false, true})
                    for (int root : {0, p - 1}) {
                      std::vector<double> in(n), out(n, -1.0);
                      for (std::size_t i = 0; i < n; ++i) in[i] = value(r, i);
                      const bool here = in_place && r == root;
                      rank.comm.reduce(in.data(),
                                       here        ? in.data()
                                       : r == root ? out.data()
                                                   : nullptr,
                                       n, DataType::f64, ReduceOp::sum, root, options);
                      if (r != root) continue;
                      const std::vector<double>& got = here ? in : out;
                      std::size_t wrong = 0;
                      for (std::size_t i = 0; i < n; ++i) {
                        double want = 0;
                        for (int q = 0; q < p; ++q) want += value(q, i);
                        wrong += got[i] != want;
                      }
                      if (wrong > 0)
                        throw std::runtime_error("reduce n=" + std::to_string(n) + " root " + std::to_string(root) +
                                                 (in_place ? " in place" : "") + ": " + std::to_string(wrong) +
                                                 " wrong");
                    }
                // Alltoallv (uneven blocks, some empty: rank r sends v(r, q) to rank q): direct
                // where the segment allows single copy, refused as unsupported elsewhere.
                const bool single_copy = rank.comm.serves_direct(Collective::alltoallv);
                if (single_copy !=
                    (std::string(setting) == "1" &&
                     static_cast<transport::shm::ShmTransport*>(rank.transport)->segment().single_copy()))
                  throw std::runtime_error("alltoallv direct where single copy is not, or not where it is");
                for (std::size_t n : {std::size_t{0}, std::size_t{3}, low - 1, low, std::size_t{70001}})
                  for (bool in_place : {false, true}) {
                    // In place, symmetric counts: each rank receives as much as it sends.
                    const auto v = [&](std::size_t from, std::size_t to) {
                      const std::size_t k = in_place ? from + to : from + 2 * to;
                      return k % 3 == 1 ? std::size_t{0} : n + from + to;
                    };
                    std::vector<std::size_t> sends(up), recvs(up), at(up + 1, 0);
                    for (std::size_t q = 0; q < up; ++q) sends[q] = v(ur, q), recvs[q] = v(q, ur);
                    for (std::size_t q = 0; q < up; ++q) at[q + 1] = at[q] + sends[q];
                    std::vector<float> in(at[up]),
                        out(std::max(at[up], std::accumulate(recvs.begin(), recvs.end(), std::size_t{0})), -1.0f);
                    for (std::size_t i = 0; i < in.size(); ++i) in[i] = value(r, i);
                    if (in_place) std::copy(in.begin(), in.end(), out.begin());
                    try {
                      rank.comm.alltoallv(in_place ? out.data() : in.data(), sends, out.data(), recvs, DataType::f32,
                                          options);
                    } catch (const Error& e) {
                      if (single_copy || e.code() != ErrorCode::unsupported) throw;
                      continue;
                    }
                    if (!single_copy) throw std::runtime_error("alltoallv ran direct without single copy");
                    expect_alltoallv_result(
                        out.data(), p, r, v,
                        [&](std::size_t q, std::size_t i) { return value(static_cast<int>(q), i); },
                        "alltoallv n=" + std::to_string(n) + (in_place ? " in place" : ""));
                  }
                for (std::size_t n : {std::size_t{3}, low - 1, low, 3 * low + 1, std::size_t{200003}})
                  for (bool in_place : {false, true}) {
                    std::vector<std::size_t> counts(up), starts(up + 1, 0);
                    for (std::size_t q = 0; q < up; ++q) counts[q] = q % 3 == 1 ? 0 : n + q;
                    for (std::size_t q = 0; q < up; ++q) starts[q + 1] = starts[q] + counts[q];
                    std::vector<float> in(counts[ur]), out(starts[up], -1.0f);
                    for (std::size_t i = 0; i < in.size(); ++i) in[i] = value(r, i);
                    if (in_place) std::copy(in.begin(), in.end(), out.begin() + static_cast<long>(starts[ur]));
                    rank.comm.allgatherv(in_place ? out.data() + starts[ur] : in.data(), counts[ur], out.data(), counts,
                                         DataType::f32, options);
                    for (int q = 0; q < p; ++q) {
                      const auto uq = static_cast<std::size_t>(q);
                      expect_equal(
                          std::vector<float>(out.begin() + static_cast<long>(starts[uq]),
                                             out.begin() + static_cast<long>(starts[uq + 1])),
                          [&](std::size_t i) { return value(q, i); },
                          "allgatherv n=" + std::to_string(n) + " block " + std::to_string(q) +
                              (in_place ? " in place" : ""));
                    }
                  }
              }),
          "")
          << "TUTTI_SHM_SINGLE_COPY=" << setting << " TUTTI_SHM_COLLECTIVE_COPY=" << copy << " p=" << p;
  }
  unsetenv("TUTTI_SHM_SINGLE_COPY");
  unsetenv("TUTTI_SHM_COLLECTIVE_COPY");
}

// The promise behind a broadcast root's early return: it can run run_ahead calls past the slowest
// rank's reading without waiting for it, even when that rank waits for the root in between (here
// for a message the root sends only after its last broadcast). Past run_ahead it would wait.
TEST_F(ShmDirect, ARootCanRunAheadByItsPromiseWhileAReceiverWaitsForIt) {
  // `warm` calls in step first, so that the slots have all been used and are reused.
  constexpr int warm = 3 * static_cast<int>(transport::shm::signature_slots), before = 5;
  constexpr int ahead = static_cast<int>(transport::shm::run_ahead);
  EXPECT_EQ(run_ranks(2,
                      [&](Rank& rank) {
                        const Options options{Algorithm::direct, 10000ms};
                        std::int32_t token = 0;
                        std::vector<std::uint64_t> got(before + ahead);
                        for (int i = 0; i < warm; ++i) {
                          std::uint64_t x = static_cast<std::uint64_t>(i);
                          rank.comm.allreduce(&x, &x, 1, DataType::u64, ReduceOp::max, options);
                        }
                        if (rank.comm.rank() == 0) {
                          for (int i = 0; i < before + ahead; ++i) {
                            got[i] = static_cast<std::uint64_t>(i) * 7;
                            rank.comm.broadcast(&got[i], 1, DataType::u64, 0, options);
                          }
                          token = 99;
                          rank.comm.send(&token, 1, DataType::i32, 1);
                          return;
                        }
                        for (int i = 0; i < before + ahead; ++i) {
                          // Consumed all below `before` when the root publishes before + ahead - 1.
                          if (i == before) {
                            rank.comm.recv(&token, 1, DataType::i32, 0);
                            if (token != 99) throw std::runtime_error("token " + std::to_string(token));
                          }
                          rank.comm.broadcast(&got[i], 1, DataType::u64, 0, options);
                          if (got[i] != static_cast<std::uint64_t>(i) * 7)
                            throw std::runtime_error("call " + std::to_string(i) + ": " + std::to_string(got[i]));
                        }
                      }),
            "");
}

// Whether this system lets one process read another's memory: a child reads a word of ours.
bool can_read_other_processes() {
  static const std::uint64_t word = 0x1234567887654321;
  const pid_t parent = getpid();
  const pid_t child = fork();
  if (child == 0) {
    std::uint64_t got = 0;
    iovec mine{&got, sizeof got}, theirs{const_cast<std::uint64_t*>(&word), sizeof word};
    _exit(process_vm_readv(parent, &mine, 1, &theirs, 1, 0) == sizeof got && got == word ? 0 : 1);
  }
  int status = 0;
  waitpid(child, &status, 0);
  return WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

// Processes agree on single copy when they attach: used where every rank can read every other,
// and by no rank when one of them cannot (here: one refuses through TUTTI_SHM_SINGLE_COPY=0); the
// allgather is exact either way.
TEST_F(ShmDirect, SingleCopyIsAgreedByEveryRankWhenTheyAttach) {
  const bool system_allows = can_read_other_processes();
  if (!system_allows) std::printf("[ NOTE ] this system forbids process_vm_readv: single copy stays off\n");
  for (int refusing : {-1, 1}) {
    const std::string name = unique_shm_name();
    const std::vector<int> codes = on_processes(
        3,
        [&](int r) {
          int code = 0;
          if (r == refusing) setenv("TUTTI_SHM_SINGLE_COPY", "0", 1);
          auto t = transport::shm::open(name, r, 3, 17, 20000ms);
          const bool single = static_cast<transport::shm::ShmTransport&>(*t).segment().single_copy();
          code |= single != (system_allows && refusing < 0) ? 4 : 0;
          Communicator comm = comm::Access::make(std::make_shared<comm::CommImpl>(std::move(t)));
          const std::size_t n = 3 * transport::shm::single_copy_bytes / sizeof(float);
          std::vector<float> in(n), out(3 * n, -1.0f);
          for (std::size_t i = 0; i < n; ++i) in[i] = value(r, i);
          comm.allgather(in.data(), out.data(), n, DataType::f32, {Algorithm::direct, 20000ms});
          for (int q = 0; q < 3; ++q)
            for (std::size_t i = 0; i < n; ++i) code |= out[q * n + i] != value(q, i) ? 8 : 0;
          return code;
        },
        30s);
    for (int r = 0; r < 3; ++r)
      EXPECT_EQ(codes[static_cast<std::size_t>(r)], 0)
          << "rank " << r << ", refusing rank " << refusing
          << " (-1: hung or crashed, 2: an error, 4: wrong single-copy answer, 8: wrong result)";
  }
}

// How the collectives copy is rank 1's verdict on every rank: measured by the probe, or as
// TUTTI_SHM_COLLECTIVE_COPY on rank 1 alone says; never single copy where single copy is off. A
// measured single copy where ranks outnumber cores (3 ranks on 2 cores) serves fewer collectives
// (crowded), a forced one every collective. A setting that is none of auto, single and sets is
// refused.
TEST_F(ShmDirect, CollectiveCopyIsRankOnesVerdictOnEveryRank) {
  const bool system_allows = can_read_other_processes();
  const long cores = sysconf(_SC_NPROCESSORS_ONLN);
  struct Case {
    int p;
    const char* rank_one;  // its TUTTI_SHM_COLLECTIVE_COPY (null: unset, auto)
    int single;            // the verdict expected: 1 single copy, 0 the data sets, -1 either (measured)
  };
  const std::vector<Case> cases = {
      {2, nullptr, -1}, {2, "sets", 0}, {3, "single", 1}, {3, "sets", 0}, {3, nullptr, -1}};
  for (const Case& c : cases) {
    const std::string name = unique_shm_name();
    const std::vector<int> codes = on_processes(
        c.p,
        [&](int r) {
          if (r == 1 && c.rank_one != nullptr)
            setenv("TUTTI_SHM_COLLECTIVE_COPY", c.rank_one, 1);
          else
            unsetenv("TUTTI_SHM_COLLECTIVE_COPY");
          auto t = transport::shm::open(name, r, c.p, 19, 20000ms);
          const auto& segment = static_cast<transport::shm::ShmTransport&>(*t).segment();
          return (segment.single_copy_collectives() ? 16 : 32) + (segment.crowded() ? 1 : 0);
        },
        30s);
    const std::string what = "p=" + std::to_string(c.p) + " rank 1: " + (c.rank_one ? c.rank_one : "auto");
    for (int r = 0; r < c.p; ++r) {
      EXPECT_EQ(codes[static_cast<std::size_t>(r)], codes[0]) << what << ", rank " << r << " differs from rank 0";
      EXPECT_TRUE(codes[static_cast<std::size_t>(r)] == 16 || codes[static_cast<std::size_t>(r)] == 32 ||
                  (codes[static_cast<std::size_t>(r)] == 17 && c.single < 0 && c.p > cores))
          << what << ", rank " << r << ": " << codes[static_cast<std::size_t>(r)]
          << " (-1: hung or crashed, 2: an error, +1: crowded)";
    }
    if (c.single >= 0) {
      EXPECT_EQ(codes[0], c.single == 1 && system_allows ? 16 : 32) << what;
    } else if (codes[0] == 16 || codes[0] == 17) {
      EXPECT_EQ(codes[0], c.p > cores ? 17 : 16)
          << what << ": single copy measured, crowded where ranks outnumber cores";
    }
    if (c.single < 0)
      std::printf("[ NOTE ] %s: the probe chose %s\n", what.c_str(),
                  codes[0] >= 16 && codes[0] < 32 ? "single copy" : "the data sets");
  }
  setenv("TUTTI_SHM_SINGLE_COPY", "0", 1);  // single copy off: forcing it is moot
  setenv("TUTTI_SHM_COLLECTIVE_COPY", "single", 1);
  EXPECT_FALSE(static_cast<transport::shm::ShmTransport&>(*transport::shm::open(unique_shm_name(), 0, 1, 19, 20000ms))
                   .segment()
                   .single_copy_collectives());
  unsetenv("TUTTI_SHM_SINGLE_COPY");
  setenv("TUTTI_SHM_COLLECTIVE_COPY", "always", 1);
  try {
    (void)transport::shm::open(unique_shm_name(), 0, 1, 19, 20000ms);
    ADD_FAILURE() << "TUTTI_SHM_COLLECTIVE_COPY=always was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::invalid_argument) << e.what();
    EXPECT_NE(std::string(e.what()).find("TUTTI_SHM_COLLECTIVE_COPY"), std::string::npos) << e.what();
  }
  unsetenv("TUTTI_SHM_COLLECTIVE_COPY");
}

// ---- zero copy: allreduce on SharedBuffer memory (direct.hpp, zero_copy_bytes) ----

TEST_F(ShmDirect, SharedBuffersAreZeroedPageAlignedAndFoundByAddress) {
  const Communicator none;  // allocate needs no communication
  try {
    (void)none.allocate(0);
    ADD_FAILURE() << "allocate(0) succeeded";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::invalid_argument) << e.what();
  }
  SharedBuffer buffer = none.allocate(5000);
  ASSERT_TRUE(buffer);
  EXPECT_EQ(buffer.size(), 5000u);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(buffer.data()) % 4096, 0u);
  EXPECT_EQ(buffer.as<float>().size(), 1250u);
  EXPECT_TRUE(std::all_of(buffer.data(), buffer.data() + buffer.size(), [](std::byte b) { return b == std::byte{0}; }));
  const auto where = core::locate_shared(buffer.data() + 100, 4900);
  ASSERT_TRUE(where);
  EXPECT_NE(where->id, 0u);
  EXPECT_EQ(where->offset, 100u);
  EXPECT_EQ(where->region_bytes, 8192u);  // whole pages
  EXPECT_TRUE(core::locate_shared(buffer.data() + 100, 8092));
  EXPECT_FALSE(core::locate_shared(buffer.data() + 100, 8093));  // past the mapping
  EXPECT_FALSE(core::locate_shared(buffer.data(), 0));
  std::vector<float> plain(16);
  EXPECT_FALSE(core::locate_shared(plain.data(), sizeof(float) * plain.size()));
  SharedBuffer copy = buffer;  // copies share the memory
  buffer.as<float>()[7] = 2.5f;
  EXPECT_EQ(copy.as<float>()[7], 2.5f);
  const std::byte* address = copy.data();
  buffer = SharedBuffer();
  EXPECT_TRUE(core::locate_shared(address, 16));
  copy = SharedBuffer();  // the last copy frees it
  EXPECT_FALSE(core::locate_shared(address, 16));
}

// Rank r's share of an allreduce of n floats: `form` 0 out of place in two buffers, 1 in place,
// 2 send and recv in one shared buffer at offsets that are not page-aligned; `shared` false gives
// plain memory. Runs it, direct, and checks every element.
void zero_copy_allreduce(Communicator& comm, std::size_t n, int form, bool shared, ReduceOp op = ReduceOp::sum) {
  const int p = comm.size(), r = comm.rank();
  const std::size_t bytes = n * sizeof(float);
  SharedBuffer one, two;
  std::vector<float> plain_send, plain_recv;
  float *send = nullptr, *recv = nullptr;
  if (!shared) {
    plain_send.resize(n), plain_recv.resize(n);
    send = plain_send.data(), recv = form == 1 ? send : plain_recv.data();
  } else if (form == 2) {
    one = comm.allocate(2 * bytes + 64);
    send = one.as<float>().data() + 3, recv = send + n + 5;
  } else {
    one = comm.allocate(bytes);
    send = one.as<float>().data();
    if (form == 1) {
      recv = send;
    } else {
      two = comm.allocate(bytes);
      recv = two.as<float>().data();
    }
  }
  for (std::size_t i = 0; i < n; ++i) send[i] = value(r, i);
  if (recv != send) std::fill(recv, recv + n, std::nanf(""));
  comm.allreduce(send, recv, n, DataType::f32, op, {Algorithm::direct, 20000ms});
  const auto want = [&](std::size_t i) {
    const float k = static_cast<float>(i % 7 + 1);
    return op == ReduceOp::max   ? static_cast<float>(p) * k
           : op == ReduceOp::avg ? static_cast<float>(p + 1) / 2 * k
                                 : sum_value(p, i);
  };
  expect_equal(std::vector<float>(recv, recv + n), want,
               "allreduce n=" + std::to_string(n) + " form " + std::to_string(form) + (shared ? " shared" : " plain") +
                   " op " + std::string(to_string(op)));
}

// Exact on both sides of zero_copy_bytes, in and out of place, p = 2 to 8, with single copy on
// (zero copy where the system allows it) and off; zero copy maps the peers' buffers, and nothing
// is mapped when a rank's buffers are plain memory (every rank then takes the two-copy path).
TEST_F(ShmDirect, ZeroCopyAllreduceOnSharedBuffersAroundItsLimit) {
  const bool system_allows = can_read_other_processes();
  if (!system_allows) std::printf("[ NOTE ] this system forbids process_vm_readv: zero copy stays off\n");
  const std::size_t low = transport::shm::zero_copy_bytes / sizeof(float);
  for (const char* setting : {"1", "0"}) {
    setenv("TUTTI_SHM_SINGLE_COPY", setting, 1);
    const bool zero_copy = system_allows && std::string(setting) == "1";
    for (int p : {2, 3, 5, 8}) {
      core::forget_peer_regions();
      EXPECT_EQ(run_ranks(p,
                          [&](Rank& rank) {
                            for (std::size_t n : {low - 1, low, 3 * low + 7})
                              for (int form : {0, 1, 2}) zero_copy_allreduce(rank.comm, n, form, true);
                          }),
                "")
          << "TUTTI_SHM_SINGLE_COPY=" << setting << " p=" << p;
      EXPECT_EQ(core::peer_regions_mapped() > 0, zero_copy) << "TUTTI_SHM_SINGLE_COPY=" << setting << " p=" << p;
      core::forget_peer_regions();
      EXPECT_EQ(run_ranks(p,
                          [&](Rank& rank) {
                            const bool shared = rank.comm.rank() != p - 1;  // one rank's memory is plain
                            for (int form : {0, 1}) zero_copy_allreduce(rank.comm, 3 * low + 7, form, shared);
                          }),
                "")
          << "one plain rank, TUTTI_SHM_SINGLE_COPY=" << setting << " p=" << p;
      EXPECT_EQ(core::peer_regions_mapped(), 0u) << "one plain rank, p=" << p;
    }
  }
  unsetenv("TUTTI_SHM_SINGLE_COPY");
  // Other ops, and a size whose results are written with streaming stores (streaming_bytes).
  const std::size_t streamed = transport::shm::streaming_bytes / 2 / sizeof(float) + 5;
  EXPECT_EQ(run_ranks(2,
                      [&](Rank& rank) {
                        for (ReduceOp op : {ReduceOp::avg, ReduceOp::max})
                          for (int form : {0, 1}) zero_copy_allreduce(rank.comm, 3 * low + 7, form, true, op);
                        for (int form : {0, 1, 2}) zero_copy_allreduce(rank.comm, streamed, form, true);
                      }),
            "");
  core::forget_peer_regions();
}

// Reduce_scatter, allgather and broadcast on shared buffers (every form, every root): exact on
// both sides of zero_copy_bytes, and the peers' buffers were mapped (zero copy ran).
TEST_F(ShmDirect, ZeroCopyReduceScatterAllgatherAndBroadcast) {
  const bool system_allows = can_read_other_processes();
  const std::size_t low = transport::shm::zero_copy_bytes / sizeof(float);
  for (int p : {2, 3, 5}) {
    core::forget_peer_regions();
    const auto up = static_cast<std::size_t>(p);
    EXPECT_EQ(run_ranks(p,
                        [&](Rank& rank) {
                          Communicator& comm = rank.comm;
                          const int r = comm.rank();
                          const Options options{Algorithm::direct, 20000ms};
                          for (std::size_t n : {low / up - 1, low / up + 1, 3 * low + 7}) {
                            for (int place : {0, 1, 2}) {  // out of place; in place NCCL's way; MPI's
                              SharedBuffer in_memory = comm.allocate(up * n * sizeof(float)),
                                           out_memory = comm.allocate(n * sizeof(float));
                              float* in = in_memory.as<float>().data();
                              for (std::size_t i = 0; i < up * n; ++i) in[i] = value(r, i);
                              float* recv = place == 0 ? out_memory.as<float>().data() : place == 1 ? in + r * n : in;
                              if (place == 0) std::fill(recv, recv + n, std::nanf(""));
                              comm.reduce_scatter(in, recv, n, DataType::f32, ReduceOp::sum, options);
                              expect_equal(
                                  std::vector<float>(recv, recv + n),
                                  [&](std::size_t i) { return sum_value(p, r * n + i); },
                                  "reduce_scatter n=" + std::to_string(n) + " place " + std::to_string(place));
                            }
                            for (bool in_place : {false, true}) {
                              SharedBuffer in_memory = comm.allocate(n * sizeof(float)),
                                           out_memory = comm.allocate(up * n * sizeof(float));
                              float* out = out_memory.as<float>().data();
                              std::fill(out, out + up * n, -1.0f);
                              float* in = in_place ? out + r * n : in_memory.as<float>().data();
                              for (std::size_t i = 0; i < n; ++i) in[i] = value(r, i);
                              comm.allgather(in, out, n, DataType::f32, options);
                              for (int q = 0; q < p; ++q)
                                expect_equal(
                                    std::vector<float>(out + q * n, out + (q + 1) * n),
                                    [&](std::size_t i) { return value(q, i); },
                                    "allgather n=" + std::to_string(n) + " block " + std::to_string(q));
                            }
                            for (int root : {0, p - 1}) {
                              SharedBuffer memory = comm.allocate(n * sizeof(float));
                              float* data = memory.as<float>().data();
                              for (std::size_t i = 0; i < n; ++i) data[i] = r == root ? value(root, i) : -1.0f;
                              comm.broadcast(data, n, DataType::f32, root, options);
                              expect_equal(
                                  std::vector<float>(data, data + n), [&](std::size_t i) { return value(root, i); },
                                  "broadcast n=" + std::to_string(n) + " root " + std::to_string(root));
                            }
                          }
                        }),
              "")
        << "p=" << p;
    EXPECT_EQ(core::peer_regions_mapped() > 0, system_allows) << "p=" << p;
  }
  core::forget_peer_regions();
}

// Ranks as processes: buffers freed and allocated again between calls (a peer must not reuse a
// mapping of a freed buffer), and two nonblocking allreduces in a chain (the second's input is
// the first's result, which the peers read only after every rank has finished the first).
TEST_F(ShmDirect, ZeroCopyAcrossProcessesWithBuffersReplacedAndCallsChained) {
  const bool system_allows = can_read_other_processes();
  const std::string name = unique_shm_name();
  constexpr int p = 3;
  const std::vector<int> codes = on_processes(
      p,
      [&](int r) {
        int code = 0;
        Communicator comm =
            comm::Access::make(std::make_shared<comm::CommImpl>(transport::shm::open(name, r, p, 19, 20000ms)));
        const std::size_t n = 2 * transport::shm::zero_copy_bytes / sizeof(float) + 3;
        for (int round = 0; round < 3; ++round)
          for (int form : {0, 1, 2}) zero_copy_allreduce(comm, n, form, true);
        SharedBuffer a = comm.allocate(n * sizeof(float)), b = comm.allocate(n * sizeof(float)),
                     c = comm.allocate(n * sizeof(float));
        float *x = a.as<float>().data(), *y = b.as<float>().data(), *z = c.as<float>().data();
        for (std::size_t i = 0; i < n; ++i) x[i] = value(r, i), y[i] = -1.0f, z[i] = -1.0f;
        const Options options{Algorithm::direct, 20000ms};
        Request first = comm.iallreduce(x, y, n, DataType::f32, ReduceOp::sum, options);
        Request second = comm.iallreduce(y, z, n, DataType::f32, ReduceOp::sum, options);
        second.wait();
        first.wait();
        for (std::size_t i = 0; i < n; ++i) {
          code |= y[i] != sum_value(p, i) ? 8 : 0;
          code |= z[i] != p * sum_value(p, i) ? 16 : 0;
        }
        code |= (core::peer_regions_mapped() > 0) != system_allows ? 4 : 0;
        return code;
      },
      60s);
  for (int r = 0; r < p; ++r)
    EXPECT_EQ(codes[static_cast<std::size_t>(r)], 0)
        << "rank " << r << " (-1: hung or crashed, 2: an error, 4: zero copy not taken, 8, 16: wrong results)";
}

}  // namespace
}  // namespace tutti::testing
