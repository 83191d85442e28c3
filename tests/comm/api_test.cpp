// The public API beyond the per-collective sweep: nonblocking operations, split communicators,
// point to point, typed conveniences, invalid arguments, unsupported algorithms, the errors
// raised when ranks disagree or stop answering, and the free functions and read-only view
// (reduce_local, algorithms, the names' readers, launcher).
#include <sys/resource.h>

#include <atomic>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <numeric>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "comm/access.hpp"
#include "comm/comm_impl.hpp"
#include "harness.hpp"
#include "transport/inproc/inproc.hpp"

namespace tutti::testing {
namespace {

using namespace std::chrono_literals;

// Expects `fn` to throw Error(code) whose message contains `needle`.
template <class Fn>
void expect_error(Fn&& fn, ErrorCode code, const std::string& needle) {
  try {
    fn();
    ADD_FAILURE() << "expected Error(" << to_string(code) << ") mentioning '" << needle << "'";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), code) << e.what();
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << "message: " << e.what();
  }
}

TEST(Types, SizesAndMapping) {
  EXPECT_EQ(size_of(DataType::i8), 1u);
  EXPECT_EQ(size_of(DataType::bf16), 2u);
  EXPECT_EQ(size_of(DataType::f16), 2u);
  EXPECT_EQ(size_of(DataType::u32), 4u);
  EXPECT_EQ(size_of(DataType::f64), 8u);
  static_assert(data_type_of<float>() == DataType::f32);
  static_assert(data_type_of<const std::int64_t>() == DataType::i64);
  static_assert(data_type_of<bf16>() == DataType::bf16);
  static_assert(data_type_of<f16>() == DataType::f16);
  static_assert(sizeof(f16) == 2 && sizeof(bf16) == 2);
}

TEST(Types, HalfConversionsRoundToNearestEven) {
  EXPECT_EQ(f16(1.0f).bits, 0x3c00);
  EXPECT_EQ(f16(65504.0f).bits, 0x7bff);
  EXPECT_EQ(f16(65520.0f).bits, 0x7c00);                // rounds to infinity
  EXPECT_EQ(f16(1.0f + 1.0f / 2048).bits, 0x3c00);      // halfway: to even
  EXPECT_EQ(f16(1.0f + 3.0f / 2048).bits, 0x3c02);      // halfway: to even (up)
  EXPECT_EQ(f16(5.960464477539063e-08f).bits, 0x0001);  // smallest subnormal
  EXPECT_EQ(static_cast<float>(f16(-2.5f)), -2.5f);
  EXPECT_EQ(bf16(1.0f).bits, 0x3f80);
  EXPECT_EQ(bf16(1.0f + 1.0f / 256).bits, 0x3f80);  // halfway: to even
  EXPECT_EQ(bf16(1.0f + 3.0f / 256).bits, 0x3f82);
  EXPECT_EQ(static_cast<float>(bf16(-3.0f)), -3.0f);
  for (std::uint32_t bits = 0; bits < 0x10000; ++bits) {  // every f16 value survives a round trip
    f16 h;
    h.bits = static_cast<std::uint16_t>(bits);
    const float f = static_cast<float>(h);
    if (f != f) continue;  // NaN
    EXPECT_EQ(f16(f).bits, h.bits) << bits;
  }
}

TEST(Init, SingleProcessJob) {
  Communicator world = init();
  EXPECT_EQ(world.size(), 1);
  EXPECT_EQ(world.rank(), 0);
  std::vector<float> data = {1, 2, 3};
  world.allreduce(std::span<float>(data), ReduceOp::sum);
  EXPECT_EQ(data, (std::vector<float>{1, 2, 3}));
  world.barrier();
}

TEST(Init, MalformedJobEnvironmentIsNamed) {
  ::setenv("TUTTI_SIZE", "4", 1);
  expect_error([] { init(); }, ErrorCode::invalid_argument, "TUTTI_RANK");
  ::setenv("TUTTI_RANK", "0", 1);
  expect_error([] { init(); }, ErrorCode::invalid_argument, "without TUTTI_STORE");
  ::setenv("TUTTI_RANK", "4", 1);
  expect_error([] { init(); }, ErrorCode::invalid_argument, "TUTTI_RANK");
  ::unsetenv("TUTTI_RANK");
  ::unsetenv("TUTTI_SIZE");
  EXPECT_EQ(init().size(), 1);
}

TEST(Nonblocking, ManyOutstandingCompletedInReverseOrder) {
  const std::string failures = run_ranks(4, [](Communicator& comm) {
    constexpr int ops = 24;
    std::vector<std::vector<std::int64_t>> data(ops);
    std::vector<Request> requests;
    const Algorithm algorithms[] = {Algorithm::ring, Algorithm::recursive_doubling, Algorithm::rabenseifner,
                                    Algorithm::binomial_tree};
    for (int i = 0; i < ops; ++i) {
      data[i].assign(static_cast<std::size_t>(1 + i * 997), comm.rank() + i);
      requests.push_back(comm.iallreduce(data[i].data(), data[i].data(), data[i].size(), DataType::i64, ReduceOp::sum,
                                         {algorithms[i % 4], test_timeout}));
    }
    for (int i = ops - 1; i >= 0; --i) {
      requests[i].wait();
      // Waiting on a later operation completes every earlier one (issue order).
      for (int k = 0; k <= i; ++k) ASSERT_TRUE(requests[k].test());
    }
    for (int i = 0; i < ops; ++i) {
      const std::int64_t want = 0 + 1 + 2 + 3 + 4 * i;
      for (auto v : data[i]) ASSERT_EQ(v, want) << "op " << i;
    }
  });
  EXPECT_EQ(failures, "");
}

TEST(Nonblocking, MixedCollectivesInFlight) {
  const std::string failures = run_ranks(5, [](Communicator& comm) {
    const int p = comm.size(), r = comm.rank();
    std::vector<int> a(1000, r), mine(1000, r), gathered(1000 * static_cast<std::size_t>(p), -1),
        b(777, r == 2 ? 42 : -1);
    std::vector<double> c(3001, r);
    Request r1 =
        comm.iallreduce(a.data(), a.data(), a.size(), DataType::i32, ReduceOp::max, {Algorithm::ring, test_timeout});
    Request r2 =
        comm.iallgather(mine.data(), gathered.data(), a.size(), DataType::i32, {Algorithm::bruck, test_timeout});
    Request r3 = comm.ibroadcast(b.data(), b.size(), DataType::i32, 2, {Algorithm::ring, test_timeout});
    Request r4 = comm.iallreduce(c.data(), c.data(), c.size(), DataType::f64, ReduceOp::avg, {{}, test_timeout});
    Request r5 = comm.ibarrier({{}, test_timeout});
    while (!r5.test()) r5.wait_for(10ms);
    EXPECT_TRUE(r1.test() && r2.test() && r3.test() && r4.test());
    for (int v : a) ASSERT_EQ(v, p - 1);
    for (std::size_t i = 0; i < gathered.size(); ++i) ASSERT_EQ(gathered[i], static_cast<int>(i / 1000));
    for (int v : b) ASSERT_EQ(v, 42);
    for (double v : c) ASSERT_EQ(v, 2.0);  // (0+1+2+3+4)/5
  });
  EXPECT_EQ(failures, "");
}

TEST(Split, ColorsKeysAndEmpty) {
  const std::string failures = run_ranks(7, [](Communicator& comm) {
    const int r = comm.rank();
    // Colors 0/1 by parity, keys reversing the order; rank 6 opts out.
    Communicator sub = comm.split(r == 6 ? -1 : r % 2, -r);
    if (r == 6) {
      EXPECT_EQ(sub.size(), 0);
      EXPECT_EQ(sub.rank(), -1);
      expect_error([&] { sub.barrier(); }, ErrorCode::invalid_argument, "empty");
      return;
    }
    ASSERT_EQ(sub.size(), 3);  // evens {0,2,4}, odds {1,3,5}
    // Key -r reverses the order: the highest old rank gets new rank 0.
    const std::vector<int> evens = {4, 2, 0}, odds = {5, 3, 1};
    const auto& order = r % 2 == 0 ? evens : odds;
    EXPECT_EQ(order[static_cast<std::size_t>(sub.rank())], r);
    std::vector<int> all(static_cast<std::size_t>(sub.size()));
    sub.allgather(&r, all.data(), 1, DataType::i32, {{}, test_timeout});
    EXPECT_EQ(all, order);
  });
  EXPECT_EQ(failures, "");
}

TEST(Split, ConcurrentCommunicators) {
  // Each rank drives its half-communicator and its parity communicator from two threads at once,
  // while the parent is used afterwards: messages of different communicators never mix.
  const std::string failures = run_ranks(8, [](Communicator& comm) {
    const int r = comm.rank();
    Communicator halves = comm.split(r / 4, r);
    Communicator parity = comm.split(r % 2, r);
    std::string error;
    auto drive = [&error](Communicator& c, int salt) {
      try {
        for (int i = 0; i < 50; ++i) {
          std::vector<std::int64_t> v(257 + static_cast<std::size_t>(i * 31), c.rank() * salt + i);
          c.allreduce(v.data(), v.data(), v.size(), DataType::i64, ReduceOp::sum,
                      {i % 2 ? Algorithm::ring : Algorithm::recursive_doubling, test_timeout});
          const std::int64_t want = salt * (c.size() * (c.size() - 1) / 2) + static_cast<std::int64_t>(i) * c.size();
          for (auto x : v)
            if (x != want) throw std::runtime_error("wrong sum in split communicator");
        }
      } catch (const std::exception& e) {
        error = e.what();
      }
    };
    std::string error2;
    std::thread t([&] {
      std::string mine;
      auto drive2 = [&](Communicator& c) {
        for (int i = 0; i < 50; ++i) {
          std::vector<std::int64_t> v(129 + static_cast<std::size_t>(i), 1);
          c.allreduce(v.data(), v.data(), v.size(), DataType::i64, ReduceOp::sum,
                      {Algorithm::rabenseifner, test_timeout});
          for (auto x : v)
            if (x != c.size()) throw std::runtime_error("wrong sum in parity communicator");
        }
      };
      try {
        drive2(parity);
      } catch (const std::exception& e) {
        error2 = e.what();
      }
    });
    drive(halves, 3);
    t.join();
    EXPECT_EQ(error, "");
    EXPECT_EQ(error2, "");
    std::int64_t one = 1, total = 0;
    comm.allreduce(&one, &total, 1, DataType::i64, ReduceOp::sum, {{}, test_timeout});
    EXPECT_EQ(total, 8);
  });
  EXPECT_EQ(failures, "");
}

TEST(PointToPoint, RingAndTagsInOrder) {
  const std::string failures = run_ranks(5, [](Communicator& comm) {
    const int p = comm.size(), r = comm.rank();
    const int next = (r + 1) % p, prev = (r + p - 1) % p;
    // Several messages per tag, two tags, posted before any is received: per-tag order holds.
    std::vector<std::vector<int>> out(6), in(6);
    std::vector<Request> requests;
    for (int k = 0; k < 6; ++k) {
      out[k].assign(100 + k, r * 100 + k);
      in[k].assign(100 + k, -1);
    }
    for (int k = 0; k < 6; ++k)
      requests.push_back(comm.isend(out[k].data(), out[k].size(), DataType::i32, next, k % 2));
    // Receives posted tag 1 first, then tag 0: tags are separate channels, each in order.
    for (int tag : {1, 0})
      for (int k = tag; k < 6; k += 2)
        requests.push_back(comm.irecv(in[k].data(), in[k].size(), DataType::i32, prev, tag));
    for (auto& q : requests) q.wait();
    for (int k = 0; k < 6; ++k)
      for (int v : in[k]) ASSERT_EQ(v, prev * 100 + k) << "message " << k;
    // Blocking: pairs exchange.
    if (r % 2 == 0 && r + 1 < p) {
      double x = r;
      comm.send(&x, 1, DataType::f64, r + 1, 7);
    } else if (r % 2 == 1) {
      double x = -1;
      comm.recv(&x, 1, DataType::f64, r - 1, 7);
      EXPECT_EQ(x, r - 1);
    }
  });
  EXPECT_EQ(failures, "");
}

TEST(PointToPoint, SizeMismatchIsAnErrorOnBothSides) {
  std::atomic<int> mismatches{0};
  const std::string failures = run_ranks(2, [&](Communicator& comm) {
    std::vector<int> buffer(10, 0);
    try {
      if (comm.rank() == 0)
        comm.send(buffer.data(), 10, DataType::i32, 1);
      else
        comm.recv(buffer.data(), 9, DataType::i32, 0);
    } catch (const Error& e) {
      if (e.code() == ErrorCode::mismatch) mismatches.fetch_add(1);
    }
  });
  EXPECT_EQ(failures, "");
  EXPECT_EQ(mismatches.load(), 2);
}

// count * element size past SIZE_MAX is refused by send, recv, isend and irecv, naming the count,
// before anything is sent (it used to wrap around to a 4-byte message that was sent and matched).
TEST(PointToPoint, ByteCountOverflowIsRefusedBeforeSending) {
  const std::string failures = run_ranks(2, [](Communicator& comm) {
    const std::size_t huge = SIZE_MAX / 2 + 1;  // * 4 bytes of f32 wraps around to 4
    const std::string count = std::to_string(huge);
    const int peer = 1 - comm.rank();
    std::vector<float> out(4, static_cast<float>(comm.rank() + 1)), in(4, 0);
    const std::function<void()> send = [&] { comm.send(out.data(), huge, DataType::f32, peer, 3); };
    const std::function<void()> recv = [&] { comm.recv(in.data(), huge, DataType::f32, peer, 3); };
    // Rank 0 sends first and rank 1 receives first, so that the calls, were they accepted, would
    // complete (and fail the test) instead of waiting for each other.
    expect_error(comm.rank() == 0 ? send : recv, ErrorCode::invalid_argument, count);
    expect_error(comm.rank() == 0 ? recv : send, ErrorCode::invalid_argument, count);
    expect_error([&] { comm.isend(out.data(), huge, DataType::f32, peer, 3); }, ErrorCode::invalid_argument, count);
    expect_error([&] { comm.irecv(in.data(), huge, DataType::f32, peer, 3); }, ErrorCode::invalid_argument, count);
    // Nothing was sent and no message of tag 3 was numbered: the next exchange matches as usual.
    Request r = comm.irecv(in.data(), 1, DataType::f32, peer, 3);
    comm.send(out.data(), 1, DataType::f32, peer, 3);
    r.wait();
    EXPECT_EQ(in[0], static_cast<float>(peer + 1));
    EXPECT_EQ(in[1], 0.0f);
  });
  EXPECT_EQ(failures, "");
}

TEST(Typed, SpanConveniences) {
  const std::string failures = run_ranks(3, [](Communicator& comm) {
    const int r = comm.rank();
    std::vector<float> x(10, static_cast<float>(r + 1));
    comm.allreduce(std::span<float>(x), ReduceOp::prod);
    for (float v : x) ASSERT_EQ(v, 6.0f);
    std::vector<std::int32_t> send(4, r), recv(4);
    comm.allreduce(std::span<const std::int32_t>(send), std::span<std::int32_t>(recv), ReduceOp::sum);
    for (auto v : recv) ASSERT_EQ(v, 3);
    std::vector<double> b(5, r == 1 ? 2.5 : 0.0);
    comm.broadcast(std::span<double>(b), 1);
    for (double v : b) ASSERT_EQ(v, 2.5);
    std::vector<std::uint8_t> mine(2, static_cast<std::uint8_t>(r)), all(6);
    comm.allgather(std::span<const std::uint8_t>(mine), std::span<std::uint8_t>(all));
    EXPECT_EQ(all, (std::vector<std::uint8_t>{0, 0, 1, 1, 2, 2}));
    std::vector<std::int64_t> full(6, r), part(2);
    comm.reduce_scatter(std::span<const std::int64_t>(full), std::span<std::int64_t>(part), ReduceOp::sum);
    EXPECT_EQ(part, (std::vector<std::int64_t>{3, 3}));
    expect_error([&] { comm.allgather(std::span<const std::uint8_t>(mine), std::span<std::uint8_t>(all).first(5)); },
                 ErrorCode::invalid_argument, "recv.size()");
  });
  EXPECT_EQ(failures, "");
}

TEST(InvalidArguments, NamedAndNothingSent) {
  const std::string failures = run_ranks(3, [](Communicator& comm) {
    const int p = comm.size();
    std::vector<float> a(12, 1), b(12, 0);
    std::vector<std::size_t> counts(static_cast<std::size_t>(p), 1), short_counts(2, 1);
    const Options o{{}, test_timeout};
    // Only rank 1 makes bad calls: if any of them sent a byte or took a sequence number,
    // the collective below would mismatch or hang.
    if (comm.rank() == 1) {
      expect_error([&] { comm.allreduce(nullptr, b.data(), 4, DataType::f32, ReduceOp::sum, o); },
                   ErrorCode::invalid_argument, "send is null");
      expect_error([&] { comm.allreduce(a.data(), nullptr, 4, DataType::f32, ReduceOp::sum, o); },
                   ErrorCode::invalid_argument, "recv is null");
      expect_error([&] { comm.broadcast(nullptr, 4, DataType::f32, 0, o); }, ErrorCode::invalid_argument,
                   "buffer is null");
      expect_error([&] { comm.broadcast(a.data(), 4, DataType::f32, p, o); }, ErrorCode::invalid_argument, "root 3");
      expect_error([&] { comm.reduce(a.data(), b.data(), 4, DataType::f32, ReduceOp::sum, -1, o); },
                   ErrorCode::invalid_argument, "root -1");
      expect_error([&] { comm.gather(a.data(), b.data(), 1, DataType::f32, 7, o); }, ErrorCode::invalid_argument,
                   "root 7");
      expect_error([&] { comm.scatter(a.data(), b.data(), 1, DataType::f32, -2, o); }, ErrorCode::invalid_argument,
                   "root -2");
      expect_error([&] { comm.send(a.data(), 1, DataType::f32, 3); }, ErrorCode::invalid_argument, "peer 3");
      expect_error([&] { comm.recv(a.data(), 1, DataType::f32, -2); }, ErrorCode::invalid_argument, "peer -2");
      expect_error([&] { comm.send(a.data(), 1, DataType::f32, 0, -5); }, ErrorCode::invalid_argument, "tag");
      expect_error([&] { comm.allgatherv(a.data(), 1, b.data(), short_counts, DataType::f32, o); },
                   ErrorCode::invalid_argument, "recv_counts has 2 entries");
      expect_error([&] { comm.allgatherv(a.data(), 2, b.data(), counts, DataType::f32, o); },
                   ErrorCode::invalid_argument, "send_count (2)");
      expect_error([&] { comm.alltoallv(a.data(), short_counts, b.data(), counts, DataType::f32, o); },
                   ErrorCode::invalid_argument, "send_counts has 2 entries");
      expect_error([&] { comm.alltoallv(a.data(), counts, b.data(), short_counts, DataType::f32, o); },
                   ErrorCode::invalid_argument, "recv_counts has 2 entries");
      expect_error([&] { comm.allreduce(a.data(), a.data() + 1, 4, DataType::f32, ReduceOp::sum, o); },
                   ErrorCode::invalid_argument, "overlap");
      expect_error([&] { comm.allgather(a.data() + 1, a.data(), 2, DataType::f32, o); }, ErrorCode::invalid_argument,
                   "overlap");
      expect_error([&] { comm.alltoall(a.data(), a.data() + 3, 3, DataType::f32, o); }, ErrorCode::invalid_argument,
                   "overlap");
      expect_error([&] { comm.allreduce(a.data(), b.data(), 4, static_cast<DataType>(99), ReduceOp::sum, o); },
                   ErrorCode::invalid_argument, "DataType");
      expect_error([&] { comm.allreduce(a.data(), b.data(), 4, DataType::f32, static_cast<ReduceOp>(42), o); },
                   ErrorCode::invalid_argument, "ReduceOp");
      expect_error(
          [&] {
            comm.allreduce(a.data(), b.data(), 4, DataType::f32, ReduceOp::sum,
                           {static_cast<Algorithm>(static_cast<int>(Algorithm::mpi) + 1), test_timeout});
          },
          ErrorCode::invalid_argument, "not a valid Algorithm (11)");
      expect_error([&] { comm.allreduce(a.data(), b.data(), SIZE_MAX / 2, DataType::f32, ReduceOp::sum, o); },
                   ErrorCode::invalid_argument, "overflows");
      expect_error(
          [&] {
            comm.allreduce(a.data(), b.data(), 4, DataType::f32, ReduceOp::sum, {Algorithm::bruck, test_timeout});
          },
          ErrorCode::unsupported, "bruck");
      expect_error(
          [&] {
            comm.allreduce(a.data(), b.data(), 4, DataType::f32, ReduceOp::sum, {Algorithm::direct, test_timeout});
          },
          ErrorCode::unsupported, "direct");
      expect_error(
          [&] {
            comm.gather(a.data(), b.data(), 1, DataType::f32, 0, {Algorithm::ring, test_timeout});
          },
          ErrorCode::unsupported, "ring");
      expect_error(
          [&] {
            comm.broadcast(a.data(), 1, DataType::f32, 0, {Algorithm::mpi, test_timeout});
          },
          ErrorCode::unsupported, "mpi");
      expect_error(
          [&] {
            comm.alltoallv(a.data(), counts, b.data(), counts, DataType::f32, {Algorithm::bruck, test_timeout});
          },
          ErrorCode::unsupported, "bruck");
    }
    // Non-roots may pass null recv (reduce, gather) and null send (scatter) with count > 0.
    comm.reduce(a.data(), comm.rank() == 0 ? b.data() : nullptr, 4, DataType::f32, ReduceOp::sum, 0, o);
    std::vector<float> scattered(2);
    comm.scatter(comm.rank() == 2 ? a.data() : nullptr, scattered.data(), 2, DataType::f32, 2, o);
    float sum = 0, one = 1;
    comm.allreduce(&one, &sum, 1, DataType::f32, ReduceOp::sum, o);
    EXPECT_EQ(sum, 3.0f);
  });
  EXPECT_EQ(failures, "");
  expect_error([] { local_group(0); }, ErrorCode::invalid_argument, "p must be at least 1");
  Communicator empty;
  expect_error([&] { empty.split(0, 0); }, ErrorCode::invalid_argument, "empty");
}

TEST(Errors, MismatchedCountsRaiseOnEveryRank) {
  std::atomic<int> mismatches{0};
  const std::string failures = run_ranks(4, [&](Communicator& comm) {
    std::vector<float> v(1000, 1.0f);
    const std::size_t n = comm.rank() == 2 ? 999 : 1000;
    try {
      comm.allreduce(v.data(), v.data(), n, DataType::f32, ReduceOp::sum, {{}, test_timeout});
    } catch (const Error& e) {
      const std::string what = e.what();
      if (e.code() == ErrorCode::mismatch && what.find("count=999") != std::string::npos &&
          what.find("count=1000") != std::string::npos && what.find("rank 2") != std::string::npos)
        mismatches.fetch_add(1);
    }
    // Nothing past the smaller buffer was written: elements keep their input on rank 2.
    if (comm.rank() == 2) {
      EXPECT_EQ(v[999], 1.0f);
    }
    // The communicator is now aborted for everyone.
    expect_error([&] { comm.barrier({{}, test_timeout}); }, ErrorCode::aborted, "aborted");
  });
  EXPECT_EQ(failures, "");
  EXPECT_EQ(mismatches.load(), 4);
}

// In a process whose address space is capped just above what it holds: two ranks' in-place
// alltoall of 2^26 floats a block needs a snapshot of each input (512 MiB) that cannot be had.
// Every rank must raise Error(system) naming the size; std::bad_alloc must not escape. Exits 0
// when it did so.
[[noreturn]] void alltoall_beyond_an_address_space_limit() {
  constexpr std::size_t block = std::size_t{1} << 26;
  std::vector<std::unique_ptr<float[]>> buffers;  // 512 MiB each, never touched: no memory used
  for (int r = 0; r < 2; ++r) buffers.emplace_back(new float[2 * block]);
  std::size_t pages = 0;
  std::ifstream("/proc/self/statm") >> pages;
  const rlim_t limit = pages * static_cast<rlim_t>(::sysconf(_SC_PAGESIZE)) + (rlim_t{256} << 20);
  const rlimit cap{limit, limit};
  if (::setrlimit(RLIMIT_AS, &cap) != 0) std::_Exit(2);
  std::atomic<int> named{0};
  const std::string failures = run_ranks(2, [&](Communicator& comm) {
    float* data = buffers[static_cast<std::size_t>(comm.rank())].get();
    try {
      comm.alltoall(data, data, block, DataType::f32, {{}, 5s});
    } catch (const Error& e) {
      const std::string what = e.what();
      if (e.code() == ErrorCode::system && what.find("out of memory") != std::string::npos &&
          what.find("67108864 elements of f32") != std::string::npos)
        ++named;
      else
        std::fprintf(stderr, "rank %d: %s\n", comm.rank(), what.c_str());
    }
  });
  std::fprintf(stderr, "%d of 2 ranks named the size; %s\n", named.load(), failures.c_str());
  std::_Exit(failures.empty() && named == 2 ? 0 : 1);
}

TEST(Errors, OutOfMemoryForWorkingBuffersIsAnErrorNamingTheSize) {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "a sanitizer's shadow memory does not fit under an address-space limit";
#else
  GTEST_FLAG_SET(death_test_style, "threadsafe");  // a fresh process: the cap stays there
  EXPECT_EXIT(alltoall_beyond_an_address_space_limit(), ::testing::ExitedWithCode(0), "");
#endif
}

TEST(Errors, MismatchedRootsAndKinds) {
  std::atomic<int> mismatches{0};
  const std::string failures = run_ranks(3, [&](Communicator& comm) {
    std::vector<int> v(16, comm.rank());
    try {
      if (comm.rank() == 0)
        comm.allreduce(v.data(), v.data(), 16, DataType::i32, ReduceOp::sum, {{}, test_timeout});
      else
        comm.broadcast(v.data(), 16, DataType::i32, comm.rank(), {{}, test_timeout});
    } catch (const Error& e) {
      if (e.code() == ErrorCode::mismatch) mismatches.fetch_add(1);
    }
  });
  EXPECT_EQ(failures, "");
  EXPECT_EQ(mismatches.load(), 3);
}

TEST(Errors, SilentPeerTimesOutNamingIt) {
  const std::string failures = run_ranks(2, [](Communicator& comm) {
    std::vector<float> v(64, 1.0f);
    if (comm.rank() == 1) {  // joins the call late: gets the same error; later calls get aborted
      std::this_thread::sleep_for(500ms);
      expect_error([&] { comm.allreduce(v.data(), v.data(), 64, DataType::f32, ReduceOp::sum); }, ErrorCode::timeout,
                   "waiting for rank(s) 1");
      expect_error([&] { comm.barrier(); }, ErrorCode::aborted, "timed out");
      return;
    }
    const auto start = std::chrono::steady_clock::now();
    expect_error(
        [&] {
          comm.allreduce(v.data(), v.data(), 64, DataType::f32, ReduceOp::sum, {Algorithm::ring, 200ms});
        },
        ErrorCode::timeout, "timed out after 200 ms; still waiting for rank(s) 1");
    EXPECT_LT(std::chrono::steady_clock::now() - start, 10s);
    expect_error([&] { comm.barrier(); }, ErrorCode::aborted, "aborted");
  });
  EXPECT_EQ(failures, "");
}

TEST(Errors, WaitForGivesUpWithoutFailing) {
  const std::string failures = run_ranks(2, [](Communicator& comm) {
    int x = comm.rank(), y = -1;
    if (comm.rank() == 1) std::this_thread::sleep_for(300ms);
    Request r = comm.iallreduce(&x, &y, 1, DataType::i32, ReduceOp::sum, {{}, test_timeout});
    if (comm.rank() == 0) {
      EXPECT_FALSE(r.wait_for(50ms));  // rank 1 has not called yet
    }
    r.wait();
    EXPECT_EQ(y, 1);
    Request empty;
    EXPECT_TRUE(empty.test());
    empty.wait();
  });
  EXPECT_EQ(failures, "");
}

// Polling in slices with wait_for(slice, since) reaches the operation's deadline, counted from
// `since`: rank 1 calls only after rank 0 has timed out (each slice alone would never time out).
TEST(Errors, WaitForSinceCountsTheTimeoutFromSince) {
  const std::string failures = run_ranks(2, [](Communicator& comm) {
    int x = 1, y = -1;
    if (comm.rank() == 1) {
      std::this_thread::sleep_for(600ms);
      expect_error([&] { comm.allreduce(&x, &y, 1, DataType::i32, ReduceOp::sum); }, ErrorCode::timeout,
                   "waiting for rank(s) 1");
      return;
    }
    const auto issued = std::chrono::steady_clock::now();
    Request r = comm.iallreduce(&x, &y, 1, DataType::i32, ReduceOp::sum, {{}, 200ms});
    int slices = 0;
    expect_error(
        [&] {
          while (!r.wait_for(20ms, issued))
            if (++slices > 250) throw std::runtime_error("no timeout after 250 slices of 20 ms");
        },
        ErrorCode::timeout, "timed out after 200 ms");
    EXPECT_LT(std::chrono::steady_clock::now() - issued, 5s);
  });
  EXPECT_EQ(failures, "");
}

}  // namespace
}  // namespace tutti::testing

namespace tutti::testing {
namespace {

// A transport that cannot reduce on arrival: the executor receives into staging memory and
// reduces itself. Every reducing algorithm must give the same exact results that way.
TEST(Executor, StagedReceiveAndReduce) {
  for (int p : {2, 3, 5, 8}) {
    std::vector<Communicator> comms;
    for (auto& t : transport::inproc::make_group(p, false))
      comms.push_back(comm::Access::make(std::make_shared<comm::CommImpl>(std::move(t))));
    std::vector<std::thread> threads;
    std::atomic<int> wrong{0};
    for (int r = 0; r < p; ++r)
      threads.emplace_back([&, r] {
        Communicator& comm = comms[static_cast<std::size_t>(r)];
        for (Algorithm a :
             {Algorithm::ring, Algorithm::recursive_doubling, Algorithm::rabenseifner, Algorithm::binomial_tree}) {
          std::vector<std::int32_t> v(1001);
          for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<std::int32_t>(i) * (r + 1);
          comm.allreduce(v.data(), v.data(), v.size(), DataType::i32, ReduceOp::sum, {a, test_timeout});
          for (std::size_t i = 0; i < v.size(); ++i)
            if (v[i] != static_cast<std::int32_t>(i) * p * (p + 1) / 2) wrong.fetch_add(1);
          std::vector<std::int32_t> part(3);
          std::vector<std::int32_t> full(3 * static_cast<std::size_t>(p), r);
          comm.reduce_scatter(full.data(), part.data(), 3, DataType::i32, ReduceOp::max, {{}, test_timeout});
          for (auto x : part)
            if (x != p - 1) wrong.fetch_add(1);
        }
      });
    for (auto& t : threads) t.join();
    EXPECT_EQ(wrong.load(), 0) << "p=" << p;
  }
}

}  // namespace
}  // namespace tutti::testing

namespace tutti::testing {
namespace {

// The progress engine advances a nonblocking allreduce while both ranks are away (sleeping
// stands in for computing, so that the 2-core machine's CPUs are free for the engine). First
// measure how long the allreduce takes when waited on at once, then issue it, stay away for
// longer than that, and check that wait() returns in a fraction of that time.
TEST(ProgressEngine, NonblockingAllreduceProceedsWhileCallerIsAway) {
  const std::size_t n = std::size_t{1} << 24;  // 64 MiB of f32 per rank
  std::atomic<long long> blocking_us{0}, wait_us{0};
  const std::string failures = run_ranks(2, [&](Communicator& comm) {
    std::vector<float> a(n, 1.0f), b(n);
    using clock = std::chrono::steady_clock;
    comm.barrier();
    auto t0 = clock::now();
    comm.allreduce(a.data(), b.data(), n, DataType::f32, ReduceOp::sum, {Algorithm::ring, test_timeout});
    const auto blocking = std::chrono::duration_cast<std::chrono::microseconds>(clock::now() - t0).count();
    comm.barrier();
    Request r = comm.iallreduce(a.data(), b.data(), n, DataType::f32, ReduceOp::sum, {Algorithm::ring, test_timeout});
    std::this_thread::sleep_for(std::chrono::microseconds(3 * blocking + 200000));
    t0 = clock::now();
    r.wait();
    const auto waited = std::chrono::duration_cast<std::chrono::microseconds>(clock::now() - t0).count();
    for (std::size_t i = 0; i < n; i += 4099) ASSERT_EQ(b[i], 2.0f);
    if (comm.rank() == 0) {
      blocking_us = blocking;
      wait_us = waited;
    }
  });
  EXPECT_EQ(failures, "");
  // A behavior check, not a timing benchmark: without background progress the wait would take
  // about as long as the blocking call, since the ring's later steps are posted by their rank.
  EXPECT_LT(wait_us.load(), blocking_us.load() / 2) << "blocking " << blocking_us << " us, wait " << wait_us << " us";
}

// reduce_local: dst = a op b with the collectives' kernels, for every type and element-wise op,
// exactly the reduction of two ranks' inputs; in place on either operand; avg, null buffers and
// partial overlaps refused before anything is written.
TEST(ReduceLocal, EveryTypeAndOpExactlyAndInPlace) {
  constexpr std::size_t count = 1003;
  for (DataType type : {DataType::i8, DataType::u8, DataType::i32, DataType::u32, DataType::i64, DataType::u64,
                        DataType::f16, DataType::bf16, DataType::f32, DataType::f64}) {
    const std::size_t size = size_of(type);
    for (ReduceOp op : {ReduceOp::sum, ReduceOp::prod, ReduceOp::min, ReduceOp::max}) {
      std::vector<std::byte> a(count * size), b(count * size), dst(count * size, std::byte{poison});
      for (std::size_t i = 0; i < count; ++i) {
        store(type, a.data() + i * size, input_value(type, op, 0, i));
        store(type, b.data() + i * size, input_value(type, op, 1, i));
      }
      reduce_local(dst.data(), a.data(), b.data(), count, type, op);
      std::vector<std::byte> in_place = b;
      reduce_local(in_place.data(), a.data(), in_place.data(), count, type, op);
      for (std::size_t i = 0; i < count; ++i) {
        ASSERT_EQ(load(type, dst.data() + i * size), reference_reduction(type, op, 2, i))
            << to_string(type) << " " << to_string(op) << " at " << i;
      }
      EXPECT_EQ(in_place, dst) << to_string(type) << " " << to_string(op);
    }
  }
  std::vector<float> a(8, 1.0f), b(8, 2.0f), dst(8, -1.0f);
  expect_error([&] { reduce_local(dst.data(), a.data(), b.data(), 8, DataType::f32, ReduceOp::avg); },
               ErrorCode::invalid_argument, "avg");
  expect_error([&] { reduce_local(nullptr, a.data(), b.data(), 8, DataType::f32, ReduceOp::sum); },
               ErrorCode::invalid_argument, "dst");
  expect_error([&] { reduce_local(a.data() + 1, a.data(), b.data(), 4, DataType::f32, ReduceOp::sum); },
               ErrorCode::invalid_argument, "overlap");
  EXPECT_EQ(dst, std::vector<float>(8, -1.0f));
  reduce_local(nullptr, nullptr, nullptr, 0, DataType::f32, ReduceOp::sum);  // nothing to do
}

// algorithms(c): automatic first, then exactly what a call may force here: each one listed is
// accepted by chosen_algorithm and runs the collective exactly; direct and mpi are not listed on
// threads (inproc), and forcing them is refused.
TEST(PublicView, AlgorithmsListsWhatACallMayForce) {
  auto comms = local_group(3);
  for (Collective c : {Collective::allreduce, Collective::allgather, Collective::broadcast, Collective::alltoall,
                       Collective::reduce_scatter, Collective::reduce}) {
    const std::vector<Algorithm> listed = comms[0].algorithms(c);
    ASSERT_GE(listed.size(), 2u) << to_string(c);
    EXPECT_EQ(listed.front(), Algorithm::automatic);
    EXPECT_EQ(std::count(listed.begin(), listed.end(), Algorithm::direct), 0) << to_string(c);
    EXPECT_EQ(std::count(listed.begin(), listed.end(), Algorithm::mpi), 0) << to_string(c);
    for (Algorithm a : listed) {
      if (a == Algorithm::automatic) continue;
      EXPECT_EQ(comms[0].chosen_algorithm(c, 4096, a), a) << to_string(a);
    }
    expect_error([&] { (void)comms[0].chosen_algorithm(c, 4096, Algorithm::direct); }, ErrorCode::unsupported,
                 "direct");
  }
  for (Algorithm a : comms[0].algorithms(Collective::allreduce)) {
    const std::string failures = run_ranks(3, [a](Communicator& comm) {
      std::vector<std::int64_t> data(1001);
      for (std::size_t i = 0; i < data.size(); ++i) data[i] = static_cast<std::int64_t>(i) * (comm.rank() + 1);
      comm.allreduce(std::span<std::int64_t>(data), ReduceOp::sum, Options{.algorithm = a, .timeout = {}});
      for (std::size_t i = 0; i < data.size(); ++i)
        if (data[i] != static_cast<std::int64_t>(i) * 6) throw std::runtime_error("wrong at " + std::to_string(i));
    });
    EXPECT_EQ(failures, "") << to_string(a);
  }
}

// The names' readers are to_string's inverses, and read nothing else.
TEST(PublicView, NamesReadBackWhatToStringWrites) {
  for (int i = 0; i <= static_cast<int>(Algorithm::mpi); ++i) {
    const auto a = static_cast<Algorithm>(i);
    EXPECT_EQ(algorithm_from_name(to_string(a)), a) << i;
  }
  for (int i = 0; i <= static_cast<int>(DataType::f64); ++i) {
    const auto t = static_cast<DataType>(i);
    EXPECT_EQ(data_type_from_name(to_string(t)), t) << i;
  }
  for (Collective c : {Collective::allreduce, Collective::reduce_scatter, Collective::alltoallv, Collective::barrier})
    EXPECT_EQ(collective_from_name(to_string(c)), c);
  EXPECT_EQ(algorithm_from_name("Ring"), std::nullopt);
  EXPECT_EQ(data_type_from_name("float32"), std::nullopt);
  EXPECT_EQ(collective_from_name(""), std::nullopt);
}

// launcher(): what init() reads the job from, and init()'s errors for a malformed environment.
TEST(PublicView, LauncherIsWhatInitFinds) {
  const char* names[] = {"TUTTI_RANK", "TUTTI_SIZE"};
  std::vector<std::optional<std::string>> saved;
  for (const char* name : names) {
    const char* value = std::getenv(name);
    saved.push_back(value ? std::optional<std::string>(value) : std::nullopt);
  }
  ::setenv("TUTTI_RANK", "0", 1);
  ::setenv("TUTTI_SIZE", "1", 1);
  EXPECT_EQ(launcher(), "tutti-run");
  ::setenv("TUTTI_RANK", "zero", 1);
  expect_error([] { (void)launcher(); }, ErrorCode::invalid_argument, "TUTTI_RANK");
  for (std::size_t i = 0; i < saved.size(); ++i) {
    if (saved[i])
      ::setenv(names[i], saved[i]->c_str(), 1);
    else
      ::unsetenv(names[i]);
  }
}

}  // namespace
}  // namespace tutti::testing
