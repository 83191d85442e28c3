// The transport conformance cases (transport_cases.hpp) over the MPI transport, one process per
// rank under mpirun, on MPI_COMM_WORLD. What MPI cannot do by design is said in `traits`; the
// collective mismatch is caught by the executor there (mpi_test's MpiFault tests).
#include <gtest/gtest.h>
#include <mpi.h>

#include <functional>
#include <string>

#include "any_source_cases.hpp"
#include "transport/mpi/mpi_transport.hpp"
#include "transport_cases.hpp"
#include "tutti/mpi.hpp"
#include "tutti/tutti.hpp"

namespace tutti::testing {
namespace {

using transport::mpi::MpiTransport;

constexpr conformance::Traits traits{.sender_learns_size_mismatch = false,
                                     .knows_oversized_size = false,
                                     .checks_announced_signatures = false,
                                     .refuses_before_writing = false};

// Runs the case on this rank's transport over MPI_COMM_WORLD; fails on every rank when any failed.
void run_case(const std::function<std::string(transport::Transport&)>& fn) {
  std::string mine;
  int rank = 0;
  {
    MpiTransport transport(MPI_COMM_WORLD);
    rank = transport.rank();
    try {
      mine = fn(transport);
    } catch (const std::exception& e) {
      mine = std::string("threw: ") + e.what();
    }
  }
  if (!mine.empty()) ADD_FAILURE() << "rank " << rank << ": " << mine;
  int bad = mine.empty() ? 0 : 1, any = 0;
  MPI_Allreduce(&bad, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (any && mine.empty()) ADD_FAILURE() << "failed on another rank";
}

TEST(MpiConformance, ExchangesExactBytesEveryPairBothWays) { run_case(conformance::exchange_exact_bytes); }

TEST(MpiConformance, MatchesDistinctKeysOutOfOrder) { run_case(conformance::match_out_of_order); }

TEST(MpiConformance, SizeMismatchFailsTheReceiverWithOneText) {
  run_case([](transport::Transport& t) { return conformance::size_mismatch(t, traits); });
}

TEST(MpiConformance, SplitGivesAnIsolatedSubTransport) { run_case(conformance::split); }

TEST(MpiConformance, CancelWithdrawsAPostedReceive) { run_case(conformance::cancel_posted_receive); }

TEST(MpiConformance, AbortWakesAWaiterAndReachesEveryRank) { run_case(conformance::abort_reaches_every_rank); }

// Receives from any source through a Communicator over MPI (the cases of any_source_cases.hpp).
void run_on_world(const std::function<void(Communicator&)>& fn) {
  std::string mine;
  Communicator world = from_mpi(MPI_COMM_WORLD);
  try {
    fn(world);
    world.barrier();
  } catch (const std::exception& e) {
    mine = e.what();
  }
  if (!mine.empty()) ADD_FAILURE() << "rank " << world.rank() << ": " << mine;
  int bad = mine.empty() ? 0 : 1, any = 0;
  MPI_Allreduce(&bad, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (any && mine.empty()) ADD_FAILURE() << "failed on another rank";
}

TEST(MpiConformance, AnySourceTakesEveryMessageOnceInOrderPerSender) {
  run_on_world(any_source_cases::senders_to_one_receiver);
  run_on_world(any_source_cases::from_itself);
}

TEST(MpiConformance, AnySourceMixedWithNamedReceives) {
  int p = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &p);
  if (p < 3) GTEST_SKIP() << "needs ranks 1 and 2";
  run_on_world(any_source_cases::mixed_with_named_receives);
}

}  // namespace
}  // namespace tutti::testing
