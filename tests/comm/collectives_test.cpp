// Every collective × algorithm × p × count × in place / out of place, and every type × op for the
// reductions: ranks are threads; inputs are integer-valued so results are exact; outputs are
// poisoned before the call; every element of every rank's output is compared with a reference
// computed directly from the definition.
#include <atomic>
#include <numeric>
#include <set>
#include <sstream>

#include "collective_cases.hpp"

namespace tutti::testing {
namespace {

class Collectives : public ::testing::TestWithParam<Case> {};

TEST_P(Collectives, MatchesReference) {
  const Case c = GetParam();
  std::mutex mutex;
  std::string wrong;
  const std::string failures = run_ranks(c.p, [&](Communicator& comm) {
    const std::string e = run_rank(comm, c);
    if (!e.empty()) {
      std::lock_guard lock(mutex);
      wrong += "rank " + std::to_string(comm.rank()) + ": " + e + "\n";
    }
  });
  EXPECT_EQ(failures, "");
  EXPECT_EQ(wrong, "");
}

std::string param_name(const ::testing::TestParamInfo<Case>& info) { return name_of(info.param); }

INSTANTIATE_TEST_SUITE_P(Sweep, Collectives, ::testing::ValuesIn(sweep_cases()), param_name);
INSTANTIATE_TEST_SUITE_P(Types, Collectives, ::testing::ValuesIn(type_cases()), param_name);
INSTANTIATE_TEST_SUITE_P(Large, Collectives, ::testing::ValuesIn(large_cases()), param_name);

TEST(Barrier, NoRankLeavesBeforeAllEntered) {
  for (Algorithm a : algorithms_with_automatic(Collective::barrier)) {
    for (int p : {1, 2, 3, 5, 8}) {
      std::atomic<int> entered{0};
      std::atomic<int> early{0};
      const std::string failures = run_ranks(p, [&](Communicator& comm) {
        for (int round = 0; round < 5; ++round) {
          // Stagger arrivals: rank r sleeps r ms, so a barrier that lets anyone through early shows it.
          std::this_thread::sleep_for(std::chrono::milliseconds(comm.rank()));
          entered.fetch_add(1);
          comm.barrier({a, test_timeout});
          if (entered.load() < p * (round + 1)) early.fetch_add(1);
          comm.barrier({a, test_timeout});  // nobody enters the next round before all checked
        }
      });
      EXPECT_EQ(failures, "") << to_string(a) << " p=" << p;
      EXPECT_EQ(early.load(), 0) << to_string(a) << " p=" << p;
    }
  }
}

}  // namespace
}  // namespace tutti::testing
