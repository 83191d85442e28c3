// The TCP transport: ranks are threads of this process, each with its own tcp::connect over
// 127.0.0.1 and an in-memory store; communicators run real collectives over the sockets.
// Inputs are integer-valued so results are exact; outputs are poisoned first. Every wait is
// bounded (connect and operation timeouts), and every transport is destroyed by the test.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "bootstrap/auth.hpp"
#include "bootstrap/store.hpp"
#include "comm/access.hpp"
#include "comm/comm_impl.hpp"
#include "exec/operation.hpp"
#include "memory_store.hpp"
#include "tcp_mesh.hpp"
#include "transport/tcp/tcp.hpp"
#include "transport/tcp/testing.hpp"
#include "tutti/tutti.hpp"

namespace tutti::testing {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

constexpr std::chrono::milliseconds op_timeout{60000};

// Point-to-point calls take the communicator's default deadline: keep it well below ctest's.
const bool timeout_set = [] { return ::setenv("TUTTI_TIMEOUT_MS", "60000", 0) == 0; }();

std::vector<Communicator> to_communicators(Transports& transports) {
  std::vector<Communicator> comms;
  for (auto& t : transports) comms.push_back(comm::Access::make(std::make_shared<comm::CommImpl>(std::move(t))));
  return comms;
}

std::vector<Communicator> make_group(int p) {
  MemoryStore store;
  std::vector<std::string> errors;
  Transports transports = connect_ranks(store, p, &errors);
  for (int r = 0; r < p; ++r) EXPECT_EQ(errors[static_cast<std::size_t>(r)], "") << "rank " << r;
  return to_communicators(transports);
}

// Runs fn(comm) on one thread per rank; returns "" or every rank's failure.
std::string run_ranks(std::vector<Communicator>& comms, const std::function<void(Communicator&)>& fn) {
  std::mutex mutex;
  std::string failures;
  std::vector<std::thread> threads;
  for (std::size_t r = 0; r < comms.size(); ++r) {
    threads.emplace_back([&, r] {
      try {
        fn(comms[r]);
      } catch (const std::exception& e) {
        std::lock_guard lock(mutex);
        failures += "rank " + std::to_string(r) + ": " + e.what() + "\n";
      }
    });
  }
  for (auto& t : threads) t.join();
  return failures;
}

// Integer value of element i on `rank` (small: every sum is exact in f32).
float value(int rank, std::size_t i) {
  return static_cast<float>(static_cast<int>((i * 7 + static_cast<std::size_t>(rank) * 3) % 13) - 6);
}
constexpr float poison = -12345.0f;

const int sizes[] = {1, 2, 3, 5, 6};

TEST(TcpCollectives, AllreduceEveryAlgorithmAndCount) {
  for (int p : sizes) {
    auto comms = make_group(p);
    const std::string failures = run_ranks(comms, [p](Communicator& comm) {
      for (Algorithm algorithm : {Algorithm::automatic, Algorithm::ring, Algorithm::recursive_doubling,
                                  Algorithm::rabenseifner, Algorithm::binomial_tree}) {
        for (std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{1000}, std::size_t{1'000'003}}) {
          std::vector<float> send(n), recv(n + 1, poison);
          for (std::size_t i = 0; i < n; ++i) send[i] = value(comm.rank(), i);
          comm.allreduce(send.data(), recv.data(), n, DataType::f32, ReduceOp::sum, {algorithm, op_timeout});
          for (std::size_t i = 0; i < n; ++i) {
            float want = 0;
            for (int r = 0; r < p; ++r) want += value(r, i);
            ASSERT_EQ(recv[i], want) << to_string(algorithm) << " p=" << p << " n=" << n << " i=" << i;
          }
          ASSERT_EQ(recv[n], poison) << "wrote past the end";
        }
      }
    });
    EXPECT_EQ(failures, "") << "p=" << p;
  }
}

// Receive-and-reduce combines elements as they arrive, across read boundaries: every element size.
TEST(TcpCollectives, ReduceOnArrivalEveryElementSize) {
  auto comms = make_group(3);
  const std::string failures = run_ranks(comms, [](Communicator& comm) {
    constexpr std::size_t n = 200'003;
    const auto r = static_cast<std::size_t>(comm.rank());
    std::vector<std::uint8_t> bytes(n);
    std::vector<f16> halves(n);  // small integers are exact in f16
    std::vector<std::int64_t> wide(n);
    std::vector<double> doubles(n);
    for (std::size_t i = 0; i < n; ++i) {
      bytes[i] = static_cast<std::uint8_t>((i + r * 5) % 200);
      halves[i] = f16(static_cast<float>((i + r) % 5));
      wide[i] = static_cast<std::int64_t>(i) * 1000003 - static_cast<std::int64_t>(r);
      doubles[i] = static_cast<double>((i * 3 + r) % 11);
    }
    const Options ring{Algorithm::ring, op_timeout};
    comm.allreduce(bytes.data(), bytes.data(), n, DataType::u8, ReduceOp::max, ring);
    comm.allreduce(halves.data(), halves.data(), n, DataType::f16, ReduceOp::sum, ring);
    comm.allreduce(wide.data(), wide.data(), n, DataType::i64, ReduceOp::sum, {Algorithm::rabenseifner, op_timeout});
    comm.allreduce(doubles.data(), doubles.data(), n, DataType::f64, ReduceOp::min, ring);
    for (std::size_t i = 0; i < n; ++i) {
      std::uint8_t max_byte = 0;
      float sum16 = 0;
      double least = 1e9;
      for (std::size_t q = 0; q < 3; ++q) {
        max_byte = std::max(max_byte, static_cast<std::uint8_t>((i + q * 5) % 200));
        sum16 += static_cast<float>((i + q) % 5);
        least = std::min(least, static_cast<double>((i * 3 + q) % 11));
      }
      ASSERT_EQ(bytes[i], max_byte) << i;
      ASSERT_EQ(static_cast<float>(halves[i]), sum16) << i;
      ASSERT_EQ(wide[i], static_cast<std::int64_t>(i) * 3000009 - 3) << i;
      ASSERT_EQ(doubles[i], least) << i;
    }
  });
  EXPECT_EQ(failures, "");
}

TEST(TcpCollectives, AllgatherBroadcastAlltoallSendRecv) {
  for (int p : sizes) {
    auto comms = make_group(p);
    const std::string failures = run_ranks(comms, [p](Communicator& comm) {
      const int me = comm.rank();
      const auto up = static_cast<std::size_t>(p);
      for (Algorithm algorithm : {Algorithm::ring, Algorithm::recursive_doubling, Algorithm::bruck}) {
        for (std::size_t n : {std::size_t{1}, std::size_t{1001}, std::size_t{100'003}}) {
          std::vector<float> mine(n), all(n * up + 1, poison);
          for (std::size_t i = 0; i < n; ++i) mine[i] = value(me, i);
          comm.allgather(mine.data(), all.data(), n, DataType::f32, {algorithm, op_timeout});
          for (int r = 0; r < p; ++r)
            for (std::size_t i = 0; i < n; ++i) ASSERT_EQ(all[static_cast<std::size_t>(r) * n + i], value(r, i));
          ASSERT_EQ(all[n * up], poison);
        }
      }
      for (Algorithm algorithm : {Algorithm::binomial_tree, Algorithm::ring}) {
        for (int root : {0, p - 1}) {
          std::vector<float> buffer(100'003, poison);
          if (me == root)
            for (std::size_t i = 0; i < buffer.size(); ++i) buffer[i] = value(root, i);
          comm.broadcast(buffer.data(), buffer.size(), DataType::f32, root, {algorithm, op_timeout});
          for (std::size_t i = 0; i < buffer.size(); ++i) ASSERT_EQ(buffer[i], value(root, i));
        }
      }
      for (Algorithm algorithm : {Algorithm::pairwise, Algorithm::bruck}) {
        for (std::size_t n : {std::size_t{3}, std::size_t{5000}}) {
          std::vector<float> send(n * up), recv(n * up + 1, poison);
          for (std::size_t i = 0; i < send.size(); ++i) send[i] = value(me, i);
          comm.alltoall(send.data(), recv.data(), n, DataType::f32, {algorithm, op_timeout});
          // Block r of recv is block `me` of rank r's send.
          for (int r = 0; r < p; ++r)
            for (std::size_t i = 0; i < n; ++i)
              ASSERT_EQ(recv[static_cast<std::size_t>(r) * n + i], value(r, static_cast<std::size_t>(me) * n + i));
          ASSERT_EQ(recv[n * up], poison);
        }
      }
      // A ring of tagged messages, sent before the receives are posted (unexpected on arrival).
      const int next = (me + 1) % p, prev = (me + p - 1) % p;
      for (std::size_t n : {std::size_t{0}, std::size_t{10}, std::size_t{300'000}}) {
        std::vector<float> out(n), in(n + 1, poison), out2(n + 1, 2.0f), in2(n + 1, poison);
        for (std::size_t i = 0; i < n; ++i) out[i] = value(me, i);
        Request sent = comm.isend(out.data(), n, DataType::f32, next, 5);
        Request sent2 = comm.isend(out2.data(), n + 1, DataType::f32, next, 6);
        std::this_thread::sleep_for(5ms);
        comm.recv(in2.data(), n + 1, DataType::f32, prev, 6);  // tags match regardless of order
        comm.recv(in.data(), n, DataType::f32, prev, 5);
        sent.wait();
        sent2.wait();
        for (std::size_t i = 0; i < n; ++i) ASSERT_EQ(in[i], value(prev, i));
        for (std::size_t i = 0; i <= n; ++i) ASSERT_EQ(in2[i], 2.0f);
        ASSERT_EQ(in[n], poison);
      }
    });
    EXPECT_EQ(failures, "") << "p=" << p;
  }
}

// A raw client of a rank's listening port, for the refusal tests.
int dial_raw(const std::string& address) {
  const std::size_t colon = address.rfind(':');
  sockaddr_in to{};
  to.sin_family = AF_INET;
  to.sin_port = htons(static_cast<std::uint16_t>(std::stoi(address.substr(colon + 1))));
  ::inet_pton(AF_INET, address.substr(0, colon).c_str(), &to.sin_addr);
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&to), sizeof(to)) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// True when the server closes `fd` within `limit` (EOF or reset), reading and discarding the rest.
bool closed_by_server(int fd, std::chrono::milliseconds limit) {
  const auto deadline = Clock::now() + limit;
  char sink[256];
  while (Clock::now() < deadline) {
    pollfd entry{fd, POLLIN, 0};
    if (::poll(&entry, 1, 50) <= 0) continue;
    const ssize_t got = ::recv(fd, sink, sizeof(sink), 0);
    if (got <= 0) return true;
  }
  return false;
}

// A communicator keeps the plans of its last few schedule-driven calls and runs a repeat from
// its plan: shapes that come back after more than it keeps, two calls of one shape in flight at
// once (one plan, two runs, each with its own signature exchange), in place and not, and shapes that differ only in
// type or root each give their own exact result.
TEST(TcpCollectives, RepeatedShapesReuseTheirPlans) {
  auto comms = make_group(3);
  const std::string failures = run_ranks(comms, [](Communicator& comm) {
    const int p = comm.size(), r = comm.rank();
    for (int round = 0; round < 3; ++round)
      for (int shape = 0; shape < 12; ++shape) {
        const auto n = static_cast<std::size_t>(1 + (shape / 2) * 37);  // 1 < p keeps the signature ring
        const bool wide = shape % 2 == 1;                               // i64, else i32: the same count, another plan
        const int root = shape % p;
        const std::int64_t base = round * 100 + shape;
        std::vector<std::int64_t> a64(n, base + r), b64(n, base + 2 * r), out64(n * p, -1);
        std::vector<std::int32_t> a32(n, static_cast<std::int32_t>(base + r)), out32(n, -1);
        if (wide) {
          // Two of one shape in flight at once, one in place.
          Request x =
              comm.iallreduce(a64.data(), a64.data(), n, DataType::i64, ReduceOp::sum, {Algorithm::ring, op_timeout});
          Request y =
              comm.iallreduce(b64.data(), out64.data(), n, DataType::i64, ReduceOp::sum, {Algorithm::ring, op_timeout});
          y.wait();
          ASSERT_TRUE(x.test());
          for (std::size_t i = 0; i < n; ++i) {
            ASSERT_EQ(a64[i], p * base + p * (p - 1) / 2) << "round " << round << " shape " << shape;
            ASSERT_EQ(out64[i], p * base + p * (p - 1)) << "round " << round << " shape " << shape;
          }
          comm.allgather(b64.data(), out64.data(), n, DataType::i64, {Algorithm::ring, op_timeout});
          for (std::size_t i = 0; i < n * p; ++i) ASSERT_EQ(out64[i], base + 2 * static_cast<std::int64_t>(i / n));
        } else {
          comm.allreduce(a32.data(), out32.data(), n, DataType::i32, ReduceOp::max, {Algorithm::ring, op_timeout});
          for (auto v : out32) ASSERT_EQ(v, base + p - 1) << "round " << round << " shape " << shape;
          for (const int from : {root, (root + 1) % p}) {  // one count, two roots: two plans
            std::vector<std::int32_t> b(n, r == from ? static_cast<std::int32_t>(base * 7 + from) : -1);
            comm.broadcast(b.data(), n, DataType::i32, from, {Algorithm::binomial_tree, op_timeout});
            for (auto v : b)
              ASSERT_EQ(v, base * 7 + from) << "round " << round << " shape " << shape << " root " << from;
          }
        }
      }
  });
  EXPECT_EQ(failures, "");
}

// A broadcast over Plan::run_ahead_bytes rings, so the next call opens a new run-ahead window
// (exec::RunAheadWindow), alike on every rank.
void open_run_ahead_window(Communicator& comm) {
  std::vector<std::int32_t> b(exec::Plan::run_ahead_bytes / sizeof(std::int32_t) + 1, 5);
  comm.broadcast(b.data(), b.size(), DataType::i32, 0, {Algorithm::binomial_tree, op_timeout});
  for (auto v : b) ASSERT_EQ(v, 5);
}

// Element counts of the calls of one whole run-ahead window, and of the call after them, which
// rings: max_calls - 1 small calls, or as many of 64 KiB as max_bytes holds.
std::vector<std::size_t> window_of_small_calls() {
  std::vector<std::size_t> counts;
  for (std::uint64_t k = 0; k < exec::RunAheadWindow::max_calls; ++k) counts.push_back(1 + (k * 97) % 200);
  return counts;
}
std::vector<std::size_t> window_of_large_calls(std::size_t blocks) {
  const std::size_t n = exec::Plan::run_ahead_bytes / sizeof(std::int32_t) / blocks;
  const std::size_t weight = n * blocks * sizeof(std::int32_t) + exec::Plan::run_ahead_bookkeeping;
  return std::vector<std::size_t>(exec::RunAheadWindow::max_bytes / weight + 1, n);
}

// What the ranks of run_one_window share.
struct WindowRun {
  explicit WindowRun(int early) : early_ranks(early) {}
  const int early_ranks;
  std::mutex mutex;
  std::condition_variable cv;
  int ahead_done = 0;  // early ranks that made every call but the last
  int last_done = 0;   // early ranks that made the last
  bool checking = false, checked = false;
};

// The ranks that return first (`early`) make every call of `counts` but the last before the others
// make their first; the last one rings, and an early rank whose ring predecessor is not early
// finishes it only once that rank entered it: not all early ranks finish within half a second
// while the others hold back (one of them watches, the rest wait for it). `call(comm, k, n)`
// makes call k of n elements and checks it.
template <class Call>
void run_one_window(Communicator& comm, bool early, const std::vector<std::size_t>& counts, const std::string& name,
                    const Call& call, WindowRun& run) {
  const int ahead = static_cast<int>(counts.size()) - 1;
  if (early) {
    for (int k = 0; k < ahead; ++k) call(comm, k, counts[static_cast<std::size_t>(k)]);
    {
      std::lock_guard lock(run.mutex);
      ++run.ahead_done;
      run.cv.notify_all();
    }
    call(comm, ahead, counts.back());
    std::lock_guard lock(run.mutex);
    ++run.last_done;
    run.cv.notify_all();
    return;
  }
  std::unique_lock lock(run.mutex);
  ASSERT_TRUE(run.cv.wait_for(lock, 60s, [&] { return run.ahead_done == run.early_ranks; }))
      << name << ": the early ranks waited within the window";
  if (!run.checking) {
    run.checking = true;
    EXPECT_FALSE(run.cv.wait_for(lock, 500ms, [&] { return run.last_done == run.early_ranks; }))
        << name << ": call " << ahead << " ran ahead past the window";
    run.checked = true;
    run.cv.notify_all();
  } else {
    ASSERT_TRUE(run.cv.wait_for(lock, 60s, [&] { return run.checked; })) << name;
  }
  lock.unlock();
  for (int k = 0; k <= ahead; ++k) call(comm, k, counts[static_cast<std::size_t>(k)]);
}

// A small broadcast's root returns once it has sent: it finishes the calls of a run-ahead window
// (255 small ones, or 15 of 64 KiB) before any receiver has made its first, and the call after
// them waits; every value still arrives exactly, and roots, counts (one over
// Plan::run_ahead_bytes, one of 0) and both tree shapes vary after it.
TEST(TcpCollectives, ABroadcastRootRunsAheadOfItsReceivers) {
  for (const Algorithm algorithm : {Algorithm::binomial_tree, Algorithm::ring}) {
    for (const auto& counts : {window_of_small_calls(), window_of_large_calls(1)}) {
      const std::string name = std::string(to_string(algorithm)) + ", " + std::to_string(counts.size()) + " calls";
      auto comms = make_group(3);
      WindowRun run(1);
      const auto call = [&](Communicator& comm, int k, std::size_t n) {
        std::vector<std::int32_t> b(n, comm.rank() == 0 ? 1000 + k : -1);
        comm.broadcast(b.data(), b.size(), DataType::i32, 0, {algorithm, op_timeout});
        for (auto v : b) ASSERT_EQ(v, 1000 + k) << name << " call " << k;
      };
      const std::string failures = run_ranks(comms, [&](Communicator& comm) {
        const int p = comm.size(), r = comm.rank();
        open_run_ahead_window(comm);
        run_one_window(comm, r == 0, counts, name, call, run);
        const std::size_t over = exec::Plan::run_ahead_bytes / sizeof(std::int32_t) + 1;
        for (int k = 0; k < 50; ++k) {
          const int root = (k * 5 + k / 7) % p;
          const std::size_t n = k % 10 == 3 ? over : k % 10 == 7 ? 0 : static_cast<std::size_t>(1 + (k * 131) % 4000);
          std::vector<std::int32_t> b(n, r == root ? 7 * k + root : -1);
          comm.broadcast(b.data(), n, DataType::i32, root, {algorithm, op_timeout});
          for (auto v : b) ASSERT_EQ(v, 7 * k + root) << name << " call " << k << " root " << root;
        }
      });
      EXPECT_EQ(failures, "") << name;
    }
  }
}

// The small frames of calls that run ahead leave together: 200 broadcasts of 8 bytes whose root
// runs ahead (their frames within the window, set to a second here) take far fewer writes than
// calls, and with the window at 0 (TUTTI_TCP_COALESCE_US) one each. Every value arrives exactly.
TEST(TcpCoalescing, SmallFramesOfCallsThatRunAheadLeaveTogether) {
  for (const char* window : {"1000000", "0"}) {
    ::setenv("TUTTI_TCP_COALESCE_US", window, 1);
    MemoryStore store;
    std::vector<std::string> errors;
    Transports transports = connect_ranks(store, 2, &errors);
    ::unsetenv("TUTTI_TCP_COALESCE_US");
    transport::Transport& root_transport = *transports[0];
    auto comms = to_communicators(transports);
    constexpr int calls = 200;
    std::uint64_t writes = 0;
    const std::string failures = run_ranks(comms, [&](Communicator& comm) {
      open_run_ahead_window(comm);
      const std::uint64_t before = comm.rank() == 0 ? transport::tcp::testing::socket_writes(root_transport) : 0;
      for (int k = 0; k < calls; ++k) {
        std::vector<std::int32_t> b(2, comm.rank() == 0 ? 3 * k : -1);
        comm.broadcast(b.data(), b.size(), DataType::i32, 0, {Algorithm::binomial_tree, op_timeout});
        for (auto v : b) ASSERT_EQ(v, 3 * k) << "window " << window << " call " << k;
      }
      if (comm.rank() == 0) writes = transport::tcp::testing::socket_writes(root_transport) - before;
      comm.barrier({{}, op_timeout});
    });
    EXPECT_EQ(failures, "") << "window " << window;
    if (std::string(window) == "0")
      EXPECT_GE(writes, std::uint64_t{calls}) << "every frame written alone";
    else
      EXPECT_LE(writes, std::uint64_t{calls / 8}) << "frames within the window written together";
  }
}

// A window over a second, or not a number, is refused by name as the ranks connect.
TEST(TcpCoalescing, AWindowOverASecondIsRefused) {
  for (const char* bad : {"1000001", "20us"}) {
    ::setenv("TUTTI_TCP_COALESCE_US", bad, 1);
    MemoryStore store;
    std::vector<std::string> errors;
    Transports transports = connect_ranks(store, 2, &errors);
    ::unsetenv("TUTTI_TCP_COALESCE_US");
    for (int r = 0; r < 2; ++r)
      EXPECT_NE(errors[static_cast<std::size_t>(r)].find("TUTTI_TCP_COALESCE_US"), std::string::npos)
          << "rank " << r << " with " << bad << ": " << errors[static_cast<std::size_t>(r)];
  }
}

// A frame held back to leave with the next leaves when the window ends, though its sender makes
// no call meanwhile: a root makes three small broadcasts that run ahead (window 50 ms), then
// sleeps for 3 s; the receiver has all three well before the root wakes.
TEST(TcpCoalescing, HeldBackFramesLeaveWhenTheWindowEnds) {
  ::setenv("TUTTI_TCP_COALESCE_US", "50000", 1);
  auto comms = make_group(2);
  ::unsetenv("TUTTI_TCP_COALESCE_US");
  const std::string failures = run_ranks(comms, [&](Communicator& comm) {
    open_run_ahead_window(comm);
    const auto start = Clock::now();
    for (int k = 0; k < 3; ++k) {
      std::vector<std::int32_t> b(2, comm.rank() == 0 ? 11 * k : -1);
      comm.broadcast(b.data(), b.size(), DataType::i32, 0, {Algorithm::binomial_tree, op_timeout});
      for (auto v : b) ASSERT_EQ(v, 11 * k) << "call " << k;
    }
    if (comm.rank() == 0)
      std::this_thread::sleep_for(3s);
    else
      EXPECT_LT(Clock::now() - start, 1500ms) << "the held-back frames waited for their sender";
    comm.barrier({{}, op_timeout});
  });
  EXPECT_EQ(failures, "");
}

// A rooted call that runs ahead, as the broadcast above: a scatter's root returns once it has
// sent, a reduce's or gather's leaves (p = 3: both non-roots) once they have sent. The ranks that
// return first finish the calls of a run-ahead window before the others make their first, and the
// call after them waits; every value still arrives exactly, and roots, counts (one over the bound
// on the largest message, one of 0) and both trees vary after it.
TEST(TcpCollectives, RootedCallsRunAheadOfTheRanksTheyWaitFor) {
  struct Case {
    Collective collective;
    Algorithm algorithm;
  };
  const Case cases[] = {{Collective::scatter, Algorithm::linear},       {Collective::scatter, Algorithm::binomial_tree},
                        {Collective::gather, Algorithm::linear},        {Collective::gather, Algorithm::binomial_tree},
                        {Collective::reduce, Algorithm::binomial_tree}, {Collective::reduce, Algorithm::ring}};
  for (const Case& c : cases) {
    for (const bool large : {false, true}) {
      const std::string name = std::string(to_string(c.collective)) + " " + std::string(to_string(c.algorithm)) +
                               (large ? ", calls of 64 KiB" : ", small calls");
      auto comms = make_group(3);
      WindowRun run(c.collective == Collective::scatter ? 1 : 2);  // the ranks that return first
      // One call, checked: rank r's input is value(r, k, i); a reduce sums them.
      const auto value = [](int r, int k, std::size_t i) {
        return static_cast<std::int32_t>(1000 * k + 10 * r + i % 7);
      };
      const auto call = [&](Communicator& comm, int k, std::size_t n, int root) {
        const int p = comm.size(), r = comm.rank();
        const Options options{c.algorithm, op_timeout};
        const auto up = static_cast<std::size_t>(p);
        std::vector<std::int32_t> in, out;
        switch (c.collective) {
          case Collective::scatter:
            for (std::size_t i = 0; r == root && i < n * up; ++i)
              in.push_back(value(static_cast<int>(i / n), k, i % n));
            in.resize(std::max<std::size_t>(in.size(), 1));
            out.assign(std::max<std::size_t>(n, 1), -1);
            comm.scatter(in.data(), out.data(), n, DataType::i32, root, options);
            for (std::size_t i = 0; i < n; ++i)
              ASSERT_EQ(out[i], value(r, k, i)) << name << " call " << k << " at " << i;
            return;
          case Collective::gather:
            for (std::size_t i = 0; i < n; ++i) in.push_back(value(r, k, i));
            in.resize(std::max<std::size_t>(n, 1));
            out.assign(std::max<std::size_t>(n * up, 1), -1);
            comm.gather(in.data(), out.data(), n, DataType::i32, root, options);
            for (std::size_t i = 0; r == root && i < n * up; ++i)
              ASSERT_EQ(out[i], value(static_cast<int>(i / n), k, i % n)) << name << " call " << k << " at " << i;
            return;
          default:
            for (std::size_t i = 0; i < n; ++i) in.push_back(value(r, k, i));
            in.resize(std::max<std::size_t>(n, 1));
            out.assign(std::max<std::size_t>(n, 1), -1);
            comm.reduce(in.data(), out.data(), n, DataType::i32, ReduceOp::sum, root, options);
            for (std::size_t i = 0; r == root && i < n; ++i)
              ASSERT_EQ(out[i], value(0, k, i) + value(1, k, i) + value(2, k, i))
                  << name << " call " << k << " at " << i;
            return;
        }
      };
      const std::string failures = run_ranks(comms, [&](Communicator& comm) {
        const int p = comm.size(), r = comm.rank();
        open_run_ahead_window(comm);
        const bool early = (c.collective == Collective::scatter) == (r == 0);
        const auto counts =
            large ? window_of_large_calls(c.collective == Collective::reduce ? 1 : static_cast<std::size_t>(p))
                  : window_of_small_calls();
        run_one_window(
            comm, early, counts, name, [&](Communicator& cm, int k, std::size_t n) { call(cm, k, n, 0); }, run);
        const std::size_t over = exec::Plan::run_ahead_bytes / sizeof(std::int32_t) /
                                     (c.collective == Collective::reduce ? 1 : static_cast<std::size_t>(p)) +
                                 1;
        for (int k = 0; k < 50; ++k) {
          const int root = (k * 5 + k / 7) % p;
          const std::size_t n = k % 10 == 3 ? over : k % 10 == 7 ? 0 : static_cast<std::size_t>(1 + (k * 131) % 1500);
          call(comm, 100 + k, n, root);
        }
      });
      EXPECT_EQ(failures, "") << name;
    }
  }
}

TEST(TcpConnect, RefusesStrangersAndTheMeshStillCompletes) {
  MemoryStore store;
  std::vector<std::string> errors;
  Transports transports;
  std::thread early([&] { transports = connect_ranks(store, 3, &errors, connect_timeout, {0}); });
  // Rank 0 only accepts; strangers reach it before the legitimate ranks do.
  const std::string address = store.get("tcp/7/0", 10s);
  const int junk = dial_raw(address);
  ASSERT_GE(junk, 0);
  const char garbage[] = "GET / HTTP/1.0\r\n\r\n and more bytes than a hello";
  ASSERT_GT(::send(junk, garbage, sizeof(garbage), MSG_NOSIGNAL), 0);
  EXPECT_TRUE(closed_by_server(junk, 10s));
  ::close(junk);
  const int impostor = dial_raw(address);
  ASSERT_GE(impostor, 0);
  std::string why;
  EXPECT_FALSE(bootstrap::handshake(impostor, "wrong-token", true, Clock::now() + 10s, &why));
  EXPECT_TRUE(closed_by_server(impostor, 10s));
  ::close(impostor);
  const int silent = dial_raw(address);  // connects and says nothing: must not hold up the mesh
  ASSERT_GE(silent, 0);

  std::vector<std::string> late_errors;
  Transports late = connect_ranks(store, 3, &late_errors, connect_timeout, {1, 2});
  early.join();
  ::close(silent);
  EXPECT_EQ(errors[0], "");
  EXPECT_EQ(late_errors[1], "");
  EXPECT_EQ(late_errors[2], "");
  if (!transports[0] || !late[1] || !late[2]) return;
  transports[1] = std::move(late[1]);
  transports[2] = std::move(late[2]);
  auto comms = to_communicators(transports);
  const std::string failures = run_ranks(comms, [](Communicator& comm) {
    std::vector<float> v(1000, 2.0f);
    comm.allreduce(v.data(), v.data(), v.size(), DataType::f32, ReduceOp::sum, {{}, op_timeout});
    for (float x : v) ASSERT_EQ(x, 6.0f);
  });
  EXPECT_EQ(failures, "");
}

TEST(TcpConnect, TimesOutNamingTheMissingRanks) {
  MemoryStore store;
  std::vector<std::string> errors;
  const auto start = Clock::now();
  Transports transports = connect_ranks(store, 4, &errors, 500ms, {0, 1});
  EXPECT_LT(Clock::now() - start, 10s);
  for (int r : {0, 1}) {
    EXPECT_EQ(transports[static_cast<std::size_t>(r)], nullptr);
    EXPECT_NE(errors[static_cast<std::size_t>(r)].find("timed out"), std::string::npos)
        << errors[static_cast<std::size_t>(r)];
    EXPECT_NE(errors[static_cast<std::size_t>(r)].find("rank(s) 2, 3"), std::string::npos)
        << errors[static_cast<std::size_t>(r)];
  }
}

// A ring allreduce, recursive doubling and Rabenseifner over a power of two, Bruck's allgather
// and barrier, the recursive-doubling barrier over a power of two, and a pairwise alltoall send no signature message
// over TCP: ranks that disagree always exchange a message, whose frame carries the sender's signature. A rank (or half
// the ranks) that calls with another count, with a count that keeps the signature ring (fewer elements than ranks, an
// empty call), or with another collective, is still caught, on every rank, at once and as a mismatch, with no rank left
// waiting for a signature message that was never sent.
TEST(TcpFailure, MismatchedRingCallsAreCaughtWithoutTheSignatureRing) {
  struct Odd {
    int p;
    Collective collective;
    Algorithm algorithm;
    std::size_t count, odd_count;
    Collective odd_collective = collective;
    int odd_from = 1;  // the odd ranks: odd_from to odd_to (rank 1 alone, or some half)
    int odd_to = 1;
  };
  const Odd cases[] = {Odd{3, Collective::allreduce, Algorithm::ring, 40, 41},
                       Odd{3, Collective::allreduce, Algorithm::ring, 40, 2},
                       Odd{4, Collective::allreduce, Algorithm::ring, 2, 40},
                       Odd{2, Collective::allreduce, Algorithm::recursive_doubling, 8, 9},
                       Odd{2, Collective::allreduce, Algorithm::recursive_doubling, 8, 0},
                       Odd{3, Collective::alltoall, Algorithm::pairwise, 4, 5},
                       Odd{4, Collective::alltoall, Algorithm::pairwise, 4, 0},
                       Odd{2, Collective::alltoall, Algorithm::pairwise, 4, 4, Collective::allgather},
                       Odd{4, Collective::allreduce, Algorithm::recursive_doubling, 8, 9},
                       Odd{4, Collective::allreduce, Algorithm::recursive_doubling, 8, 9, Collective::allreduce, 2, 3},
                       Odd{8, Collective::allreduce, Algorithm::recursive_doubling, 8, 9, Collective::allreduce, 4, 7},
                       Odd{4, Collective::allreduce, Algorithm::recursive_doubling, 8, 0, Collective::barrier},
                       Odd{4, Collective::allgather, Algorithm::recursive_doubling, 4, 5, Collective::allgather, 1, 2},
                       Odd{3, Collective::allgather, Algorithm::bruck, 4, 5},
                       Odd{4, Collective::allreduce, Algorithm::rabenseifner, 40, 44, Collective::allreduce, 2, 3},
                       Odd{4, Collective::reduce_scatter, Algorithm::rabenseifner, 4, 5},
                       Odd{3, Collective::barrier, Algorithm::bruck, 0, 4, Collective::allgather},
                       Odd{5, Collective::barrier, Algorithm::bruck, 0, 4, Collective::allreduce, 3, 4},
                       Odd{4, Collective::barrier, Algorithm::recursive_doubling, 0, 4, Collective::allgather},
                       Odd{8, Collective::barrier, Algorithm::recursive_doubling, 0, 4, Collective::allreduce, 4, 7}};
  for (const Odd c : cases) {
    auto comms = make_group(c.p);
    std::atomic<int> caught{0};
    const auto start = Clock::now();
    const auto p = static_cast<std::size_t>(c.p);
    const std::string failures = run_ranks(comms, [&](Communicator& comm) {
      const bool odd = comm.rank() >= c.odd_from && comm.rank() <= c.odd_to;
      const std::size_t n = odd ? c.odd_count : c.count;
      std::vector<float> in(p * n + 1, 1.0f), out(p * n + 1, 0.0f);
      const Options options{odd && c.odd_collective != c.collective ? Algorithm::ring : c.algorithm, op_timeout};
      try {
        switch (odd ? c.odd_collective : c.collective) {
          case Collective::allreduce:
            comm.allreduce(in.data(), in.data(), n, DataType::f32, ReduceOp::sum, options);
            break;
          case Collective::alltoall:
            comm.alltoall(in.data(), out.data(), n, DataType::f32, options);
            break;
          case Collective::barrier:
            comm.barrier({Algorithm::bruck, op_timeout});
            break;
          case Collective::reduce_scatter:
            comm.reduce_scatter(in.data(), out.data(), n, DataType::f32, ReduceOp::sum, options);
            break;
          default:
            comm.allgather(in.data(), out.data(), n, DataType::f32, options);
            break;
        }
        ADD_FAILURE() << "rank " << comm.rank() << ": the mismatched " << to_string(c.collective) << " succeeded";
      } catch (const Error& e) {
        EXPECT_EQ(e.code(), ErrorCode::mismatch) << to_string(c.collective) << " p=" << c.p << " counts " << c.count
                                                 << "/" << c.odd_count << " rank " << comm.rank() << ": " << e.what();
        caught.fetch_add(1);
      }
    });
    EXPECT_EQ(failures, "");
    EXPECT_EQ(caught.load(), c.p) << to_string(c.collective) << " p=" << c.p << " counts " << c.count << "/"
                                  << c.odd_count;
    EXPECT_LT(Clock::now() - start, 10s);  // at once, not at the 60 s deadline
  }
}

// Broadcasts that send no signature ring still disagree loudly: every rank raises `mismatch`,
// in the call or, a root that returned once it had sent, in its next one; within seconds, not
// at the 60 s deadline. Where every rank waits for a parent that is no root (each names another
// root), the waiting ranks name their call to their parents (Transport::notify_signature).
TEST(TcpFailure, MismatchedBroadcastsThatRunAheadRaiseOnEveryRank) {
  struct Case {
    const char* what;
    int p;
    std::function<int(int)> root;   // by rank
    std::function<int(int)> count;  // by rank
  };
  const Case cases[] = {
      {"no rank is a root", 3, [](int r) { return (r + 1) % 3; }, [](int) { return 8; }},
      {"two roots", 2, [](int r) { return r; }, [](int) { return 8; }},
      {"another count", 3, [](int) { return 0; }, [](int r) { return r == 2 ? 9 : 8; }},
      {"another root", 4, [](int r) { return r == 3 ? 1 : 0; }, [](int) { return 8; }},
  };
  for (const Case& c : cases)
    for (const Algorithm algorithm : {Algorithm::binomial_tree, Algorithm::ring}) {
      auto comms = make_group(c.p);
      std::atomic<int> caught{0};
      const auto start = Clock::now();
      const std::string failures = run_ranks(comms, [&](Communicator& comm) {
        const int r = comm.rank();
        std::vector<std::int32_t> b(static_cast<std::size_t>(c.count(r)), r);
        bool returned = false;
        try {
          // A rank still finishing the call before may raise the mismatch from it: a peer's abort
          // can overtake that call's last message from another peer (docs/failure-semantics.md).
          open_run_ahead_window(comm);
          comm.broadcast(b.data(), b.size(), DataType::i32, c.root(r), {algorithm, op_timeout});
          returned = true;
          comm.barrier({Algorithm::automatic, op_timeout});
          ADD_FAILURE() << c.what << ": rank " << r << " went on after the mismatched broadcast";
        } catch (const Error& e) {
          EXPECT_EQ(e.code(), ErrorCode::mismatch) << c.what << " " << to_string(algorithm) << " rank " << r
                                                   << (returned ? " (next call)" : "") << ": " << e.what();
          EXPECT_NE(std::string(e.what()).find("broadcast"), std::string::npos) << e.what();
          caught.fetch_add(1);
        }
      });
      EXPECT_EQ(failures, "") << c.what;
      EXPECT_EQ(caught.load(), c.p) << c.what << " " << to_string(algorithm);
      EXPECT_LT(Clock::now() - start, 10s) << c.what;
    }
}

// Scatters, gathers and reduces that send no signature ring disagree loudly too: every rank
// raises `mismatch`, in the call or, a rank that returned once it had sent (a scatter's root, a
// reduce's or gather's leaf), in its next one; within seconds. Where each rank's tree differs
// (another root), a rank waits for a child or parent that sends it nothing and names its call
// to it (Transport::notify_signature); where one rank runs another collective, its messages do.
TEST(TcpFailure, MismatchedRootedCallsThatRunAheadRaiseOnEveryRank) {
  struct Case {
    const char* what;
    int p;
    std::function<int(int)> root;   // by rank
    std::function<int(int)> count;  // by rank
    std::function<bool(int)> odd;   // by rank: calls `other` instead
  };
  const auto none = [](int) { return false; };
  const Case cases[] = {
      {"no rank is a root", 3, [](int r) { return (r + 1) % 3; }, [](int) { return 8; }, none},
      {"two roots", 2, [](int r) { return r; }, [](int) { return 8; }, none},
      {"another count", 3, [](int) { return 0; }, [](int r) { return r == 2 ? 9 : 8; }, none},
      {"another root", 4, [](int r) { return r == 3 ? 1 : 0; }, [](int) { return 8; }, none},
      {"another collective", 3, [](int) { return 0; }, [](int) { return 8; }, [](int r) { return r == 2; }},
  };
  struct Kind {
    Collective collective, other;
    Algorithm algorithm;
  };
  const Kind kinds[] = {{Collective::reduce, Collective::gather, Algorithm::binomial_tree},
                        {Collective::gather, Collective::reduce, Algorithm::linear},
                        {Collective::gather, Collective::scatter, Algorithm::binomial_tree},
                        {Collective::scatter, Collective::broadcast, Algorithm::linear},
                        {Collective::scatter, Collective::gather, Algorithm::binomial_tree},
                        {Collective::reduce, Collective::broadcast, Algorithm::ring}};
  for (const Case& c : cases)
    for (const Kind& kind : kinds) {
      const std::string name = std::string(c.what) + ", " + std::string(to_string(kind.collective)) + " " +
                               std::string(to_string(kind.algorithm));
      auto comms = make_group(c.p);
      std::atomic<int> caught{0};
      const auto start = Clock::now();
      const std::string failures = run_ranks(comms, [&](Communicator& comm) {
        const int r = comm.rank();
        const auto n = static_cast<std::size_t>(c.count(r));
        std::vector<std::int32_t> in(n * static_cast<std::size_t>(c.p) + 1, r), out(in.size(), -1);
        const Collective mine = c.odd(r) ? kind.other : kind.collective;
        // (A reduce has no linear tree: the other collective's call then takes the binomial one.)
        const Options options{mine == kind.collective || mine == Collective::gather || mine == Collective::scatter
                                  ? kind.algorithm
                                  : Algorithm::binomial_tree,
                              op_timeout};
        bool returned = false;
        try {
          // (A rank still finishing the call before may raise the mismatch from it, as above.)
          open_run_ahead_window(comm);
          switch (mine) {
            case Collective::reduce:
              comm.reduce(in.data(), out.data(), n, DataType::i32, ReduceOp::sum, c.root(r), options);
              break;
            case Collective::gather:
              comm.gather(in.data(), out.data(), n, DataType::i32, c.root(r), options);
              break;
            case Collective::scatter:
              comm.scatter(in.data(), out.data(), n, DataType::i32, c.root(r), options);
              break;
            default:
              comm.broadcast(out.data(), n, DataType::i32, c.root(r), options);
              break;
          }
          returned = true;
          comm.barrier({Algorithm::automatic, op_timeout});
          ADD_FAILURE() << name << ": rank " << r << " went on after the mismatched call";
        } catch (const Error& e) {
          EXPECT_EQ(e.code(), ErrorCode::mismatch)
              << name << " rank " << r << (returned ? " (next call)" : "") << ": " << e.what();
          caught.fetch_add(1);
        }
      });
      EXPECT_EQ(failures, "") << name;
      EXPECT_EQ(caught.load(), c.p) << name;
      EXPECT_LT(Clock::now() - start, 10s) << name;
    }
}

TEST(TcpFailure, DeadPeerIsReportedQuicklyByName) {
  MemoryStore store;
  std::vector<std::string> errors;
  Transports transports = connect_ranks(store, 3, &errors);
  ASSERT_TRUE(transports[0] && transports[1] && transports[2]);
  transport::Transport* victim = transports[2].get();
  auto comms = to_communicators(transports);
  std::atomic<int> reported{0};
  const std::string failures = run_ranks(comms, [&](Communicator& comm) {
    if (comm.rank() == 2) {
      std::this_thread::sleep_for(300ms);  // the others are waiting for it in the allreduce
      transport::tcp::testing::crash(*victim);
      return;
    }
    std::vector<float> v(1000, 1.0f);
    const auto start = Clock::now();
    try {
      comm.allreduce(v.data(), v.data(), v.size(), DataType::f32, ReduceOp::sum, {Algorithm::ring, op_timeout});
      ADD_FAILURE() << "the allreduce succeeded without rank 2";
    } catch (const Error& e) {
      const std::string what = e.what();
      EXPECT_EQ(e.code(), ErrorCode::peer_failure) << what;
      EXPECT_NE(what.find("rank 2 closed its connection"), std::string::npos) << what;
      EXPECT_LT(Clock::now() - start, 10s);  // at once, not at the 60 s deadline
      reported.fetch_add(1);
    }
  });
  EXPECT_EQ(failures, "");
  EXPECT_EQ(reported.load(), 2);
}

TEST(TcpShutdown, OrderlyDestructionIsNotAPeerFailure) {
  MemoryStore store;
  std::vector<std::string> errors;
  Transports transports = connect_ranks(store, 2, &errors);
  ASSERT_TRUE(transports[0] && transports[1]);
  transport::Transport* survivor = transports[1].get();
  {
    auto comms = to_communicators(transports);
    EXPECT_EQ(run_ranks(comms, [](Communicator& comm) { comm.barrier({{}, op_timeout}); }), "");
    comms[0] = Communicator();  // rank 0 leaves: goodbye, then its sockets close
    std::this_thread::sleep_for(300ms);
    EXPECT_FALSE(survivor->aborted().has_value()) << survivor->aborted()->error.what();
  }
}

TEST(TcpConnect, RefusesToStartWithoutAToken) {
  ::unsetenv("TUTTI_INSECURE");
  MemoryStore store;
  try {
    transport::tcp::connect(store, "", 0, 2, 7, "127.0.0.1", 1000ms);
    ADD_FAILURE() << "connected without a token";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::invalid_argument);
    EXPECT_NE(std::string(e.what()).find("TUTTI_TOKEN"), std::string::npos) << e.what();
  }
}

// TUTTI_INSECURE=1 with no token: no authentication and no tags, and the transport still works.
TEST(TcpConnect, InsecureModeRunsWithoutAToken) {
  ::setenv("TUTTI_INSECURE", "1", 1);
  MemoryStore store;
  std::vector<std::string> errors;
  Transports transports = connect_ranks(store, 3, &errors, connect_timeout, {}, "");
  ::unsetenv("TUTTI_INSECURE");
  for (const std::string& error : errors) EXPECT_EQ(error, "");
  if (!transports[0] || !transports[1] || !transports[2]) return;
  auto comms = to_communicators(transports);
  EXPECT_EQ(run_ranks(comms,
                      [](Communicator& comm) {
                        std::vector<float> v(100'003, 1.0f);
                        comm.allreduce(v.data(), v.data(), v.size(), DataType::f32, ReduceOp::sum, {{}, op_timeout});
                        for (float x : v) ASSERT_EQ(x, 3.0f);
                      }),
            "");
}

// A rank that leaves in good order (its transport destroyed: goodbye) while a peer waits for it:
// the peer fails at once, naming it, instead of at its deadline; and so does any later call on it.
TEST(TcpShutdown, WaitingForARankThatLeftFailsAtOnceNamingIt) {
  MemoryStore store;
  std::vector<std::string> errors;
  Transports transports = connect_ranks(store, 2, &errors);
  ASSERT_TRUE(transports[0] && transports[1]);
  auto comms = to_communicators(transports);
  std::thread leaver([&] {
    std::this_thread::sleep_for(300ms);
    comms[0] = Communicator();  // rank 0 returns without sending what rank 1 waits for
  });
  std::vector<int> buffer(10, -1);
  const auto start = Clock::now();
  try {
    comms[1].recv(buffer.data(), buffer.size(), DataType::i32, 0, 3);  // deadline: 60 s
    ADD_FAILURE() << "the receive succeeded";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_EQ(e.code(), ErrorCode::peer_failure) << what;
    EXPECT_NE(what.find("rank 0 left (closed its communicator/exited) while rank 1 was waiting for it in recv from "
                        "rank 0 (tag 3)"),
              std::string::npos)
        << what;
  }
  leaver.join();
  EXPECT_LT(Clock::now() - start, 5s);
  for (int x : buffer) EXPECT_EQ(x, -1);
  // Later calls that need rank 0 fail at once too.
  const auto later = Clock::now();
  EXPECT_THROW(comms[1].send(buffer.data(), buffer.size(), DataType::i32, 0, 4), Error);
  EXPECT_LT(Clock::now() - later, 5s);
}

// A rank that leaves a collective early: the others fail with peer_failure naming it, at once.
TEST(TcpShutdown, RankLeavingDuringACollectiveIsNamedByTheOthers) {
  MemoryStore store;
  std::vector<std::string> errors;
  Transports transports = connect_ranks(store, 3, &errors);
  ASSERT_TRUE(transports[0] && transports[1] && transports[2]);
  auto comms = to_communicators(transports);
  std::atomic<int> named{0};
  const auto start = Clock::now();
  const std::string failures = run_ranks(comms, [&](Communicator& comm) {
    if (comm.rank() == 2) {
      std::this_thread::sleep_for(300ms);
      comm = Communicator();  // leaves without joining the allreduce
      return;
    }
    std::vector<float> v(1000, 1.0f);
    try {
      comm.allreduce(v.data(), v.data(), v.size(), DataType::f32, ReduceOp::sum, {Algorithm::ring, op_timeout});
      ADD_FAILURE() << "the allreduce succeeded without rank 2";
    } catch (const Error& e) {
      const std::string what = e.what();
      EXPECT_EQ(e.code(), ErrorCode::peer_failure) << what;
      if (what.find("rank 2 left (closed its communicator/exited)") != std::string::npos)
        named.fetch_add(1);
      else
        ADD_FAILURE() << what;
    }
  });
  EXPECT_EQ(failures, "");
  EXPECT_EQ(named.load(), 2);
  EXPECT_LT(Clock::now() - start, 5s);
}

// Every rank finishes its work and then leaves, in any order: nobody sees an error.
TEST(TcpShutdown, WholeJobLeavingInAnyOrderIsNotAFailure) {
  MemoryStore store;
  std::vector<std::string> errors;
  Transports transports = connect_ranks(store, 4, &errors);
  ASSERT_TRUE(transports[0] && transports[1] && transports[2] && transports[3]);
  std::vector<transport::Transport*> raw;
  for (auto& t : transports) raw.push_back(t.get());
  auto comms = to_communicators(transports);
  std::mutex mutex;
  std::string aborted;
  const std::string failures = run_ranks(comms, [&](Communicator& comm) {
    const int me = comm.rank();
    for (int round = 0; round < 20; ++round) {
      std::vector<float> v(round % 2 ? 100'003 : 7, 1.0f);
      comm.allreduce(v.data(), v.data(), v.size(), DataType::f32, ReduceOp::sum, {{}, op_timeout});
      for (float x : v) ASSERT_EQ(x, 4.0f);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50 * ((me * 3) % 4)));
    {
      std::lock_guard lock(mutex);
      if (auto failure = raw[static_cast<std::size_t>(me)]->aborted())
        aborted += "rank " + std::to_string(me) + ": " + failure->error.what() + "\n";
    }
    comm = Communicator();
  });
  EXPECT_EQ(failures, "");
  EXPECT_EQ(aborted, "");
}

}  // namespace
}  // namespace tutti::testing
