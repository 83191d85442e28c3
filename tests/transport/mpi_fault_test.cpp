// Faults under mpirun (MPI_TEST_MODE=fault: ctest's mpi_fault_* entries, apart from the rest because
// they leave behind requests MPI cannot cancel; MPI_Finalize still completes): a mismatched call
// and a late rank raise the right Error on every rank, by the deadline. Part of mpi_test, whose
// main (mpi_test.cpp) picks these tests by MPI_TEST_MODE.
#include <gtest/gtest.h>
#include <mpi.h>

#include <chrono>
#include <cstdlib>
#include <functional>
#include <numeric>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "mpi_cases.hpp"
#include "transport/mpi/mpi_transport.hpp"
#include "tutti/mpi.hpp"

namespace tutti::testing {
namespace {

using namespace std::chrono_literals;
using transport::mpi::MpiTransport;

using steady = std::chrono::steady_clock;

// Every rank's text, in rank order, on every rank.
std::vector<std::string> all_texts(MPI_Comm comm, const std::string& mine) {
  const int p = comm_size(comm), length = static_cast<int>(mine.size());
  std::vector<int> lengths(static_cast<std::size_t>(p)), displacements(static_cast<std::size_t>(p));
  MPI_Allgather(&length, 1, MPI_INT, lengths.data(), 1, MPI_INT, comm);
  std::exclusive_scan(lengths.begin(), lengths.end(), displacements.begin(), 0);
  std::string all(static_cast<std::size_t>(displacements.back() + lengths.back()), '\0');
  MPI_Allgatherv(mine.data(), length, MPI_CHAR, all.data(), lengths.data(), displacements.data(), MPI_CHAR, comm);
  std::vector<std::string> out;
  for (std::size_t r = 0; r < lengths.size(); ++r)
    out.push_back(all.substr(static_cast<std::size_t>(displacements[r]), static_cast<std::size_t>(lengths[r])));
  return out;
}

// What one rank's call gave, and how long it took.
struct Outcome {
  std::optional<ErrorCode> code;
  std::string message;
  double seconds = 0;
  std::string describe() const {
    return (code ? std::string(to_string(*code)) : std::string("no error")) + " after " + std::to_string(seconds) +
           " s: " + message;
  }
};

Outcome outcome_of(const std::function<void()>& fn) {
  const auto start = steady::now();
  Outcome out;
  try {
    fn();
  } catch (const Error& e) {
    out.code = e.code();
    out.message = e.what();
  }
  out.seconds = std::chrono::duration<double>(steady::now() - start).count();
  return out;
}

constexpr auto fault_timeout = 1000ms;  // the operation's deadline in the timeout tests
constexpr auto lateness = 2500ms;       // how late the late rank comes
constexpr double bound_s = 4.0;         // timeout + 3 s: what "by the deadline" allows on a loaded machine

// One rank (the last) passes another count to an allreduce: every rank raises Error(mismatch)
// naming it, at once (the deadline is 20 s), and the communicator is failed for the next call.
void expect_mismatch_on_every_rank(Algorithm algorithm) {
  Communicator world = from_mpi(MPI_COMM_WORLD);
  const int me = world.rank(), odd = world.size() - 1;
  const std::size_t n = me == odd ? 37 : 36;
  std::vector<std::int32_t> in(37, 1), out(37, 0);
  const Outcome o = outcome_of([&] {
    world.allreduce(in.data(), out.data(), n, DataType::i32, ReduceOp::sum, {algorithm, 20s});
  });
  std::string errors;
  if (o.code != ErrorCode::mismatch || o.message.find("rank " + std::to_string(odd)) == std::string::npos ||
      o.seconds > 10)
    errors += "rank " + std::to_string(me) + ": expected Error(mismatch) naming rank " + std::to_string(odd) +
              " at once, got " + o.describe() + "\n";
  const Outcome next = outcome_of([&] { world.barrier({algorithm, 20s}); });
  if (next.code != ErrorCode::aborted)
    errors += "rank " + std::to_string(me) + ": the next call gave " + next.describe() + "\n";
  if (algorithm == Algorithm::mpi) {  // every rank compared the same signatures
    const auto texts = all_texts(MPI_COMM_WORLD, o.message);
    for (const std::string& text : texts)
      if (text != texts[0]) {
        errors +=
            "rank " + std::to_string(me) + ": ranks report different errors: '" + texts[0] + "' and '" + text + "'\n";
        break;
      }
  }
  expect_all_ranks_ok(MPI_COMM_WORLD, errors);
}

TEST(MpiFault, MismatchedCountRaisesOnEveryRankOverMpiCollectives) {
  if (comm_size(MPI_COMM_WORLD) < 2) GTEST_SKIP() << "needs 2 ranks";
  expect_mismatch_on_every_rank(Algorithm::mpi);
}

TEST(MpiFault, MismatchedCountRaisesOnEveryRankOverSchedules) {
  if (comm_size(MPI_COMM_WORLD) < 2) GTEST_SKIP() << "needs 2 ranks";
  expect_mismatch_on_every_rank(Algorithm::ring);
}

// The last rank comes `lateness` late to `call`: the others raise Error(timeout) by their deadline
// (not when it comes). The late rank raises it too: at once when the others' abort reaches it
// (`told`), else (set-up, before there is a communicator to tell) by its own deadline.
void expect_timeout_for_late_rank(const std::function<void()>& call, bool told = true) {
  const int me = comm_rank(MPI_COMM_WORLD), late = comm_size(MPI_COMM_WORLD) - 1;
  MPI_Barrier(MPI_COMM_WORLD);
  if (me == late) std::this_thread::sleep_for(lateness);
  const Outcome o = outcome_of(call);
  const double deadline_s = std::chrono::duration<double>(fault_timeout).count();
  const double least = me == late ? 0 : deadline_s - 0.05, most = me == late && told ? deadline_s / 2 : bound_s;
  std::string errors;
  if (o.code != ErrorCode::timeout || o.seconds < least || o.seconds > most)
    errors = "rank " + std::to_string(me) + (me == late ? " (late)" : "") + ": expected Error(timeout) within [" +
             std::to_string(least) + ", " + std::to_string(most) + "] s, got " + o.describe() + "\n";
  expect_all_ranks_ok(MPI_COMM_WORLD, errors);
}

TEST(MpiFault, LateRankTimesOutByTheDeadlineOverMpiCollectives) {
  if (comm_size(MPI_COMM_WORLD) < 2) GTEST_SKIP() << "needs 2 ranks";
  Communicator world = from_mpi(MPI_COMM_WORLD);
  std::vector<std::int32_t> in(64, 1), out(64, 0);
  expect_timeout_for_late_rank([&] {
    world.allreduce(in.data(), out.data(), in.size(), DataType::i32, ReduceOp::sum, {Algorithm::mpi, fault_timeout});
  });
}

TEST(MpiFault, LateRankTimesOutByTheDeadlineOverSchedules) {
  if (comm_size(MPI_COMM_WORLD) < 2) GTEST_SKIP() << "needs 2 ranks";
  Communicator world = from_mpi(MPI_COMM_WORLD);
  std::vector<std::int32_t> in(64, 1), out(64, 0);
  expect_timeout_for_late_rank([&] {
    world.allreduce(in.data(), out.data(), in.size(), DataType::i32, ReduceOp::sum, {Algorithm::ring, fault_timeout});
  });
}

// Sets TUTTI_TIMEOUT_MS (the deadline of set-up and split) for one scope.
struct DefaultTimeout {
  explicit DefaultTimeout(std::chrono::milliseconds ms) {
    setenv("TUTTI_TIMEOUT_MS", std::to_string(ms.count()).c_str(), 1);
  }
  ~DefaultTimeout() { unsetenv("TUTTI_TIMEOUT_MS"); }
};

TEST(MpiFault, FromMpiWithLateRankTimesOut) {
  if (comm_size(MPI_COMM_WORLD) < 2) GTEST_SKIP() << "needs 2 ranks";
  DefaultTimeout scope(fault_timeout);
  expect_timeout_for_late_rank([] { Communicator world = from_mpi(MPI_COMM_WORLD); }, false);
}

TEST(MpiFault, SplitWithLateMemberTimesOut) {
  if (comm_size(MPI_COMM_WORLD) < 2) GTEST_SKIP() << "needs 2 ranks";
  MpiTransport parent(MPI_COMM_WORLD, fault_timeout);
  const int p = parent.size(), me = parent.rank();
  std::vector<int> ranks(static_cast<std::size_t>(p));
  std::iota(ranks.rbegin(), ranks.rend(), 0);  // every rank, in reverse order
  // Straight to the transport: Communicator::split's allgather would catch the late rank first.
  expect_timeout_for_late_rank([&] { parent.split(77, ranks, p - 1 - me); });
  // The parent is aborted on every rank: the first error reached all.
  const auto deadline = steady::now() + 5s;
  while (!parent.aborted() && steady::now() < deadline) parent.wait(parent.generation(), steady::now() + 10ms);
  const auto failure = parent.aborted();
  expect_all_ranks_ok(MPI_COMM_WORLD,
                      failure && failure->error.code() == ErrorCode::timeout
                          ? ""
                          : "rank " + std::to_string(me) + ": the parent is not aborted by a timeout\n");
}

TEST(MpiFault, CommunicatorSplitWithLateRankTimesOut) {
  if (comm_size(MPI_COMM_WORLD) < 2) GTEST_SKIP() << "needs 2 ranks";
  DefaultTimeout scope(fault_timeout);
  Communicator world = from_mpi(MPI_COMM_WORLD);
  expect_timeout_for_late_rank([&] { world.split(0, world.rank()); });
}

}  // namespace
}  // namespace tutti::testing
