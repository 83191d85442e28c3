// One suite over every transport whose ranks can be threads of one process (inproc, shm, tcp,
// routed: shm within emulated hosts, tcp between them):
// the cases of transport_cases.hpp through the Transport interface, then the same errors and
// splits through a Communicator over each transport. MPI runs the transport cases under mpirun
// (mpi_conformance_test.cpp). Every call has a deadline, and shm leaves no segment behind.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "any_source_cases.hpp"
#include "comm/access.hpp"
#include "comm/comm_impl.hpp"
#include "shm_names.hpp"
#include "tcp_mesh.hpp"
#include "threads.hpp"
#include "transport/inproc/inproc.hpp"
#include "transport/routed/routed.hpp"
#include "transport/shm/segment.hpp"
#include "transport/shm/shm.hpp"
#include "transport/tcp/wire.hpp"
#include "transport_cases.hpp"
#include "tutti/tutti.hpp"

namespace tutti::testing {
namespace {

using namespace std::chrono_literals;
using conformance::Traits;
using transport::Transport;

constexpr std::chrono::milliseconds op_timeout{60000};

// A message of this many i32 is larger than an eager message on every transport (shm 4 KiB, TCP
// 64 KiB): its send completes only once matched, so the sender learns a size mismatch itself.
constexpr std::size_t beyond_eager = 17000;
static_assert(beyond_eager * 4 > transport::shm::eager_bytes && beyond_eager * 4 > transport::tcp::eager_bytes);

// Point-to-point calls take the communicator's default deadline: keep it bounded too.
const bool timeout_set = [] { return ::setenv("TUTTI_TIMEOUT_MS", "60000", 0) == 0; }();

struct InprocGroup {
  static constexpr Traits traits{};
  static Transports make(int p) {
    Transports out;
    for (auto& t : transport::inproc::make_group(p)) out.push_back(std::move(t));
    return out;
  }
  static std::string leftovers() { return {}; }
};

struct ShmGroup {
  static constexpr Traits traits{.eager_bytes = transport::shm::eager_bytes};
  // Ranks attach to one fresh segment, each from its own thread as a process would.
  static Transports make(int p) {
    const std::string name = unique_shm_name();
    Transports out(static_cast<std::size_t>(p));
    std::vector<std::thread> threads;
    for (int r = 0; r < p; ++r)
      threads.emplace_back([&, r] { out[static_cast<std::size_t>(r)] = transport::shm::open(name, r, p, 7, 20s); });
    for (auto& t : threads) t.join();
    return out;
  }
  static std::string leftovers() {
    std::string names;
    for (const std::string& name : shm_leftovers()) names += name + " ";
    return names;
  }
};

struct TcpGroup {
  static constexpr Traits traits{.eager_bytes = transport::tcp::eager_bytes};
  static Transports make(int p) {
    MemoryStore store;
    std::vector<std::string> errors;
    Transports out = connect_ranks(store, p, &errors);
    for (int r = 0; r < p; ++r) EXPECT_EQ(errors[static_cast<std::size_t>(r)], "") << "rank " << r;
    return out;
  }
  static std::string leftovers() { return {}; }
};

// Shared memory among the ranks of a host, TCP between hosts: rank r on host ((r + 1) / 2) % 2
// (0 | 1 2 | 3 4 | 5 ...), so that ranks of one host are not numbered alike on it (and a host
// of one rank has no shared memory at all).
struct RoutedGroup {
  // A send up to the smaller eager limit is eager whichever transport carries it.
  static constexpr Traits traits{
      .splits_alike = false,
      .eager_bytes = std::min<std::size_t>(transport::shm::eager_bytes, transport::tcp::eager_bytes)};
  static int host_of(int r) { return (r + 1) / 2 % 2; }
  static Transports make(int p) {
    MemoryStore store;
    std::vector<std::string> errors;
    Transports remote = connect_ranks(store, p, &errors);
    std::vector<int> hosts, local_rank, local_size(2, 0);
    for (int r = 0; r < p; ++r) {
      hosts.push_back(host_of(r));
      local_rank.push_back(local_size[static_cast<std::size_t>(host_of(r))]++);
    }
    const std::string names[2] = {unique_shm_name(), unique_shm_name()};
    Transports out(static_cast<std::size_t>(p));
    std::vector<std::thread> threads;
    for (int r = 0; r < p; ++r)
      threads.emplace_back([&, r] {
        const auto i = static_cast<std::size_t>(r);
        const int size = local_size[static_cast<std::size_t>(hosts[i])];
        try {
          std::unique_ptr<Transport> local;
          if (size > 1) local = transport::shm::open(names[hosts[i]], local_rank[i], size, 7, 20s);
          out[i] = transport::routed::make(hosts, r, std::move(local), std::move(remote[i]));
        } catch (const std::exception& e) {
          errors[i] = e.what();
        }
      });
    for (auto& t : threads) t.join();
    for (int r = 0; r < p; ++r) EXPECT_EQ(errors[static_cast<std::size_t>(r)], "") << "rank " << r;
    return out;
  }
  static std::string leftovers() { return ShmGroup::leftovers(); }
};

// Runs fn on one thread per rank of a fresh group of p; returns "" or every rank's failures.
template <class Group>
std::string run_case(int p, const std::function<std::string(Transport&)>& fn) {
  Transports transports = Group::make(p);
  std::mutex mutex;
  std::string failures;
  std::vector<std::thread> threads;
  for (int r = 0; r < p; ++r)
    threads.emplace_back([&, r] {
      std::string mine;
      try {
        if (!transports[static_cast<std::size_t>(r)]) throw std::runtime_error("no transport");
        mine = fn(*transports[static_cast<std::size_t>(r)]);
      } catch (const std::exception& e) {
        mine = std::string("threw: ") + e.what() + "\n";
      }
      std::lock_guard lock(mutex);
      if (!mine.empty()) failures += "rank " + std::to_string(r) + ": " + mine;
    });
  for (auto& t : threads) t.join();
  transports.clear();
  EXPECT_EQ(Group::leftovers(), "");
  return failures;
}

template <class Group>
class TransportConformance : public ::testing::Test {};

struct GroupNames {
  template <class Group>
  static std::string GetName(int) {
    if constexpr (std::is_same_v<Group, InprocGroup>) return "inproc";
    if constexpr (std::is_same_v<Group, ShmGroup>) return "shm";
    if constexpr (std::is_same_v<Group, RoutedGroup>) return "routed";
    return "tcp";
  }
};

using Groups = ::testing::Types<InprocGroup, ShmGroup, TcpGroup, RoutedGroup>;
TYPED_TEST_SUITE(TransportConformance, Groups, GroupNames);

constexpr int group_sizes[] = {1, 2, 3, 4};

TYPED_TEST(TransportConformance, ExchangesExactBytesEveryPairBothWays) {
  for (int p : group_sizes) EXPECT_EQ(run_case<TypeParam>(p, conformance::exchange_exact_bytes), "") << "p=" << p;
}

TYPED_TEST(TransportConformance, MatchesDistinctKeysOutOfOrder) {
  for (int p : group_sizes) EXPECT_EQ(run_case<TypeParam>(p, conformance::match_out_of_order), "") << "p=" << p;
}

TYPED_TEST(TransportConformance, EarlyLargeMessagesRoundAfterRoundLandExactly) {
  for (int p : {2, 3})
    EXPECT_EQ(run_case<TypeParam>(p, conformance::early_messages_round_after_round), "") << "p=" << p;
}

TYPED_TEST(TransportConformance, SizeMismatchFailsBothSidesWithOneText) {
  const auto fn = [](Transport& t) { return conformance::size_mismatch(t, TypeParam::traits); };
  for (int p : {2, 3}) EXPECT_EQ(run_case<TypeParam>(p, fn), "") << "p=" << p;
}

TYPED_TEST(TransportConformance, CollectiveMismatchAbortsEveryRankWithOneText) {
  const auto fn = [](Transport& t) { return conformance::collective_mismatch(t, TypeParam::traits); };
  for (int p : {2, 3, 4}) EXPECT_EQ(run_case<TypeParam>(p, fn), "") << "p=" << p;
}

TYPED_TEST(TransportConformance, SplitGivesAnIsolatedSubTransport) {
  const auto fn = [](Transport& t) { return conformance::split_with(t, TypeParam::traits); };
  for (int p : group_sizes) EXPECT_EQ(run_case<TypeParam>(p, fn), "") << "p=" << p;
}

TYPED_TEST(TransportConformance, CancelWithdrawsAPostedReceive) {
  for (int p : group_sizes) EXPECT_EQ(run_case<TypeParam>(p, conformance::cancel_posted_receive), "") << "p=" << p;
}

TYPED_TEST(TransportConformance, AbortWakesAWaiterAndReachesEveryRank) {
  for (int p : group_sizes) EXPECT_EQ(run_case<TypeParam>(p, conformance::abort_reaches_every_rank), "") << "p=" << p;
}

// ---- the same through a Communicator over each transport ----

template <class Group>
std::string run_communicators(int p, const std::function<void(Communicator&)>& fn) {
  Transports transports = Group::make(p);
  std::vector<Communicator> comms;
  for (auto& t : transports) comms.push_back(comm::Access::make(std::make_shared<comm::CommImpl>(std::move(t))));
  const std::string failures = on_threads(p, [&](int r) { fn(comms[static_cast<std::size_t>(r)]); });
  comms.clear();
  EXPECT_EQ(Group::leftovers(), "");
  return failures;
}

// One rank passes another count to a ring allreduce: every rank raises Error(mismatch) naming
// the odd rank and both counts; the communicator is aborted for good (a barrier raises aborted).
TYPED_TEST(TransportConformance, MismatchedAllreduceCountRaisesOnEveryRank) {
  struct Setup {
    int p, odd;
    std::size_t n;
  };
  for (const Setup s : {Setup{2, 1, 100}, Setup{3, 1, 100}, Setup{4, 2, 1000}, Setup{5, 1, 100}}) {
    std::atomic<int> mismatches{0};
    const std::string failures = run_communicators<TypeParam>(s.p, [&](Communicator& comm) {
      std::vector<float> v(s.n, 1.0f);
      const std::size_t n = comm.rank() == s.odd ? s.n - 1 : s.n;
      try {
        comm.allreduce(v.data(), v.data(), n, DataType::f32, ReduceOp::sum, {Algorithm::ring, op_timeout});
        ADD_FAILURE() << "rank " << comm.rank() << ": the mismatched allreduce succeeded";
      } catch (const Error& e) {
        const std::string what = e.what();
        EXPECT_EQ(e.code(), ErrorCode::mismatch) << what;
        if (e.code() == ErrorCode::mismatch && what.find("mismatched collective: rank ") != std::string::npos &&
            what.find("count=" + std::to_string(s.n - 1)) != std::string::npos &&
            what.find("count=" + std::to_string(s.n)) != std::string::npos &&
            what.find("rank " + std::to_string(s.odd)) != std::string::npos)
          mismatches.fetch_add(1);
        else
          ADD_FAILURE() << what;
      }
      try {
        comm.barrier({Algorithm::automatic, op_timeout});
        ADD_FAILURE() << "a barrier after a mismatch succeeded";
      } catch (const Error& e) {
        EXPECT_EQ(e.code(), ErrorCode::aborted) << e.what();
      }
    });
    EXPECT_EQ(failures, "") << "p=" << s.p;
    EXPECT_EQ(mismatches.load(), s.p) << "p=" << s.p;
  }
}

TYPED_TEST(TransportConformance, MismatchedCollectiveKindsRaiseOnEveryRank) {
  std::atomic<int> mismatches{0};
  const std::string failures = run_communicators<TypeParam>(3, [&](Communicator& comm) {
    std::vector<float> data(64, 1.0f);
    try {
      if (comm.rank() == 2)
        comm.broadcast(data.data(), 64, DataType::f32, 0, {Algorithm::automatic, op_timeout});
      else
        comm.allreduce(data.data(), data.data(), 64, DataType::f32, ReduceOp::sum, {Algorithm::automatic, op_timeout});
    } catch (const Error& e) {
      if (e.code() != ErrorCode::mismatch) throw;
      ++mismatches;
    }
  });
  EXPECT_EQ(failures, "");
  EXPECT_EQ(mismatches.load(), 3);
}

// A send and a receive of different sizes: both ranks raise Error(mismatch) with the one text.
TYPED_TEST(TransportConformance, SizeMismatchedSendRecvRaisesOnBothRanks) {
  struct Setup {
    DataType type;
    std::size_t sent, expected;
    int tag;
  };
  // Larger than an eager message, the send raises; a small one, where it is eager, returned, and
  // the sender's next call raises with the receiver's text (it aborted).
  const std::size_t large = beyond_eager;
  for (const Setup s : {Setup{DataType::f32, large, large + 100, 3}, Setup{DataType::i32, large, large - 1, 0},
                        Setup{DataType::i32, 10, 12, 5}}) {
    const std::string want = transport::size_mismatch(
        0, s.sent * 4, 1, s.expected * 4, {transport::Channel::point_to_point, static_cast<std::uint64_t>(s.tag), 0});
    std::vector<std::string> errors(2, "no error");
    const std::string failures = run_communicators<TypeParam>(2, [&](Communicator& comm) {
      std::vector<std::int32_t> data(large + 100, 1);
      try {
        if (comm.rank() == 0) {
          comm.send(data.data(), s.sent, s.type, 1, s.tag);
          comm.barrier({Algorithm::automatic, op_timeout});
        } else {
          comm.recv(data.data(), s.expected, s.type, 0, s.tag);
        }
      } catch (const Error& e) {
        errors[static_cast<std::size_t>(comm.rank())] = std::string(to_string(e.code())) + ": " + e.what();
      }
    });
    EXPECT_EQ(failures, "");
    for (const std::string& e : errors) {
      EXPECT_EQ(e.rfind("mismatch: ", 0), 0u) << e;
      EXPECT_NE(e.find(want), std::string::npos) << e;
    }
  }
}

// Small sends are eager over shared memory and TCP (Traits::eager_bytes): a send completes before
// its receive is posted, so two ranks that both send first do not wait for each other, and a
// receive posted after several messages arrived takes each by its tag. Elsewhere: skipped.
TYPED_TEST(TransportConformance, EagerSendsCompleteBeforeTheirReceive) {
  if (TypeParam::traits.eager_bytes == 0) GTEST_SKIP() << "this transport sends no message eagerly";
  const std::size_t n = TypeParam::traits.eager_bytes / 4;
  const std::string failures = run_communicators<TypeParam>(2, [&](Communicator& comm) {
    const int r = comm.rank(), other = 1 - r;
    std::vector<std::int32_t> first(n, 10 * r + 1), second(1, 10 * r + 2), got_first(n, -1), got_second(1, -1);
    comm.send(first.data(), n, DataType::i32, other, 1);  // both send before either receives
    comm.send(second.data(), 1, DataType::i32, other, 2);
    EXPECT_EQ(comm.recv(got_second.data(), 1, DataType::i32, other, 2), other);  // the later one first
    EXPECT_EQ(comm.recv(got_first.data(), n, DataType::i32, other, 1), other);
    EXPECT_EQ(got_second[0], 10 * other + 2);
    EXPECT_EQ(std::count(got_first.begin(), got_first.end(), 10 * other + 1), static_cast<std::ptrdiff_t>(n));
  });
  EXPECT_EQ(failures, "");
}

// ---- receives from any source ----

TYPED_TEST(TransportConformance, AnySourceTakesEveryMessageOnceInOrderPerSender) {
  for (int p : {2, 3, 4})
    EXPECT_EQ(run_communicators<TypeParam>(p, any_source_cases::senders_to_one_receiver), "") << "p=" << p;
}

TYPED_TEST(TransportConformance, AnySourceMixedWithNamedReceives) {
  for (int round = 0; round < 3; ++round)
    EXPECT_EQ(run_communicators<TypeParam>(3, any_source_cases::mixed_with_named_receives), "") << "round " << round;
}

TYPED_TEST(TransportConformance, AnySourceTakesAMessageToItself) {
  for (int p : {1, 3}) EXPECT_EQ(run_communicators<TypeParam>(p, any_source_cases::from_itself), "") << "p=" << p;
}

// Nobody sends: the receive raises Error(timeout) at the communicator's deadline.
TYPED_TEST(TransportConformance, AnySourceTimesOutWhenNobodySends) {
  ::setenv("TUTTI_TIMEOUT_MS", "300", 1);
  std::string error = "no error";
  const auto start = std::chrono::steady_clock::now();
  const std::string failures = run_communicators<TypeParam>(3, [&](Communicator& comm) {
    if (comm.rank() != 0) return;
    std::int32_t in = 0;
    try {
      comm.recv(&in, 1, DataType::i32, any_source, 4);
    } catch (const Error& e) {
      error = std::string(to_string(e.code())) + ": " + e.what();
    }
  });
  ::setenv("TUTTI_TIMEOUT_MS", "60000", 1);
  EXPECT_EQ(failures, "");
  EXPECT_EQ(error.rfind("timeout: ", 0), 0u) << error;
  EXPECT_NE(error.find("from rank any, tag 4"), std::string::npos) << error;
  EXPECT_LT(std::chrono::steady_clock::now() - start, 20s);
}

// A message longer than the receive's buffer: Error(mismatch) on both ranks, as a named receive.
TYPED_TEST(TransportConformance, AnySourceOfAnotherSizeRaisesMismatchOnBothRanks) {
  std::vector<std::string> errors(2, "no error");
  const std::string failures = run_communicators<TypeParam>(2, [&](Communicator& comm) {
    std::vector<std::int32_t> data(beyond_eager, 1);  // larger than an eager message
    try {
      if (comm.rank() == 1)
        comm.send(data.data(), beyond_eager, DataType::i32, 0, 3);
      else
        comm.recv(data.data(), beyond_eager - 50, DataType::i32, any_source, 3);
    } catch (const Error& e) {
      errors[static_cast<std::size_t>(comm.rank())] = std::string(to_string(e.code())) + ": " + e.what();
    }
  });
  EXPECT_EQ(failures, "");
  for (const std::string& e : errors) EXPECT_EQ(e.rfind("mismatch: ", 0), 0u) << e;
}

// sendrecv: each rank exchanges with both ring neighbours at once, where a send first would wait
// for the peer's (sizes from empty to several ring-fulls, so that both directions stream at
// once), against peers that use sendrecv, send and recv, or isend and irecv; every element
// is the sender's, the index's and the tag's; from any source it returns the sender.
TYPED_TEST(TransportConformance, SendrecvExchangesWithBothNeighboursExactly) {
  for (int p : {2, 3, 4}) {
    const std::string failures = run_communicators<TypeParam>(p, [](Communicator& comm) {
      const int r = comm.rank(), n = comm.size();
      const int next = (r + 1) % n, prev = (r + n - 1) % n;
      const auto value = [](int from, std::size_t i, int tag) {
        return static_cast<std::int32_t>(from * 1'000'003 + static_cast<int>(i % 100'000) * 7 + tag);
      };
      const auto fill = [&](std::vector<std::int32_t>& v, int tag) {
        for (std::size_t i = 0; i < v.size(); ++i) v[i] = value(r, i, tag);
      };
      const auto check = [&](const std::vector<std::int32_t>& v, int from, int tag, const char* what) {
        for (std::size_t i = 0; i < v.size(); ++i)
          if (v[i] != value(from, i, tag)) {
            ADD_FAILURE() << what << ": element " << i << " of " << v.size() << " from rank " << from << " is " << v[i];
            return;
          }
      };
      for (const std::size_t count : {std::size_t{0}, std::size_t{1}, std::size_t{1000}, std::size_t{700'001}}) {
        std::vector<std::int32_t> out(count), in(count, -1);
        // Forward: to next, from prev, every rank at once.
        fill(out, 1);
        EXPECT_EQ(comm.sendrecv(out.data(), count, next, in.data(), count, prev, DataType::i32, 1, 1), prev);
        check(in, prev, 1, "forward");
        // Backward, each rank sending with a tag of its own.
        fill(out, 10 + r);
        std::fill(in.begin(), in.end(), -1);
        EXPECT_EQ(comm.sendrecv(out.data(), count, prev, in.data(), count, next, DataType::i32, 10 + r, 10 + next),
                  next);
        check(in, next, 10 + next, "backward");
        // Ranks 0 and 1: rank 0 uses sendrecv, rank 1 answers with recv then send, then with
        // irecv and isend, then with a send to a receive from any source.
        if (r > 1) continue;
        const int other = 1 - r;
        for (int round = 0; round < 3; ++round) {
          const int tag = 20 + round;
          fill(out, tag);
          std::fill(in.begin(), in.end(), -1);
          if (r == 0) {
            const int from = round == 2 ? any_source : other;
            EXPECT_EQ(comm.sendrecv(out.data(), count, other, in.data(), count, from, DataType::i32, tag, tag), other);
          } else if (round == 1) {
            Request sent = comm.isend(out.data(), count, DataType::i32, other, tag);
            Request received = comm.irecv(in.data(), count, DataType::i32, other, tag);
            received.wait();
            sent.wait();
            EXPECT_EQ(received.source(), other);
          } else {
            EXPECT_EQ(comm.recv(in.data(), count, DataType::i32, other, tag), other);
            comm.send(out.data(), count, DataType::i32, other, tag);
          }
          check(in, other, tag, "with rank 0");
        }
      }
    });
    EXPECT_EQ(failures, "") << "p=" << p;
  }
}

// sendrecv's arguments are checked before anything is sent (buffers that overlap, a peer out of
// range, a negative tag, a null buffer); then a receive shorter than its message raises
// Error(mismatch) on both ranks.
TYPED_TEST(TransportConformance, SendrecvRefusesBadArgumentsAndRaisesMismatchOnBothRanks) {
  std::vector<std::string> errors(2, "no error");
  const std::string failures = run_communicators<TypeParam>(2, [&](Communicator& comm) {
    const int r = comm.rank(), other = 1 - r;
    std::vector<std::int32_t> data(16, r + 1), in(16, 0);
    const auto refused = [&](const std::function<void()>& call, const std::string& needle) {
      try {
        call();
        ADD_FAILURE() << "accepted: " << needle;
      } catch (const Error& e) {
        EXPECT_EQ(e.code(), ErrorCode::invalid_argument) << e.what();
        EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
      }
    };
    refused([&] { comm.sendrecv(data.data(), 8, other, data.data() + 4, 8, other, DataType::i32); }, "overlap");
    refused([&] { comm.sendrecv(data.data(), 8, 2, in.data(), 8, other, DataType::i32); }, "send: peer 2");
    refused([&] { comm.sendrecv(data.data(), 8, other, in.data(), 8, -5, DataType::i32); }, "recv: peer -5");
    refused([&] { comm.sendrecv(data.data(), 8, other, in.data(), 8, other, DataType::i32, 0, -1); }, "tag");
    refused([&] { comm.sendrecv(nullptr, 8, other, in.data(), 8, other, DataType::i32); }, "send: data is null");
    // Nothing was sent: the same tag exchanges as usual (an overlap of zero bytes is none).
    EXPECT_EQ(comm.sendrecv(data.data(), 8, other, in.data(), 8, other, DataType::i32), other);
    EXPECT_EQ(in[0], other + 1);
    EXPECT_EQ(in[8], 0);
    EXPECT_EQ(comm.sendrecv(data.data(), 0, other, data.data(), 0, other, DataType::i32), other);
    // Larger than an eager message: the send waits for its receive.
    std::vector<std::int32_t> large(beyond_eager + 100, r), large_in(beyond_eager, 0);
    try {
      comm.sendrecv(large.data(), r == 0 ? beyond_eager : beyond_eager + 100, other, large_in.data(), beyond_eager,
                    other, DataType::i32, 3, 3);
    } catch (const Error& e) {
      errors[static_cast<std::size_t>(r)] = std::string(to_string(e.code())) + ": " + e.what();
    }
  });
  EXPECT_EQ(failures, "");
  const std::string want = transport::size_mismatch(1, (beyond_eager + 100) * 4, 0, beyond_eager * 4,
                                                    {transport::Channel::point_to_point, 3, 0});
  for (const std::string& e : errors) {
    EXPECT_EQ(e.rfind("mismatch: ", 0), 0u) << e;
    EXPECT_NE(e.find(want), std::string::npos) << e;
  }
}

// A blocking recv, and a sendrecv, whose peer never answers: Error(timeout) at the deadline (not
// before it, and within 2 s after it: the clock is read at every 8th wait, and a wait past the
// deadline returns at once), naming the message and the rank waited for. Under a sanitizer on a
// loaded machine a thread can stall for seconds (ThreadSanitizer once took 2.38 s here while the
// CI built other trees beside it): there the bound is 5 s after the deadline.
TYPED_TEST(TransportConformance, BlockingPointToPointTimesOutNamingThePeer) {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  constexpr auto after_deadline = 5000ms;
#else
  constexpr auto after_deadline = 2000ms;
#endif
  ::setenv("TUTTI_TIMEOUT_MS", "300", 1);
  std::vector<std::string> errors(2, "no error");
  std::vector<std::chrono::steady_clock::duration> took(2);
  const auto start = std::chrono::steady_clock::now();
  for (int call = 0; call < 2; ++call) {
    const std::string failures = run_communicators<TypeParam>(2, [&](Communicator& comm) {
      if (comm.rank() != 0) return;
      std::vector<std::int32_t> out(beyond_eager, 1);  // larger than an eager message: the send waits too
      std::int32_t in = 0;
      const auto called = std::chrono::steady_clock::now();
      try {
        if (call == 0)
          comm.recv(&in, 1, DataType::i32, 1, 5);
        else
          comm.sendrecv(out.data(), out.size(), 1, &in, 1, 1, DataType::i32, 4, 4);
      } catch (const Error& e) {
        errors[static_cast<std::size_t>(call)] = std::string(to_string(e.code())) + ": " + e.what();
      }
      took[static_cast<std::size_t>(call)] = std::chrono::steady_clock::now() - called;
    });
    EXPECT_EQ(failures, "");
  }
  ::setenv("TUTTI_TIMEOUT_MS", "60000", 1);
  EXPECT_EQ(errors[0],
            "timeout: rank 0: recv(count=1, i32, from rank 1, tag 5) timed out after 300 ms; still "
            "waiting for rank(s) 1");
  EXPECT_EQ(errors[1], "timeout: rank 0: send(count=" + std::to_string(beyond_eager) +
                           ", i32, to rank 1, tag 4) timed out after 300 ms; still waiting for rank(s) 1");
  for (const auto& t : took) {
    EXPECT_GE(t, 300ms);
    EXPECT_LT(t, 300ms + after_deadline);
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, 20s);
}

// Even and odd ranks split apart, each in reverse order, then split again and split off a
// communicator without rank 0: sizes, orders and results on every level.
TYPED_TEST(TransportConformance, SplitCommunicators) {
  std::atomic<int> wrong{0};
  const std::string failures = run_communicators<TypeParam>(5, [&](Communicator& comm) {
    const int r = comm.rank();
    Communicator half = comm.split(r % 2, -r);  // reversed order within each color
    const int members = r % 2 == 0 ? 3 : 2;
    if (half.size() != members) ++wrong;
    std::vector<std::int32_t> all(static_cast<std::size_t>(members), -1);
    half.allgather(&r, all.data(), 1, DataType::i32, {Algorithm::automatic, op_timeout});
    for (int i = 0; i < members; ++i)  // highest old rank first
      if (all[static_cast<std::size_t>(i)] != all[0] - 2 * i) ++wrong;
    std::vector<float> big(300001, static_cast<float>(r));
    half.allreduce(std::span<float>(big), ReduceOp::sum, {Algorithm::ring, op_timeout});
    float expected = 0;
    for (int x : all) expected += static_cast<float>(x);
    for (float v : big)
      if (v != expected) {
        ++wrong;
        break;
      }
    Communicator nested = half.split(0, 0);
    int sum = 0;
    nested.allreduce(&r, &sum, 1, DataType::i32, ReduceOp::sum, {Algorithm::automatic, op_timeout});
    if (static_cast<float>(sum) != expected) ++wrong;
    Communicator none = comm.split(r == 0 ? -1 : 0, 0);
    if ((r == 0) != (none.size() == 0)) ++wrong;
  });
  EXPECT_EQ(failures, "");
  EXPECT_EQ(wrong.load(), 0);
}

// Collectives on a communicator and on two levels split from it, in flight at once.
TYPED_TEST(TransportConformance, SubcommunicatorsRunConcurrently) {
  const std::string failures = run_communicators<TypeParam>(6, [](Communicator& world) {
    const int me = world.rank();
    Communicator half = world.split(me % 2, -me);  // reversed order inside each half
    Communicator pair = half.split(half.rank() / 2, 0);
    ASSERT_EQ(half.size(), 3);
    ASSERT_EQ(half.rank(), 2 - me / 2);
    for (int round = 0; round < 10; ++round) {
      const std::size_t n = round % 2 ? 100'003 : 17;
      std::vector<float> a(n, static_cast<float>(me)), b(n, 1.0f), c(n, 1.0f), d(n, static_cast<float>(me));
      Request r1 = half.iallreduce(a.data(), a.data(), n, DataType::f32, ReduceOp::sum, {Algorithm::ring, op_timeout});
      Request r2 = world.iallreduce(b.data(), b.data(), n, DataType::f32, ReduceOp::sum, {{}, op_timeout});
      Request r3 = pair.iallreduce(c.data(), c.data(), n, DataType::f32, ReduceOp::sum, {{}, op_timeout});
      Request r4 = half.ibroadcast(d.data(), n, DataType::f32, 0, {{}, op_timeout});
      r3.wait();
      r2.wait();
      r1.wait();
      r4.wait();
      const float half_sum = me % 2 ? 1 + 3 + 5 : 0 + 2 + 4;
      const float half_root = me % 2 ? 5 : 4;  // rank 0 of a half is its largest world rank
      for (std::size_t i = 0; i < n; ++i) {
        ASSERT_EQ(a[i], half_sum);
        ASSERT_EQ(b[i], 6.0f);
        ASSERT_EQ(c[i], static_cast<float>(pair.size()));
        ASSERT_EQ(d[i], half_root);
      }
    }
  });
  EXPECT_EQ(failures, "");
}

}  // namespace
}  // namespace tutti::testing
