// Algorithm::hierarchical for allreduce, with ranks as threads that each claim a host
// (comm::set_host_for_testing): one, two and three emulated hosts, with equal and unequal
// ranks per host, every ReduceOp on i32 and f32, in place and out of place, counts around the
// local size; and the topology that decides it.
#include <numeric>

#include "comm/access.hpp"
#include "comm/comm_impl.hpp"
#include "comm/topology.hpp"
#include "harness.hpp"
#include "test_waits.hpp"
#include "tutti/topology.hpp"

namespace tutti::testing {
namespace {

using comm::Topology;

// A placement of p ranks on hosts: the host name of each rank.
using Layout = std::vector<std::string>;

std::vector<Layout> layouts_for(int p) {
  std::vector<Layout> out;
  auto make = [&](auto host_of) {
    Layout layout;
    for (int r = 0; r < p; ++r) layout.push_back("host" + std::to_string(host_of(r)));
    out.push_back(layout);
  };
  make([](int) { return 0; });                     // one host
  make([&](int r) { return r < p / 2 ? 0 : 1; });  // two hosts, blocks (unequal when p is odd)
  make([](int r) { return r % 2; });               // two hosts, interleaved
  if (p >= 3) {
    make([](int r) { return r % 3; });              // three hosts (unequal unless 3 divides p)
    make([](int r) { return r == 0 ? 0 : 1; });     // one lone rank, the rest together
    make([](int r) { return r < 2 ? 0 : r - 1; });  // two ranks on one host, the others alone
  }
  return out;
}

double load(DataType type, const std::byte* data, std::size_t i) {
  if (type == DataType::i32) {
    std::int32_t v;
    std::memcpy(&v, data + 4 * i, 4);
    return v;
  }
  float v;
  std::memcpy(&v, data + 4 * i, 4);
  return v;
}

// One rank's part of one hierarchical allreduce; returns "" or what went wrong.
std::string check_one(Communicator& comm, DataType type, ReduceOp op, std::size_t count, bool in_place) {
  const std::size_t elem = size_of(type);
  std::vector<std::byte> send(count * elem), recv(count * elem, std::byte{poison});
  for (std::size_t i = 0; i < count; ++i) store(type, send.data() + i * elem, input_value(type, op, comm.rank(), i));
  std::byte* out = in_place ? send.data() : recv.data();
  comm.allreduce(send.data(), out, count, type, op, {Algorithm::hierarchical, test_timeout});
  std::size_t wrong = 0, first = 0;
  for (std::size_t i = 0; i < count; ++i)
    if (load(type, out, i) != reference_reduction(type, op, comm.size(), i) && wrong++ == 0) first = i;
  if (wrong == 0) return "";
  return std::string(to_string(type)) + " " + std::string(to_string(op)) + " count " + std::to_string(count) +
         (in_place ? " in place" : " out of place") + ": " + std::to_string(wrong) + " wrong elements, first [" +
         std::to_string(first) + "] = " + std::to_string(load(type, out, first)) + ", expected " +
         std::to_string(reference_reduction(type, op, comm.size(), first));
}

std::string describe(const Layout& layout) {
  std::string s;
  for (const auto& host : layout) s += (s.empty() ? "" : ",") + host;
  return s;
}

class HierarchicalSweep : public ::testing::TestWithParam<int> {};

TEST_P(HierarchicalSweep, EveryLayoutOpTypeCountAndPlace) {
  const int p = GetParam();
  const auto up = static_cast<std::size_t>(p);
  for (const Layout& layout : layouts_for(p)) {
    const std::string failures = run_ranks(p, [&](Communicator& comm) {
      comm::set_host_for_testing(comm, layout[static_cast<std::size_t>(comm.rank())]);
      for (std::size_t count : {std::size_t{0}, std::size_t{1}, up - 1, up + 1, std::size_t{1000}, std::size_t{100003}})
        for (DataType type : {DataType::i32, DataType::f32})
          for (ReduceOp op : {ReduceOp::sum, ReduceOp::prod, ReduceOp::min, ReduceOp::max, ReduceOp::avg})
            for (bool in_place : {false, true}) {
              const std::string error = check_one(comm, type, op, count, in_place);
              if (!error.empty()) throw std::runtime_error(error);
            }
    });
    EXPECT_EQ(failures, "") << "hosts " << describe(layout);
  }
}

INSTANTIATE_TEST_SUITE_P(P, HierarchicalSweep, ::testing::Range(2, 9));

// Hierarchical runs on the caller's thread; operations before and after it on the same
// communicator, nonblocking ones included, still complete in order with the right results.
TEST(Hierarchical, InterleavesWithOtherOperations) {
  const std::string failures = run_ranks(5, [](Communicator& comm) {
    comm::set_host_for_testing(comm, comm.rank() < 3 ? "a" : "b");
    const Options ring{Algorithm::ring, test_timeout}, hierarchical{Algorithm::hierarchical, test_timeout};
    std::vector<std::int32_t> a(1000, comm.rank() + 1), b(1000, 2 * comm.rank()), c(10, 1);
    Request first = comm.iallreduce(a.data(), a.data(), a.size(), DataType::i32, ReduceOp::sum, ring);
    Request second = comm.iallreduce(b.data(), b.data(), b.size(), DataType::i32, ReduceOp::sum, hierarchical);
    // Nonblocking: its steps run on the intra- and inter-host communicators while this one goes on.
    Request third = comm.iallreduce(c.data(), c.data(), c.size(), DataType::i32, ReduceOp::max, ring);
    third.wait();  // issue order: first and second are complete too
    EXPECT_TRUE(first.test());
    EXPECT_TRUE(second.test());
    for (auto v : a) ASSERT_EQ(v, 15);
    for (auto v : b) ASSERT_EQ(v, 20);
    for (auto v : c) ASSERT_EQ(v, 1);
    comm.barrier({Algorithm::automatic, test_timeout});
  });
  EXPECT_EQ(failures, "");
}

// A blocking call runs its steps on the calling thread: a step that fails (here: rank 3 stays
// away, so the steps that need it time out) fails the call on the ranks that made it, within its
// timeout, and the communicator with it: every rank's next call on it raises (rank 3's, in the
// failed call's place, with that call's error).
TEST(Hierarchical, AStepThatTimesOutFailsTheCallAndTheCommunicator) {
  const std::string failures = run_ranks(4, [](Communicator& comm) {
    comm::set_host_for_testing(comm, comm.rank() < 2 ? "a" : "b");
    std::vector<float> v(64, 1.0f);
    comm.allreduce(v.data(), v.data(), v.size(), DataType::f32, ReduceOp::sum, {Algorithm::hierarchical, test_timeout});
    for (float x : v) ASSERT_EQ(x, 4.0f);  // (the hierarchy is made)
    if (comm.rank() == 3) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1500));
    } else {
      const auto start = std::chrono::steady_clock::now();
      try {
        comm.allreduce(v.data(), v.data(), v.size(), DataType::f32, ReduceOp::sum,
                       {Algorithm::hierarchical, std::chrono::milliseconds(300)});
        ADD_FAILURE() << "rank " << comm.rank() << ": the allreduce without rank 3 succeeded";
      } catch (const Error& e) {
        EXPECT_EQ(e.code(), ErrorCode::timeout) << "rank " << comm.rank() << ": " << e.what();
      }
      EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
    }
    try {
      comm.barrier({Algorithm::automatic, test_timeout});
      ADD_FAILURE() << "rank " << comm.rank() << ": a call after the failed one succeeded";
    } catch (const Error& e) {
      // Rank 3's barrier is the failed call's place in its sequence: it raises that call's error.
      EXPECT_EQ(e.code(), comm.rank() == 3 ? ErrorCode::timeout : ErrorCode::aborted)
          << "rank " << comm.rank() << ": " << e.what();
    }
  });
  EXPECT_EQ(failures, "");
}

// A failure that reaches a rank through the communicator but not through the step it waits in:
// rank 2 (host b, local index 0) stays away; rank 0's step across hosts (with rank 2) times out
// after 300 ms, while rank 1 has finished its own step across hosts (with rank 3) and waits on
// host a for rank 0's half of the allgather, and rank 3 waits on host b for rank 2. Ranks 1 and 3
// gave their call a 60 s timeout, yet both raise rank 0's error within a few seconds: a blocking
// call watches its communicator while it waits in a step and passes the failure to the step's.
TEST(Hierarchical, AFailureOnAnotherHostReachesARankWaitingOnItsOwnHost) {
  const std::string failures = run_ranks(4, [](Communicator& comm) {
    comm::set_host_for_testing(comm, comm.rank() < 2 ? "a" : "b");
    std::vector<float> v(64, 1.0f);
    comm.allreduce(v.data(), v.data(), v.size(), DataType::f32, ReduceOp::sum, {Algorithm::hierarchical, test_timeout});
    for (float x : v) ASSERT_EQ(x, 4.0f);  // (the hierarchy is made)
    if (comm.rank() == 2) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1500));
    } else {
      const auto timeout = comm.rank() == 0 ? std::chrono::milliseconds(300) : test_timeout;
      const auto start = std::chrono::steady_clock::now();
      try {
        comm.allreduce(v.data(), v.data(), v.size(), DataType::f32, ReduceOp::sum, {Algorithm::hierarchical, timeout});
        ADD_FAILURE() << "rank " << comm.rank() << ": the allreduce without rank 2 succeeded";
      } catch (const Error& e) {
        EXPECT_EQ(e.code(), ErrorCode::timeout) << "rank " << comm.rank() << ": " << e.what();
        EXPECT_NE(std::string(e.what()).find("timed out"), std::string::npos)
            << "rank " << comm.rank() << ": " << e.what();
      }
      EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5)) << "rank " << comm.rank();
    }
    try {
      comm.barrier({Algorithm::automatic, test_timeout});
      ADD_FAILURE() << "rank " << comm.rank() << ": a call after the failed one succeeded";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), comm.rank() == 2 ? ErrorCode::timeout : ErrorCode::aborted)
          << "rank " << comm.rank() << ": " << e.what();
    }
  });
  EXPECT_EQ(failures, "");
}

// Once the topology is known and the ranks span hosts with several on one, automatic runs a large
// allreduce hierarchically (nonblocking, like any other choice) and a small one as before.
TEST(Hierarchical, AutomaticChoosesItForLargeCallsAcrossHosts) {
  const std::string failures = run_ranks(4, [](Communicator& comm) {
    auto* impl = comm::Access::impl(comm);
    std::vector<std::string> hosts{"a", "a", "b", "b"};
    std::vector<std::uint64_t> hashed;
    for (const auto& h : hosts) hashed.push_back(comm::hash_host(h));
    comm::set_host_for_testing(comm, hosts[static_cast<std::size_t>(comm.rank())]);
    EXPECT_NE(impl->chosen_algorithm(Collective::allreduce, Algorithm::automatic, 1 << 20), Algorithm::hierarchical);
    impl->set_topology(Topology(hashed));  // what init() does when it learned every rank's host
    EXPECT_EQ(impl->chosen_algorithm(Collective::allreduce, Algorithm::automatic, 1 << 20), Algorithm::hierarchical);
    EXPECT_NE(impl->chosen_algorithm(Collective::allreduce, Algorithm::automatic, 8), Algorithm::hierarchical);
    EXPECT_NE(impl->chosen_algorithm(Collective::allgather, Algorithm::automatic, 1 << 20), Algorithm::hierarchical);
    std::vector<std::int32_t> big((1 << 20) / 4, comm.rank() + 1), small(2, comm.rank());
    Request r = comm.iallreduce(big.data(), big.data(), big.size(), DataType::i32, ReduceOp::sum,
                                {Algorithm::automatic, test_timeout});
    comm.allreduce(small.data(), small.data(), small.size(), DataType::i32, ReduceOp::max,
                   {Algorithm::automatic, test_timeout});
    EXPECT_TRUE(r.test());  // issue order: complete once the later call is
    for (auto v : big) ASSERT_EQ(v, 10);
    for (auto v : small) ASSERT_EQ(v, 3);
  });
  EXPECT_EQ(failures, "");
}

// A communicator split from one with known hosts inherits them: hierarchical works on it.
TEST(Hierarchical, OnASplitCommunicator) {
  const std::string failures = run_ranks(7, [](Communicator& comm) {
    comm::set_host_for_testing(comm, "h" + std::to_string(comm.rank() % 2));
    Communicator part = comm.split(comm.rank() % 3 == 0 ? -1 : 0, comm.rank());
    if (part.size() == 0) return;
    ASSERT_EQ(part.size(), 4);  // ranks 1, 2, 4, 5: hosts h1, h0, h0, h1
    std::vector<float> v(4097, static_cast<float>(part.rank() + 1));
    part.allreduce(std::span<float>(v), ReduceOp::sum, {Algorithm::hierarchical, test_timeout});
    for (float x : v) ASSERT_EQ(x, 10.0f);
  });
  EXPECT_EQ(failures, "");
}

TEST(Hierarchical, OtherCollectivesAreUnsupported) {
  const std::string failures = run_ranks(2, [](Communicator& comm) {
    std::vector<float> a(4, 1.0f), b(2);
    const Options o{Algorithm::hierarchical, test_timeout};
    try {
      comm.reduce_scatter(a.data(), b.data(), 2, DataType::f32, ReduceOp::sum, o);
      ADD_FAILURE() << "reduce_scatter with hierarchical did not throw";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::unsupported);
      const std::string what = e.what();
      for (const char* needle : {"reduce_scatter", "hierarchical", "allreduce only", "ring", "rabenseifner"})
        EXPECT_NE(what.find(needle), std::string::npos) << what;
    }
    try {
      comm.broadcast(a.data(), 4, DataType::f32, 0, o);
      ADD_FAILURE() << "broadcast with hierarchical did not throw";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::unsupported);
    }
    // Nothing was sent: the communicator still works.
    float one = 1, sum = 0;
    comm.allreduce(&one, &sum, 1, DataType::f32, ReduceOp::sum, {Algorithm::automatic, test_timeout});
    EXPECT_EQ(sum, 2.0f);
  });
  EXPECT_EQ(failures, "");
}

std::vector<std::uint64_t> hashes(std::initializer_list<const char*> hosts) {
  std::vector<std::uint64_t> out;
  for (const char* h : hosts) out.push_back(comm::hash_host(h));
  return out;
}

TEST(Topology, HostsAndLocalIndices) {
  const Topology t(hashes({"b", "a", "b", "c", "a", "b"}));
  EXPECT_EQ(t.size(), 6);
  EXPECT_EQ(t.host_count(), 3);
  EXPECT_EQ(t.host_index(0), 0);  // hosts in order of their lowest rank: b, a, c
  EXPECT_EQ(t.host_index(1), 1);
  EXPECT_EQ(t.host_index(3), 2);
  EXPECT_EQ(t.local_index(5), 2);
  EXPECT_EQ(t.local_index(4), 1);
  EXPECT_EQ(t.local_size(0), 3);
  EXPECT_EQ(t.local_size(3), 1);
  EXPECT_EQ(t.max_local_size(), 3);
  EXPECT_FALSE(t.uniform());
  const std::vector<int> ranks{4, 1, 3};
  const Topology sub = t.subset(ranks);  // a, a, c
  EXPECT_EQ(sub.host_count(), 2);
  EXPECT_EQ(sub.local_index(1), 1);
  EXPECT_EQ(sub.host_index(2), 1);
  EXPECT_TRUE(Topology(hashes({"x", "y", "y", "x"})).uniform());
  EXPECT_NE(comm::hash_host("node1"), comm::hash_host("node2"));
}

// The cost model prices the hosts' links where the ranks lie in blocks of equal size on two or more
// hosts, with two or more ranks on each; other layouts keep the size rule.
TEST(Topology, RanksInBlocksOnHosts) {
  EXPECT_EQ(Topology(hashes({"x", "x", "y", "y"})).blocked_ranks_per_host(), 2);
  EXPECT_EQ(Topology(hashes({"x", "x", "x", "y", "y", "y"})).blocked_ranks_per_host(), 3);
  EXPECT_EQ(Topology(hashes({"x", "y", "x", "y"})).blocked_ranks_per_host(), 0);  // round robin
  EXPECT_EQ(Topology(hashes({"x", "x", "y"})).blocked_ranks_per_host(), 0);       // unequal
  EXPECT_EQ(Topology(hashes({"x", "y", "z"})).blocked_ranks_per_host(), 0);       // one rank a host
  EXPECT_EQ(Topology(hashes({"x", "x", "x"})).blocked_ranks_per_host(), 0);       // one host
}

// The public face of the topology: every rank sees the same hosts, numbered by their lowest rank,
// and its own place among its host's ranks; a split communicator keeps its ranks' hosts.
TEST(Topology, HostLayoutOfEveryRank) {
  const std::vector<std::string> hosts{"b", "a", "b", "c", "a", "b"};
  const std::string failures = run_ranks(6, [&](Communicator& comm) {
    comm::set_host_for_testing(comm, hosts[static_cast<std::size_t>(comm.rank())]);
    const HostLayout layout = host_layout(comm);
    const std::vector<int> host_of_rank{0, 1, 0, 2, 1, 0};
    const int local_rank[] = {0, 0, 1, 0, 1, 2};
    const int local_size[] = {3, 2, 3, 1, 2, 3};
    const int r = comm.rank();
    if (layout.host_count != 3 || layout.host_of_rank != host_of_rank ||
        layout.host != host_of_rank[static_cast<std::size_t>(r)] || layout.local_rank != local_rank[r] ||
        layout.local_size != local_size[r])
      throw std::runtime_error("rank " + std::to_string(r) + ": host " + std::to_string(layout.host) + ", local " +
                               std::to_string(layout.local_rank) + " of " + std::to_string(layout.local_size));
    Communicator odd = comm.split(r % 2, r);  // ranks 1, 3, 5 on a, c, b
    if (r % 2 == 1) {
      const HostLayout sub = host_layout(odd);
      if (sub.host_count != 3 || sub.local_size != 1 || sub.host_of_rank != std::vector<int>{0, 1, 2})
        throw std::runtime_error("rank " + std::to_string(r) + ": the split's layout is wrong");
    }
  });
  EXPECT_EQ(failures, "");
  EXPECT_EQ(error_code_of([] { (void)host_layout(comm::Access::make(std::shared_ptr<comm::CommImpl>{})); }),
            ErrorCode::invalid_argument);
}

TEST(Topology, AutomaticChoiceNeedsSeveralHostsSharedHostsAndLargeMessages) {
  const Topology spread(hashes({"a", "a", "b", "b"})), one_host(hashes({"a", "a"})), one_each(hashes({"a", "b"}));
  EXPECT_TRUE(comm::prefers_hierarchical(spread, 64 * 1024));
  EXPECT_FALSE(comm::prefers_hierarchical(spread, 64 * 1024 - 1));
  EXPECT_FALSE(comm::prefers_hierarchical(one_host, 1 << 24));
  EXPECT_FALSE(comm::prefers_hierarchical(one_each, 1 << 24));
}

// TUTTI_HOST names this process's host for topology.
TEST(Topology, HostNameFromTheEnvironment) {
  ::setenv("TUTTI_HOST", "emulated-7", 1);
  EXPECT_EQ(comm::topology_host_name(), "emulated-7");
  ::unsetenv("TUTTI_HOST");
  EXPECT_FALSE(comm::topology_host_name().empty());
}

}  // namespace
}  // namespace tutti::testing
