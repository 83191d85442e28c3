// Tutti over MPI, under mpirun (label `mpi`, run with 1 to 4 processes). Every result is compared,
// element by element, with MPI's own collective on the same inputs (out of place, into a
// separate buffer): Tutti's schedules over the MPI transport with every algorithm, and
// mpi_collective (Algorithm::mpi) in every in-place form, type and op. A failure on any rank fails
// the test on every rank (and mpirun's exit status); rank 0 prints every rank's messages.
//
// The case machinery and MPI's reference are in mpi_cases.hpp, the fault tests in mpi_fault_test.cpp.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

#include "comm/access.hpp"
#include "comm/comm_impl.hpp"
#include "mpi_cases.hpp"
#include "transport/inproc/inproc.hpp"
#include "transport/mpi/mpi_collective.hpp"
#include "transport/mpi/mpi_transport.hpp"
#include "tutti/engine.hpp"
#include "tutti/mpi.hpp"

namespace tutti::testing {
namespace {

using namespace std::chrono_literals;
using transport::mpi::MpiTransport;

void call_tutti(Communicator& comm, const Case& c, const void* send, void* recv, const Layout& l) {
  const Options o{c.algorithm, std::chrono::milliseconds(60000)};
  const DataType t = c.type;
  switch (c.collective) {
    case Collective::allreduce:
      return comm.allreduce(send, recv, c.count, t, c.op, o);
    case Collective::reduce:
      return comm.reduce(send, recv, c.count, t, c.op, c.root, o);
    case Collective::reduce_scatter:
      return comm.reduce_scatter(send, recv, c.count, t, c.op, o);
    case Collective::allgather:
      return comm.allgather(send, recv, c.count, t, o);
    case Collective::allgatherv:
      return comm.allgatherv(send, l.counts[l.rank], recv, l.counts, t, o);
    case Collective::broadcast:
      return comm.broadcast(recv, c.count, t, c.root, o);
    case Collective::alltoall:
      return comm.alltoall(send, recv, c.count, t, o);
    case Collective::alltoallv:
      return comm.alltoallv(send, l.send_counts, recv, l.recv_counts, t, o);
    case Collective::gather:
      return comm.gather(send, recv, c.count, t, c.root, o);
    case Collective::scatter:
      return comm.scatter(send, recv, c.count, t, c.root, o);
    case Collective::barrier:
      return comm.barrier(o);
  }
}

// ---- the sweeps ----

// Every collective x algorithm x count x in-place form x root; movement cycles through element
// sizes 1, 2, 4, 8; reductions use i32 sum and f32 max (types x ops have their own sweep).
std::vector<Case> sweep(int p, const std::vector<std::size_t>& counts, bool with_algorithms) {
  constexpr DataType movement_types[] = {DataType::u8, DataType::bf16, DataType::f32, DataType::i64};
  std::vector<Case> out;
  std::vector<Collective> collectives = data_collectives;
  collectives.push_back(Collective::barrier);
  for (Collective coll : collectives) {
    auto algorithms = with_algorithms ? schedule::algorithms_for(coll) : std::vector<Algorithm>{Algorithm::mpi};
    if (with_algorithms) algorithms.push_back(Algorithm::automatic);
    for (Algorithm a : algorithms)
      for (std::size_t k = 0; k < counts.size(); ++k)
        for (int place : places_of(coll))
          for (int root : is_rooted(coll) ? std::vector<int>{0, p - 1} : std::vector<int>{-1}) {
            if (coll == Collective::barrier && k > 0) continue;
            Case c{coll,          a,    movement_types[(k + static_cast<std::size_t>(place)) % 4],
                   ReduceOp::sum, p,    counts[k],
                   place,         root, false};
            if (is_reduction(coll)) c.type = k % 2 ? DataType::f32 : DataType::i32, c.op = k % 2 ? ReduceOp::max : c.op;
            out.push_back(c);
          }
  }
  return out;
}

std::vector<Case> tutti_cases(int p) {
  const auto n = static_cast<std::size_t>(p);
  return sweep(p, {0, 1, n + 1, 1031, 70001}, true);
}

std::vector<Case> mpi_cases(int p) {
  const auto n = static_cast<std::size_t>(p);
  return sweep(p, {0, 1, n + 1, 1031}, false);
}

std::vector<Case> split_cases(int p) { return sweep(p, {1, 67}, true); }

// Every type x op of the reductions, every algorithm (Tutti) or every in-place form (MPI).
std::vector<Case> type_cases(int p, bool tutti) {
  std::vector<Case> out;
  for (Collective coll : {Collective::allreduce, Collective::reduce, Collective::reduce_scatter}) {
    const auto algorithms = tutti ? schedule::algorithms_for(coll) : std::vector<Algorithm>{Algorithm::mpi};
    for (Algorithm a : algorithms)
      for (DataType t : all_types)
        for (ReduceOp op : all_ops)
          for (int place : tutti ? std::vector<int>{0} : places_of(coll))
            out.push_back(Case{coll, a, t, op, p, 67, place, p - 1, false});
  }
  return out;
}

void run_all(MPI_Comm comm, const std::vector<Case>& cases, const Subject& subject) {
  std::string errors;
  for (const Case& c : cases) {
    std::string error;
    try {
      error = run_case(c, comm, subject);
    } catch (const std::exception& e) {
      error = name_of(c) + ": threw " + e.what();
    }
    if (!error.empty()) errors += "rank " + std::to_string(comm_rank(comm)) + ": " + error + "\n";
    const int bad = error.empty() ? 0 : 1;
    int any = 0;
    MPI_Allreduce(&bad, &any, 1, MPI_INT, MPI_MAX, comm);
    if (any) break;
  }
  expect_all_ranks_ok(comm, errors);
}

Subject tutti_subject(Communicator& comm) {
  return [&comm](const Case& c, const void* send, void* recv, const Layout& l) { call_tutti(comm, c, send, recv, l); };
}

Subject mpi_subject(MpiTransport& transport) {
  return [&transport](const Case& c, const void* send, void* recv, const Layout& l) {
    const bool reduction = is_reduction(c.collective);
    const std::size_t count = c.collective == Collective::allgatherv ? l.counts[l.rank] : c.count;
    const std::span<const std::size_t> counts =
        c.collective == Collective::alltoallv ? std::span<const std::size_t>(l.send_counts) : l.counts;
    const bool ran =
        transport::mpi_collective(transport, c.collective, send, recv, count, c.type,
                                  reduction ? std::optional(c.op) : std::nullopt, c.root, counts, l.recv_counts);
    if (!ran) throw std::runtime_error("mpi_collective refused an MpiTransport");
  };
}

TEST(FromMpi, RankAndSizeAreMpis) {
  Communicator world = from_mpi(MPI_COMM_WORLD);
  EXPECT_EQ(world.rank(), comm_rank(MPI_COMM_WORLD));
  EXPECT_EQ(world.size(), comm_size(MPI_COMM_WORLD));
  EXPECT_THROW(from_mpi(MPI_COMM_NULL), Error);
}

// The public MPI mapping (<tutti/mpi.hpp>): MPI's own Allreduce with mpi_datatype and mpi_op gives
// the exact reduction for every type (f16 and bf16 through Tutti's own MPI types and ops) and
// every element-wise op.
TEST(FromMpi, TypeAndOpMappingReduceExactlyInMpi) {
  const int rank = comm_rank(MPI_COMM_WORLD), size = comm_size(MPI_COMM_WORLD);
  constexpr std::size_t count = 257;
  for (DataType type : {DataType::i8, DataType::u8, DataType::i32, DataType::u32, DataType::i64, DataType::u64,
                        DataType::f16, DataType::bf16, DataType::f32, DataType::f64}) {
    const std::size_t es = size_of(type);
    for (ReduceOp op : {ReduceOp::sum, ReduceOp::prod, ReduceOp::min, ReduceOp::max}) {
      std::vector<std::byte> send(count * es), recv(count * es, std::byte{poison});
      for (std::size_t i = 0; i < count; ++i) store(type, send.data() + i * es, input_value(type, op, rank, i));
      ASSERT_EQ(MPI_Allreduce(send.data(), recv.data(), static_cast<int>(count), mpi_datatype(type), mpi_op(op, type),
                              MPI_COMM_WORLD),
                MPI_SUCCESS);
      for (std::size_t i = 0; i < count; ++i)
        ASSERT_EQ(load(type, recv.data() + i * es), reference_reduction(type, op, size, i))
            << to_string(type) << " " << to_string(op) << " at " << i;
    }
  }
}

// Below MPI_THREAD_SERIALIZED (plain MPI_Init) Tutti calls MPI only on the caller's thread: the
// progress engine leaves the communicator alone, nonblocking calls complete in wait(), and the
// training engine (whose thread would call MPI) is refused on every rank.
TEST(FromMpi, ThreadLevelDecidesWhoProgresses) {
  int level = 0;
  MPI_Query_thread(&level);
  Communicator world = from_mpi(MPI_COMM_WORLD);
  const bool caller_only = level < MPI_THREAD_SERIALIZED;
  EXPECT_EQ(tutti::comm::Access::impl(world)->progressed_by_caller_only(), caller_only);
  std::vector<std::int64_t> a(1000, world.rank() + 1), b(7, 2 * world.rank());
  Request first = world.iallreduce(a.data(), a.data(), a.size(), DataType::i64, ReduceOp::sum);
  Request second = world.iallreduce(b.data(), b.data(), b.size(), DataType::i64, ReduceOp::max);
  second.wait();
  EXPECT_TRUE(first.test());
  const std::int64_t p = world.size();
  for (auto v : a) ASSERT_EQ(v, p * (p + 1) / 2);
  for (auto v : b) ASSERT_EQ(v, 2 * (p - 1));
  if (caller_only) {
    try {
      Engine engine(world);
      ADD_FAILURE() << "the engine accepted a communicator MPI may not be called on from its thread";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::unsupported) << e.what();
    }
  }
}

// Under plain mpirun (no TUTTI_STORE) init() bootstraps through MPI and connects the ranks of one
// host through shared memory; TUTTI_TRANSPORT=mpi keeps them on MPI.
TEST(Init, UnderMpirunOneHostRunsOverSharedMemory) {
  ASSERT_EQ(std::getenv("TUTTI_STORE"), nullptr);
  Communicator world = init();
  EXPECT_EQ(tutti::comm::Access::impl(world)->transport_name(), "shm");
  EXPECT_EQ(world.rank(), comm_rank(MPI_COMM_WORLD));
  std::vector<std::int32_t> v(100, world.rank() + 1);
  world.allreduce(std::span<std::int32_t>(v), ReduceOp::sum);
  const int p = world.size();
  for (auto x : v) ASSERT_EQ(x, p * (p + 1) / 2);
  ::setenv("TUTTI_TRANSPORT", "mpi", 1);
  Communicator over_mpi = init();
  ::unsetenv("TUTTI_TRANSPORT");
  EXPECT_EQ(tutti::comm::Access::impl(over_mpi)->transport_name(), "mpi");
  over_mpi.allreduce(std::span<std::int32_t>(v), ReduceOp::sum);
  for (auto x : v) ASSERT_EQ(x, p * p * (p + 1) / 2);
}

// A launcher that gives no job id (MPICH's PMI_* has none; here Open MPI's id is hidden): under
// MPI's own bootstrap rank 0 draws one for every rank, and the job runs.
TEST(Init, UnderMpirunWithoutAJobIdRankZeroDrawsOne) {
  ASSERT_EQ(std::getenv("TUTTI_STORE"), nullptr);
  std::vector<std::pair<std::string, std::string>> hidden;
  for (const char* name : {"OMPI_MCA_ess_base_jobid", "PMIX_NAMESPACE", "TUTTI_JOB_ID"})
    if (const char* value = std::getenv(name)) {
      hidden.emplace_back(name, value);
      ::unsetenv(name);
    }
  Communicator world = init();
  for (const auto& [name, value] : hidden) ::setenv(name.c_str(), value.c_str(), 1);
  std::vector<std::int32_t> v(100, world.rank() + 1);
  world.allreduce(std::span<std::int32_t>(v), ReduceOp::sum);
  const int p = world.size();
  for (auto x : v) ASSERT_EQ(x, p * (p + 1) / 2);
}

// Ranks on several hosts (emulated: TUTTI_HOST names two, a rank's parity) under plain mpirun:
// rank 0 serves the store, with a token of its own, to ranks it names it to through MPI; ranks of
// one host connect through shared memory, of different hosts through TCP (hosts of one rank each:
// TCP alone).
TEST(Init, UnderMpirunSeveralHostsRunsOverSharedMemoryAndTcp) {
  ASSERT_EQ(std::getenv("TUTTI_STORE"), nullptr);
  ASSERT_EQ(std::getenv("TUTTI_TOKEN"), nullptr);
  const int p = comm_size(MPI_COMM_WORLD), r = comm_rank(MPI_COMM_WORLD);
  if (p < 2) GTEST_SKIP() << "one rank is one host";
  ::setenv("TUTTI_HOST", ("host" + std::to_string(r % 2)).c_str(), 1);
  Communicator world = init();
  ::unsetenv("TUTTI_HOST");
  EXPECT_EQ(tutti::comm::Access::impl(world)->transport_name(), p == 2 ? "tcp" : "shm+tcp");
  EXPECT_EQ(world.rank(), r);
  std::vector<std::int64_t> v(100003, world.rank() + 1);
  world.allreduce(std::span<std::int64_t>(v), ReduceOp::sum);
  for (auto x : v) ASSERT_EQ(x, p * (p + 1) / 2);
  std::vector<std::int64_t> all(static_cast<std::size_t>(p) * 5);
  std::vector<std::int64_t> mine(5, 10 * r);
  world.allgather(std::span<const std::int64_t>(mine), std::span<std::int64_t>(all));
  for (int q = 0; q < p; ++q)
    for (int i = 0; i < 5; ++i) ASSERT_EQ(all[static_cast<std::size_t>(q * 5 + i)], 10 * q);
}

// Rank 0 names the store and the token to the others through MPI: a token of any length (here
// 3000 characters, longer than any fixed message would hold) arrives whole, or the others could
// not pass the store's handshake.
TEST(Init, UnderMpirunALongTokenArrivesWhole) {
  ASSERT_EQ(std::getenv("TUTTI_STORE"), nullptr);
  ASSERT_EQ(std::getenv("TUTTI_TOKEN"), nullptr);
  std::string token;
  for (int i = 0; i < 3000; ++i) token += "0123456789abcdef"[(i * 7) % 16];
  ::setenv("TUTTI_TOKEN", token.c_str(), 1);
  Communicator world = init();
  ::unsetenv("TUTTI_TOKEN");
  const int p = world.size();
  std::vector<std::int32_t> v(1000, world.rank() + 1);
  world.allreduce(std::span<std::int32_t>(v), ReduceOp::sum);
  for (auto x : v) ASSERT_EQ(x, p * (p + 1) / 2);
}

TEST(TuttiOverMpi, EveryCollectiveAndAlgorithmMatchesMpi) {
  Communicator world = from_mpi(MPI_COMM_WORLD);
  run_all(MPI_COMM_WORLD, tutti_cases(world.size()), tutti_subject(world));
}

TEST(TuttiOverMpi, EveryTypeAndOpMatchesMpi) {
  Communicator world = from_mpi(MPI_COMM_WORLD);
  run_all(MPI_COMM_WORLD, type_cases(world.size(), true), tutti_subject(world));
}

TEST(TuttiOverMpi, OverlappingNonblockingCollectives) {
  Communicator world = from_mpi(MPI_COMM_WORLD);
  const int p = world.size();
  const std::size_t n = 4099;
  std::vector<std::vector<std::int32_t>> data, expected;
  std::vector<Request> requests;
  const Algorithm algorithms[] = {Algorithm::ring, Algorithm::recursive_doubling, Algorithm::rabenseifner,
                                  Algorithm::binomial_tree};
  for (int k = 0; k < 12; ++k) {
    std::vector<std::int32_t> mine(n);
    for (std::size_t i = 0; i < n; ++i) mine[i] = static_cast<std::int32_t>(i * 31 + 7 * k) - world.rank();
    expected.emplace_back(n);
    MPI_Allreduce(mine.data(), expected.back().data(), static_cast<int>(n), MPI_INT32_T, MPI_SUM, MPI_COMM_WORLD);
    data.push_back(std::move(mine));
  }
  std::string errors;
  try {
    for (std::size_t k = 0; k < data.size(); ++k)
      requests.push_back(world.iallreduce(data[k].data(), data[k].data(), n, DataType::i32, ReduceOp::sum,
                                          {algorithms[k % 4], std::chrono::milliseconds(60000)}));
    for (Request& r : requests) r.wait();
    for (std::size_t k = 0; k < data.size(); ++k)
      if (data[k] != expected[k]) errors += "iallreduce #" + std::to_string(k) + " differs from MPI_Allreduce\n";
  } catch (const std::exception& e) {
    errors += std::string("threw ") + e.what() + "\n";
  }
  expect_all_ranks_ok(MPI_COMM_WORLD, errors.empty() ? "" : "rank " + std::to_string(world.rank()) + ": " + errors);
  (void)p;
}

TEST(TuttiOverMpi, SendRecvByTagInOrder) {
  Communicator world = from_mpi(MPI_COMM_WORLD);
  const int p = world.size(), me = world.rank();
  const int next = (me + 1) % p, prev = (me + p - 1) % p;
  // Tag 7 is sent first but received last; the three tag-5 messages must arrive in order.
  const std::size_t sizes[] = {0, 3, 100000};
  std::vector<std::vector<std::int32_t>> out, in;
  for (int k = 0; k < 4; ++k) {
    const std::size_t n = k < 3 ? sizes[k] : 17;
    out.emplace_back(n);
    for (std::size_t i = 0; i < n; ++i) out.back()[i] = static_cast<std::int32_t>(me * 1000000 + k * 100000 + i);
    in.emplace_back(n, -1);
  }
  std::string errors;
  try {
    std::vector<Request> requests;
    requests.push_back(world.isend(out[3].data(), out[3].size(), DataType::i32, next, 7));
    for (int k = 0; k < 3; ++k) requests.push_back(world.isend(out[k].data(), out[k].size(), DataType::i32, next, 5));
    for (int k = 0; k < 3; ++k) requests.push_back(world.irecv(in[k].data(), in[k].size(), DataType::i32, prev, 5));
    requests.push_back(world.irecv(in[3].data(), in[3].size(), DataType::i32, prev, 7));
    for (Request& r : requests) r.wait();
    for (int k = 0; k < 4; ++k)
      for (std::size_t i = 0; i < in[k].size(); ++i)
        if (in[k][i] != static_cast<std::int32_t>(prev * 1000000 + k * 100000 + i)) {
          errors += "rank " + std::to_string(me) + ": message " + std::to_string(k) + " element " + std::to_string(i) +
                    " is wrong\n";
          break;
        }
  } catch (const std::exception& e) {
    errors += "rank " + std::to_string(me) + ": threw " + e.what() + "\n";
  }
  expect_all_ranks_ok(MPI_COMM_WORLD, errors);
}

TEST(TuttiOverMpi, SizeMismatchFailsTheReceiver) {
  if (comm_size(MPI_COMM_WORLD) < 2) GTEST_SKIP() << "needs 2 ranks";
  const int me = comm_rank(MPI_COMM_WORLD);
  std::string errors;
  for (const auto& [sent, expected] : {std::pair<std::size_t, std::size_t>{8, 4}, {4, 8}}) {
    Communicator world = from_mpi(MPI_COMM_WORLD);  // fresh: the failure aborts rank 1's communicator
    std::vector<std::int32_t> buffer(8, 1);
    try {
      if (me == 0) world.send(buffer.data(), sent, DataType::i32, 1, 3);
      if (me == 1) {
        world.recv(buffer.data(), expected, DataType::i32, 0, 3);
        errors += "rank 1: a " + std::to_string(expected) + "-element recv of " + std::to_string(sent) +
                  " elements succeeded\n";
      }
    } catch (const Error& e) {
      if (me != 1 || std::string(e.what()).find("message size mismatch") == std::string::npos)
        errors += "rank " + std::to_string(me) + ": unexpected error: " + e.what() + "\n";
    }
    MPI_Barrier(MPI_COMM_WORLD);
  }
  expect_all_ranks_ok(MPI_COMM_WORLD, errors);
}

TEST(MpiCollective, EveryCollectiveAndInPlaceFormMatchesMpi) {
  MpiTransport transport(MPI_COMM_WORLD);
  run_all(MPI_COMM_WORLD, mpi_cases(transport.size()), mpi_subject(transport));
}

TEST(MpiCollective, EveryTypeAndOpMatchesMpi) {
  MpiTransport transport(MPI_COMM_WORLD);
  run_all(MPI_COMM_WORLD, type_cases(transport.size(), false), mpi_subject(transport));
}

TEST(MpiCollective, RefusesOtherTransportsAndBadArguments) {
  auto group = transport::inproc::make_group(1);
  EXPECT_FALSE(transport::mpi_collective(*group[0], Collective::barrier, nullptr, nullptr, 0, DataType::u8,
                                         std::nullopt, -1, {}, {}));
  MpiTransport transport(MPI_COMM_WORLD);
  EXPECT_THROW(transport::mpi_collective(transport, static_cast<Collective>(99), nullptr, nullptr, 0, DataType::u8,
                                         std::nullopt, -1, {}, {}),
               Error);
  try {
    transport::mpi_collective(transport, Collective::allreduce, nullptr, nullptr, std::size_t{1} << 31, DataType::f32,
                              ReduceOp::sum, -1, {}, {});
    ADD_FAILURE() << "a count over INT_MAX was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::unsupported) << e.what();
  }
}

// An abort reaches every rank, through the control communicator: each learns the first error.
TEST(MpiTransportTest, AbortReachesEveryRank) {
  MpiTransport transport(MPI_COMM_WORLD);
  const std::uint64_t before = transport.generation();
  std::string errors;
  if (transport.aborted()) errors += "aborted before any abort; ";
  MPI_Barrier(MPI_COMM_WORLD);
  if (transport.rank() == 0) {
    transport.abort(Error(ErrorCode::timeout, "test"), 42);
    transport.abort(Error(ErrorCode::system, "second"), 43);  // the first error wins
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (!transport.aborted() && std::chrono::steady_clock::now() < deadline)
    transport.wait(transport.generation(), std::min(deadline, std::chrono::steady_clock::now() + 10ms));
  if (auto failure = transport.aborted()) {
    if (failure->seq != 42 || failure->error.code() != ErrorCode::timeout ||
        std::string(failure->error.what()) != "test")
      errors += std::string("got seq ") + std::to_string(failure->seq) + ", " + failure->error.what() + "; ";
  } else {
    errors += "rank 0's abort never arrived; ";
  }
  if (transport.generation() == before) errors += "the abort woke no waiter; ";
  expect_all_ranks_ok(MPI_COMM_WORLD, errors.empty() ? "" : "rank " + std::to_string(transport.rank()) + ": " + errors);
}

// A message over INT_MAX bytes travels as one derived-type element. Needs ~4.3 GB: opt-in.
TEST(MpiTransportTest, MessageOverIntMaxBytes) {
  if (std::getenv("TUTTI_TEST_LARGE") == nullptr) GTEST_SKIP() << "set TUTTI_TEST_LARGE=1 (needs ~4.3 GB per rank)";
  MpiTransport transport(MPI_COMM_WORLD);
  const int me = transport.rank();
  const std::size_t bytes = (std::size_t{1} << 31) + 12345;
  std::vector<std::uint8_t> out(bytes), in(bytes, 0);
  for (std::size_t i = 0; i < bytes; i += 4093) out[i] = static_cast<std::uint8_t>(i / 4093 + 1);
  out.back() = 0x5a;
  transport::Completion sent, received;
  const transport::MessageKey key{transport::Channel::point_to_point, 9, 0};
  transport.post_recv(me, key, in.data(), bytes, &received);
  transport.post_send(me, key, out.data(), bytes, &sent);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while ((sent.state() == transport::Completion::posted || received.state() == transport::Completion::posted) &&
         std::chrono::steady_clock::now() < deadline)
    transport.wait(transport.generation(), deadline);
  EXPECT_EQ(sent.state(), transport::Completion::done) << sent.error;
  ASSERT_EQ(received.state(), transport::Completion::done) << received.error;
  EXPECT_TRUE(in == out);
}

TEST(Split, MatchesMpiCommSplit) {
  Communicator world = from_mpi(MPI_COMM_WORLD);
  const int me = world.rank();
  const int color = me % 2, key = -me;  // reversed order inside each color
  Communicator sub = world.split(color, key);
  MPI_Comm reference = MPI_COMM_NULL;
  MPI_Comm_split(MPI_COMM_WORLD, color, key, &reference);
  std::string errors;
  if (sub.rank() != comm_rank(reference) || sub.size() != comm_size(reference))
    errors = "rank " + std::to_string(me) + ": split gave rank " + std::to_string(sub.rank()) + " of " +
             std::to_string(sub.size()) + ", MPI_Comm_split " + std::to_string(comm_rank(reference)) + " of " +
             std::to_string(comm_size(reference)) + "\n";
  expect_all_ranks_ok(MPI_COMM_WORLD, errors);
  if (errors.empty()) {
    run_all(reference, split_cases(sub.size()), tutti_subject(sub));
    MpiTransport sub_transport(reference);
    run_all(reference, split_cases(sub.size()), mpi_subject(sub_transport));
  }
  Communicator none = world.split(me == 0 ? -1 : 0, 0);  // a negative color: no communicator
  EXPECT_EQ(none.size(), me == 0 ? 0 : world.size() - 1);
  MPI_Comm_free(&reference);
}

class RankFailurePrinter : public ::testing::EmptyTestEventListener {
 public:
  explicit RankFailurePrinter(int rank) : rank_(rank) {}
  void OnTestPartResult(const ::testing::TestPartResult& result) override {
    if (result.failed())
      std::fprintf(stderr, "[rank %d] %s:%d: %s\n", rank_, result.file_name() ? result.file_name() : "?",
                   result.line_number(), result.summary());
  }

 private:
  int rank_;
};

}  // namespace
}  // namespace tutti::testing

int main(int argc, char** argv) {
  // MPI_TEST_THREAD_LEVEL=serialized covers the path where Tutti serializes every MPI call itself;
  // =single, a program that called plain MPI_Init (Tutti then calls MPI only on the caller's thread).
  const std::string level = std::getenv("MPI_TEST_THREAD_LEVEL") ? std::getenv("MPI_TEST_THREAD_LEVEL") : "";
  int provided = 0;
  if (level == "single")
    MPI_Init(&argc, &argv);
  else
    MPI_Init_thread(&argc, &argv, level == "serialized" ? MPI_THREAD_SERIALIZED : MPI_THREAD_MULTIPLE, &provided);
  ::testing::InitGoogleTest(&argc, argv);
  // MPI_TEST_MODE=fault runs the fault tests alone (they leave requests MPI cannot cancel).
  const char* mode = std::getenv("MPI_TEST_MODE");
  const bool fault = mode != nullptr && std::string(mode) == "fault";
  if (GTEST_FLAG_GET(filter) == "*") GTEST_FLAG_SET(filter, fault ? "MpiFault.*" : "-MpiFault.*");
  const int rank = tutti::testing::comm_rank(MPI_COMM_WORLD);
  if (rank != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new tutti::testing::RankFailurePrinter(rank));
  }
  const int result = RUN_ALL_TESTS();
  int worst = 0;
  MPI_Allreduce(&result, &worst, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  MPI_Finalize();
  return worst;
}
