// The schedule layer: every allreduce, reduce_scatter and allgather(v) generator checked for
// every p and awkward count, in place and out, with tiny and default chunks; the checker shown
// to catch broken schedules; dispatch's table; and the cost model's critical path.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <string>
#include <tuple>
#include <vector>

#include "schedule/algorithms.hpp"
#include "schedule/check.hpp"
#include "schedule/fold.hpp"

namespace tutti::schedule {
namespace {

const std::vector<int> kSizes{1, 2, 3, 4, 5, 6, 7, 8, 9, 16};

std::vector<std::size_t> counts_for(int p) {
  const auto n = static_cast<std::size_t>(p);
  return {0, 1, n - 1, n, n + 1, 2 * n + 3, 97};
}

struct Case {
  Collective collective;
  Algorithm algorithm;
};

std::string name_of(const Case& c) {
  return std::string(to_string(c.collective)) + "/" + std::string(tutti::to_string(c.algorithm));
}

Params params_of(Collective collective, int p, std::size_t count, std::size_t chunk_bytes) {
  Params params;
  params.collective = collective;
  params.size = p;
  params.count = count;
  params.chunk_bytes = chunk_bytes;
  return params;
}

// Every p, count, in place or not, chunking, and ranks in blocks of 2 on hosts or not, for one
// collective and algorithm.
void sweep(const Case& c) {
  for (int p : kSizes)
    for (std::size_t count : counts_for(p))
      for (bool in_place : {false, true})
        for (std::size_t chunk_bytes : {std::size_t{8}, std::size_t{1} << 18})
          for (int per_host : {0, 2}) {
            Params params = params_of(c.collective, p, count, chunk_bytes);
            params.ranks_per_host = per_host;
            std::vector<std::size_t> counts(static_cast<std::size_t>(p), count);
            params.counts = counts;
            EXPECT_EQ(check(c.algorithm, params, {.in_place = in_place}), "")
                << name_of(c) << " p=" << p << " count=" << count << " chunk_bytes=" << chunk_bytes
                << " ranks_per_host=" << per_host;
          }
}

class Sweep : public ::testing::TestWithParam<Case> {};

TEST_P(Sweep, EveryRankGetsExactlyTheResult) { sweep(GetParam()); }

INSTANTIATE_TEST_SUITE_P(Schedules, Sweep,
                         ::testing::Values(Case{Collective::allreduce, Algorithm::ring},
                                           Case{Collective::allreduce, Algorithm::recursive_doubling},
                                           Case{Collective::allreduce, Algorithm::rabenseifner},
                                           Case{Collective::reduce_scatter, Algorithm::ring},
                                           Case{Collective::reduce_scatter, Algorithm::rabenseifner},
                                           Case{Collective::allgather, Algorithm::ring},
                                           Case{Collective::allgather, Algorithm::recursive_doubling},
                                           Case{Collective::allgather, Algorithm::bruck},
                                           Case{Collective::allgatherv, Algorithm::ring},
                                           Case{Collective::allgatherv, Algorithm::recursive_doubling},
                                           Case{Collective::allgatherv, Algorithm::bruck}),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           std::string n = name_of(info.param);
                           for (char& ch : n)
                             if (ch == '/') ch = '_';
                           return n;
                         });

// Whether the ranks in `side` (a bit per rank), running `schedules` and receiving only from each
// other, ever send to a rank outside it: each step runs once its dependencies have, a send at
// once, a receive once its message (the k-th from that peer, in list order) was sent.
bool sends_across(const std::vector<Schedule>& schedules, std::uint32_t side) {
  const auto p = schedules.size();
  auto inside = [side](int r) { return (side >> r & 1u) != 0; };
  std::vector<std::vector<bool>> done(p);
  std::vector<std::vector<std::size_t>> index(p);  // each step's message number with its peer
  std::vector<std::vector<std::size_t>> sent(p, std::vector<std::size_t>(p, 0));  // [from][to]
  for (std::size_t r = 0; r < p; ++r) {
    const auto& steps = schedules[r].steps;
    done[r].assign(steps.size(), false);
    index[r].assign(steps.size(), 0);
    std::vector<std::size_t> sends(p, 0), recvs(p, 0);
    for (std::size_t i = 0; i < steps.size(); ++i)
      if (steps[i].kind == StepKind::send)
        index[r][i] = sends[static_cast<std::size_t>(steps[i].peer)]++;
      else if (steps[i].kind != StepKind::copy)
        index[r][i] = recvs[static_cast<std::size_t>(steps[i].peer)]++;
  }
  for (bool progressed = true; progressed;) {
    progressed = false;
    for (std::size_t r = 0; r < p; ++r) {
      if (!inside(static_cast<int>(r))) continue;
      const auto& steps = schedules[r].steps;
      for (std::size_t i = 0; i < steps.size(); ++i) {
        if (done[r][i] ||
            !std::all_of(steps[i].deps.begin(), steps[i].deps.end(), [&](std::uint32_t d) { return done[r][d]; }))
          continue;
        const auto peer = static_cast<std::size_t>(steps[i].peer);
        if (steps[i].kind == StepKind::send) {
          if (!inside(steps[i].peer)) return true;
          ++sent[r][peer];
        } else if (steps[i].kind != StepKind::copy && (!inside(steps[i].peer) || sent[peer][r] <= index[r][i])) {
          continue;  // its message never comes, or not yet
        }
        done[r][i] = true;
        progressed = true;
      }
    }
  }
  return false;
}

// Where messages_cross_every_cut says so, every way of dividing the ranks leaves some rank on
// each side sending across before it waits for the other side (every division up to 9 ranks; at
// 16, the divisions a seeded generator draws), so that over TCP ranks that run different calls
// exchange a message that shows it, with no signature ring; and it says so often enough to be
// worth having. Recursive doubling beyond a power of two does not: a rank that takes a fold waits
// for it first (the division {folding rank} against the rest is one that never sends across).
TEST(SignatureRing, LeftOutOnlyWhereEveryDivisionOfTheRanksIsCrossed) {
  int admitted = 0;
  std::uint64_t seed = 0x9e3779b97f4a7c15;
  for (const Case c :
       {Case{Collective::allreduce, Algorithm::ring}, Case{Collective::allreduce, Algorithm::recursive_doubling},
        Case{Collective::reduce_scatter, Algorithm::ring}, Case{Collective::reduce_scatter, Algorithm::rabenseifner},
        Case{Collective::allgather, Algorithm::ring}, Case{Collective::allgather, Algorithm::recursive_doubling},
        Case{Collective::allreduce, Algorithm::rabenseifner}, Case{Collective::allgather, Algorithm::bruck},
        Case{Collective::alltoall, Algorithm::pairwise}, Case{Collective::alltoall, Algorithm::bruck},
        Case{Collective::barrier, Algorithm::bruck}, Case{Collective::barrier, Algorithm::recursive_doubling}})
    for (int p : kSizes)
      for (std::size_t count : c.collective == Collective::barrier ? std::vector<std::size_t>{0} : counts_for(p))
        for (std::size_t chunk_bytes : {std::size_t{8}, std::size_t{1} << 18}) {
          if (!messages_cross_every_cut(c.algorithm, c.collective, count, p)) continue;
          ++admitted;
          std::vector<Schedule> schedules;
          for (int r = 0; r < p; ++r) {
            Params params = params_of(c.collective, p, count, chunk_bytes);
            params.rank = r;
            schedules.push_back(make(c.algorithm, params));
          }
          const std::uint32_t all = (1u << p) - 1;
          auto check_side = [&](std::uint32_t side) {
            EXPECT_TRUE(sends_across(schedules, side))
                << name_of(c) << " p=" << p << " count=" << count << " chunk_bytes=" << chunk_bytes
                << ": the ranks of mask 0x" << std::hex << side << std::dec << " never send to the others";
          };
          if (p <= 9) {
            for (std::uint32_t side = 1; side < all; ++side) check_side(side);
          } else {
            for (int k = 0; k < 2000; ++k) {
              seed = seed * 6364136223846793005u + 1442695040888963407u;
              const auto side = static_cast<std::uint32_t>(seed >> 33) & all;
              if (side != 0 && side != all) check_side(side);
            }
          }
        }
  EXPECT_GT(admitted, 150);
  EXPECT_TRUE(messages_cross_every_cut(Algorithm::recursive_doubling, Collective::allreduce, 1, 4));
  EXPECT_TRUE(messages_cross_every_cut(Algorithm::recursive_doubling, Collective::allreduce, 1, 16));
  EXPECT_TRUE(messages_cross_every_cut(Algorithm::bruck, Collective::barrier, 0, 3));
  EXPECT_TRUE(messages_cross_every_cut(Algorithm::recursive_doubling, Collective::barrier, 0, 8));
  EXPECT_FALSE(messages_cross_every_cut(Algorithm::recursive_doubling, Collective::barrier, 0, 6));
  // And the rule is not loose: where it says no, a division that is never crossed exists.
  for (int p : {3, 5, 6, 7}) {
    EXPECT_FALSE(messages_cross_every_cut(Algorithm::recursive_doubling, Collective::allreduce, 100, p));
    std::vector<Schedule> schedules;
    for (int r = 0; r < p; ++r) {
      Params params;
      params.collective = Collective::allreduce;
      params.rank = r;
      params.size = p;
      params.count = 100;
      schedules.push_back(make(Algorithm::recursive_doubling, params));
    }
    bool uncrossed = false;
    for (std::uint32_t side = 1; side < (1u << p) - 1 && !uncrossed; ++side) uncrossed = !sends_across(schedules, side);
    EXPECT_TRUE(uncrossed) << "recursive doubling at p=" << p;
  }
  EXPECT_FALSE(messages_cross_every_cut(Algorithm::ring, Collective::broadcast, 100, 4));
  EXPECT_FALSE(messages_cross_every_cut(Algorithm::pairwise, Collective::alltoallv, 100, 4));
  EXPECT_FALSE(messages_cross_every_cut(Algorithm::pairwise, Collective::alltoall, 0, 4));
  EXPECT_FALSE(messages_cross_every_cut(Algorithm::recursive_doubling, Collective::allreduce, 0, 4));
}

TEST(Allgatherv, IrregularCountsWithZeros) {
  for (int p : kSizes) {
    const auto n = static_cast<std::size_t>(p);
    std::vector<std::vector<std::size_t>> patterns{
        std::vector<std::size_t>(n, 0),  // nothing at all
    };
    std::vector<std::size_t> one(n, 0), mixed(n), ramp(n);
    one[n - 1] = 5;
    for (std::size_t i = 0; i < n; ++i) {
      mixed[i] = i % 3 == 1 ? 0 : (i * 7 + 3) % 11;
      ramp[i] = i;
    }
    patterns.insert(patterns.end(), {one, mixed, ramp});
    for (const auto& counts : patterns)
      for (Algorithm a : algorithms_for(Collective::allgatherv))
        for (bool in_place : {false, true})
          for (std::size_t chunk_bytes : {std::size_t{4}, std::size_t{1} << 18}) {
            Params params{
                .collective = Collective::allgatherv, .size = p, .counts = counts, .chunk_bytes = chunk_bytes};
            EXPECT_EQ(check(a, params, {.in_place = in_place}), "") << tutti::to_string(a) << " p=" << p;
          }
  }
}

TEST(Generators, ChunkingPipelinesTheRing) {
  // 97 four-byte elements in 8-byte chunks: each ring step moves many small messages.
  const Params params{.collective = Collective::allreduce, .rank = 0, .size = 4, .count = 97, .chunk_bytes = 8};
  const Schedule s = make(Algorithm::ring, params);
  std::size_t sends = 0;
  for (const Step& step : s.steps) sends += step.kind == StepKind::send;
  EXPECT_GT(sends, 2u * 3u * 4u);
  for (const Step& step : s.steps) EXPECT_LE(step.region.count, 2u);
}

TEST(Generators, SingleRankIsACopy) {
  for (Collective c : {Collective::allreduce, Collective::reduce_scatter, Collective::allgather})
    for (Algorithm a : algorithms_for(c)) {
      const Params params{.collective = c, .size = 1, .count = 10};
      const Schedule s = make(a, params);
      ASSERT_EQ(s.steps.size(), 1u) << to_string(c) << "/" << tutti::to_string(a);
      EXPECT_EQ(s.steps[0].kind, StepKind::copy);
    }
}

TEST(Fold, PairsTheFirstRanksAndMapsVirtualRanks) {
  // p = 6: pof2 4, rest 2; ranks 0,2 sit out; 1,3 are virtual 0,1; 4,5 are virtual 2,3.
  const std::vector<int> vranks{-1, 0, -1, 1, 2, 3};
  for (int r = 0; r < 6; ++r) {
    const Fold f = fold(r, 6);
    EXPECT_EQ(f.pof2, 4);
    EXPECT_EQ(f.steps, 2);
    EXPECT_EQ(f.vrank, vranks[static_cast<std::size_t>(r)]);
    if (f.vrank >= 0) {
      EXPECT_EQ(f.real(f.vrank), r);
    }
    EXPECT_EQ(f.partner, r < 4 ? (r % 2 == 0 ? r + 1 : r - 1) : -1);
  }
  const Fold f = fold(0, 6);
  EXPECT_EQ(f.first(0), 0);
  EXPECT_EQ(f.first(1), 2);
  EXPECT_EQ(f.first(2), 4);
  EXPECT_EQ(f.first(4), 6);
  EXPECT_FALSE(fold(3, 8).folded());
}

// ---- the checker catches defects ----

Params two_ranks(Collective c, std::size_t count) { return Params{.collective = c, .size = 2, .count = count}; }

// A correct 2-rank allreduce: exchange inputs, reduce into output.
std::vector<Schedule> exchange_allreduce(std::size_t count) {
  std::vector<Schedule> s(2);
  for (int r = 0; r < 2; ++r) {
    s[static_cast<std::size_t>(r)].send(1 - r, {Buffer::input, 0, count});
    s[static_cast<std::size_t>(r)].recv_reduce(1 - r, {Buffer::scratch, 0, count}, {Buffer::input, 0, count});
    s[static_cast<std::size_t>(r)].copy({Buffer::output, 0, count}, {Buffer::scratch, 0, count}, {0, 1});
    s[static_cast<std::size_t>(r)].scratch_count = count;
  }
  return s;
}

TEST(Checker, AcceptsACorrectHandBuiltSchedule) {
  EXPECT_EQ(check_schedules(exchange_allreduce(5), two_ranks(Collective::allreduce, 5)), "");
  EXPECT_EQ(check_schedules(exchange_allreduce(5), two_ranks(Collective::allreduce, 5), {.in_place = true}), "");
}

TEST(Checker, CatchesAMissingDepRace) {
  auto s = exchange_allreduce(5);
  s[1].steps[2].deps = {1};  // the copy into output no longer waits for the send of input
  EXPECT_EQ(check_schedules(s, two_ranks(Collective::allreduce, 5)), "");  // harmless out of place
  const std::string defect = check_schedules(s, two_ranks(Collective::allreduce, 5), {.in_place = true});
  EXPECT_NE(defect.find("race on rank 1"), std::string::npos) << defect;
}

TEST(Checker, CatchesAWrongCount) {
  auto s = exchange_allreduce(5);
  s[0].steps[0].region.count = 4;
  const std::string defect = check_schedules(s, two_ranks(Collective::allreduce, 5));
  EXPECT_NE(defect.find("sends 4 elements"), std::string::npos) << defect;
}

TEST(Checker, CatchesADeadlock) {
  std::vector<Schedule> s(2);
  for (int r = 0; r < 2; ++r) {  // both receive before they send
    auto& mine = s[static_cast<std::size_t>(r)];
    const auto got = mine.recv_reduce(1 - r, {Buffer::output, 0, 3}, {Buffer::input, 0, 3});
    mine.send(1 - r, {Buffer::input, 0, 3}, {got});
  }
  const std::string defect = check_schedules(s, two_ranks(Collective::allreduce, 3));
  EXPECT_NE(defect.find("deadlock"), std::string::npos) << defect;
}

TEST(Checker, CatchesADoubleCountedContribution) {
  auto s = exchange_allreduce(5);
  // Rank 0 reduces rank 1's input a second time into its result.
  s[0].steps.push_back(Step{StepKind::recv_reduce, 1, {Buffer::output, 0, 5}, {Buffer::output, 0, 5}, {2}});
  s[1].steps.push_back(Step{StepKind::send, 0, {Buffer::input, 0, 5}, {}, {}});
  const std::string defect = check_schedules(s, two_ranks(Collective::allreduce, 5));
  EXPECT_NE(defect.find("rank 0 output[0]"), std::string::npos) << defect;
  EXPECT_NE(defect.find("extra {1:0}"), std::string::npos) << defect;
}

TEST(Checker, CatchesOutputNeverWritten) {
  auto s = exchange_allreduce(5);
  s[1].steps[2].region.count = 4;
  s[1].steps[2].operand.count = 4;
  const std::string defect = check_schedules(s, two_ranks(Collective::allreduce, 5));
  EXPECT_NE(defect.find("rank 1 output[4] holds {uninitialized}"), std::string::npos) << defect;
}

TEST(Checker, CatchesStructuralDefects) {
  const Params params = two_ranks(Collective::allreduce, 5);
  auto bad_dep = exchange_allreduce(5);
  bad_dep[0].steps[0].deps = {2};
  EXPECT_NE(check_schedules(bad_dep, params).find("does not point to an earlier step"), std::string::npos);
  auto bad_peer = exchange_allreduce(5);
  bad_peer[0].steps[0].peer = 0;
  EXPECT_NE(check_schedules(bad_peer, params).find("invalid peer"), std::string::npos);
  auto outside = exchange_allreduce(5);
  outside[0].steps[0].region.offset = 1;
  EXPECT_NE(check_schedules(outside, params).find("lies outside input"), std::string::npos);
  auto writes_input = exchange_allreduce(5);
  writes_input[0].steps[1].region = {Buffer::input, 0, 5};
  EXPECT_NE(check_schedules(writes_input, params).find("writes into input"), std::string::npos);
  auto unmatched = exchange_allreduce(5);
  unmatched[0].steps.push_back(Step{StepKind::send, 1, {Buffer::input, 0, 5}, {}, {}});
  EXPECT_NE(check_schedules(unmatched, params).find("sends 2 messages to rank 1"), std::string::npos);
}

TEST(Checker, NonRootsHaveNoOutputInReduce) {
  // Rank 1 (not the root) writes an output that does not exist for it.
  std::vector<Schedule> s(2);
  s[1].send(0, {Buffer::input, 0, 3});
  s[0].recv_reduce(1, {Buffer::output, 0, 3}, {Buffer::input, 0, 3});
  Params params = two_ranks(Collective::reduce, 3);
  EXPECT_EQ(check_schedules(s, params), "");
  s[1].copy({Buffer::output, 0, 3}, {Buffer::input, 0, 3});
  EXPECT_NE(check_schedules(s, params).find("outside output of 0 elements"), std::string::npos);
}

TEST(Checker, AlltoallvTakesAFullMatrix) {
  for (int p : {2, 3, 5}) {
    const auto n = static_cast<std::size_t>(p);
    std::vector<std::size_t> matrix(n * n), row(n, 0);
    for (std::size_t a = 0; a < n; ++a)
      for (std::size_t b = 0; b < n; ++b) matrix[a * n + b] = (a + 2 * b) % 4;  // zeros included
    const Params params{.collective = Collective::alltoallv, .size = p, .counts = row, .recv_counts = row};
    EXPECT_EQ(check(Algorithm::pairwise, params, {.alltoallv_counts = matrix}), "") << p;
  }
}

TEST(Checker, BarrierNeedsEveryRankToHearFromEveryRank) {
  std::vector<Schedule> s(3);
  s[0].send(1, {Buffer::output, 0, 0});  // 0 -> 1 -> 2 only: rank 0 may leave before 2 enters
  const auto got = s[1].recv(0, {Buffer::output, 0, 0});
  s[1].send(2, {Buffer::output, 0, 0}, {got});
  s[2].recv(1, {Buffer::output, 0, 0});
  const std::string defect = check_schedules(s, Params{.collective = Collective::barrier, .size = 3});
  EXPECT_NE(defect.find("barrier: rank 0 may leave before rank 1 enters"), std::string::npos) << defect;
}

// ---- dispatch ----

TEST(Dispatch, MakeThrowsUnsupportedExactlyWhereNoAlgorithmApplies) {
  const std::vector<Collective> collectives{Collective::allreduce, Collective::reduce,     Collective::reduce_scatter,
                                            Collective::allgather, Collective::allgatherv, Collective::broadcast,
                                            Collective::alltoall,  Collective::alltoallv,  Collective::gather,
                                            Collective::scatter,   Collective::barrier};
  const std::vector<std::size_t> counts{1, 1, 1, 1};
  for (Collective c : collectives) {
    const auto listed = algorithms_for(c);
    EXPECT_FALSE(listed.empty()) << to_string(c);
    for (int a = 0; a <= static_cast<int>(Algorithm::mpi); ++a) {
      const auto algorithm = static_cast<Algorithm>(a);
      const bool listed_here = std::find(listed.begin(), listed.end(), algorithm) != listed.end();
      EXPECT_EQ(applies(algorithm, c), listed_here);
      const Params params{.collective = c, .rank = 1, .size = 4, .count = 3, .counts = counts, .recv_counts = counts};
      if (listed_here) {
        EXPECT_NO_THROW(make(algorithm, params)) << to_string(c) << "/" << tutti::to_string(algorithm);
        continue;
      }
      try {
        make(algorithm, params);
        ADD_FAILURE() << to_string(c) << "/" << tutti::to_string(algorithm) << " did not throw";
      } catch (const Error& e) {
        EXPECT_EQ(e.code(), ErrorCode::unsupported);
        EXPECT_NE(std::string(e.what()).find(std::string(to_string(c))), std::string::npos) << e.what();
        EXPECT_NE(std::string(e.what()).find(std::string(tutti::to_string(algorithm))), std::string::npos);
      }
    }
  }
  for (Algorithm a : {Algorithm::automatic, Algorithm::direct, Algorithm::hierarchical, Algorithm::mpi})
    for (Collective c : collectives) EXPECT_FALSE(applies(a, c));
}

TEST(Dispatch, TheTable) {
  using A = Algorithm;
  EXPECT_EQ(algorithms_for(Collective::allreduce),
            (std::vector<A>{A::ring, A::recursive_doubling, A::rabenseifner, A::binomial_tree}));
  EXPECT_EQ(algorithms_for(Collective::reduce_scatter), (std::vector<A>{A::ring, A::rabenseifner}));
  EXPECT_EQ(algorithms_for(Collective::allgather), (std::vector<A>{A::ring, A::recursive_doubling, A::bruck}));
  EXPECT_EQ(algorithms_for(Collective::allgatherv), algorithms_for(Collective::allgather));
  EXPECT_EQ(algorithms_for(Collective::broadcast), (std::vector<A>{A::binomial_tree, A::ring}));
  EXPECT_EQ(algorithms_for(Collective::reduce), (std::vector<A>{A::binomial_tree, A::ring}));
  EXPECT_EQ(algorithms_for(Collective::alltoall), (std::vector<A>{A::pairwise, A::bruck}));
  EXPECT_EQ(algorithms_for(Collective::alltoallv), (std::vector<A>{A::pairwise}));
  EXPECT_EQ(algorithms_for(Collective::gather), (std::vector<A>{A::linear, A::binomial_tree}));
  EXPECT_EQ(algorithms_for(Collective::scatter), (std::vector<A>{A::linear, A::binomial_tree}));
  EXPECT_EQ(algorithms_for(Collective::barrier), (std::vector<A>{A::bruck, A::recursive_doubling}));
  EXPECT_EQ(to_string(Collective::reduce_scatter), "reduce_scatter");
}

TEST(Dispatch, MakeRejectsBadParams) {
  const Params bad_rank{.collective = Collective::allreduce, .rank = 4, .size = 4, .count = 1};
  EXPECT_THROW(make(Algorithm::ring, bad_rank), Error);
  const Params no_counts{.collective = Collective::allgatherv, .rank = 0, .size = 4};
  EXPECT_THROW(make(Algorithm::ring, no_counts), Error);
}

// ---- the cost model ----

int log2_ceil(int p) { return p <= 1 ? 0 : std::bit_width(static_cast<unsigned>(p - 1)); }
int log2_floor(int p) { return std::bit_width(static_cast<unsigned>(p)) - 1; }

Cost cost(Collective c, Algorithm a, int p, std::size_t count, double alpha, double beta, double gamma) {
  return estimate(a, Params{.collective = c, .size = p, .count = count, .elem_size = 4}, alpha, beta, gamma);
}

TEST(Estimate, OneMessage) {
  std::vector<Schedule> s(2);
  s[0].send(1, {Buffer::input, 0, 10});
  s[1].recv_reduce(0, {Buffer::output, 0, 10}, {Buffer::input, 0, 10});
  const Cost c = estimate(s, 4, 2.0, 0.5, 0.25);
  EXPECT_EQ(c.rounds, 1);
  EXPECT_EQ(c.bytes, 40);
  EXPECT_EQ(c.elements, 10);
  EXPECT_DOUBLE_EQ(c.time, 2.0 + 0.5 * 40 + 0.25 * 10);
}

// A schedule's sends in order: (peer, elements).
std::vector<std::pair<int, std::size_t>> sends_of(const Schedule& s) {
  std::vector<std::pair<int, std::size_t>> sends;
  for (const Step& step : s.steps)
    if (step.kind == StepKind::send) sends.emplace_back(step.peer, step.region.count);
  return sends;
}

// Rabenseifner's allreduce halves with the nearest rank first and doubles with the farthest first,
// so that where ranks lie in blocks on hosts only 1/L of the buffer leaves a host each way: on 8
// ranks, rank 0 sends half the buffer to rank 1, a quarter to rank 2, an eighth to rank 4, then the
// doubling in reverse; and on 2 hosts of 4 ranks (1 byte per unit of time across, nothing within)
// the hosts' links carry the buffer once each way, where recursive doubling carries it four times.
TEST(Estimate, RabenseifnerHalvesWithTheNearestRankFirst) {
  const Params params = params_of(Collective::allreduce, 8, 800, std::size_t{1} << 18);
  EXPECT_EQ(sends_of(make(Algorithm::rabenseifner, params)),
            (std::vector<std::pair<int, std::size_t>>{{1, 400}, {2, 200}, {4, 100}, {4, 100}, {2, 200}, {1, 400}}));
  const Hosts hosts{4, 0.0, 1.0};
  const double rab = estimate(Algorithm::rabenseifner, params, 0, 0, 0, hosts).time;
  EXPECT_DOUBLE_EQ(rab, 2 * 4 * 800 / 4.0 * 2);  // n/4 bytes from each of 4 ranks, each way, twice (RS and AG)
  EXPECT_DOUBLE_EQ(estimate(Algorithm::recursive_doubling, params, 0, 0, 0, hosts).time, 4 * 4 * 800.0);
}

// Where ranks lie in blocks on hosts, Rabenseifner's reduce_scatter halves with the nearest rank
// first too, over a copy of the input in that order: on 2 hosts of 4 ranks, rank 0 copies its 8
// blocks, sends 4 of them to rank 1, 2 to rank 2 and 1 to rank 4, and the hosts' links carry the
// other host's blocks once each way (4 ranks × one block), where farthest first carries four
// times that (4 ranks × four blocks in the first round).
TEST(Estimate, RabenseifnerReduceScatterHalvesWithTheNearestRankFirstOnHosts) {
  Params params = params_of(Collective::reduce_scatter, 8, 100, std::size_t{1} << 18);
  params.ranks_per_host = 4;
  const Schedule rank0 = make(Algorithm::rabenseifner, params);
  std::size_t copied = 0;
  for (const Step& step : rank0.steps)
    if (step.kind == StepKind::copy) copied += step.region.count;
  EXPECT_EQ(sends_of(rank0), (std::vector<std::pair<int, std::size_t>>{{1, 400}, {2, 200}, {4, 100}}));
  EXPECT_EQ(copied, 800u);
  EXPECT_EQ(rank0.scratch_count, 800u);
  const Hosts hosts{4, 0.0, 1.0};
  EXPECT_DOUBLE_EQ(estimate(Algorithm::rabenseifner, params, 0, 0, 0, hosts).time, 4 * 100 * 4.0);
  params.ranks_per_host = 0;  // farthest first: half the buffer from every rank across at once
  EXPECT_EQ(sends_of(make(Algorithm::rabenseifner, params)),
            (std::vector<std::pair<int, std::size_t>>{{4, 400}, {2, 200}, {1, 100}}));
  EXPECT_DOUBLE_EQ(estimate(Algorithm::rabenseifner, params, 0, 0, 0, hosts).time, 4 * 400 * 4.0);
}

// Its mirror: where ranks lie in blocks on hosts, the recursive-doubling allgather doubles with the
// farthest rank first, so that on 2 hosts of 4 ranks rank 0 sends its block to rank 4, two blocks to
// rank 2 and four to rank 1, and the links carry each host's four blocks once each way, where
// nearest first carries four times that (4 ranks × four blocks in the last round). Scratch holds
// the blocks by position and is copied into the output at the end.
TEST(Estimate, RecursiveDoublingAllgatherDoublesWithTheFarthestRankFirstOnHosts) {
  Params params = params_of(Collective::allgather, 8, 100, std::size_t{1} << 18);
  params.ranks_per_host = 4;
  const Schedule rank0 = make(Algorithm::recursive_doubling, params);
  EXPECT_EQ(sends_of(rank0), (std::vector<std::pair<int, std::size_t>>{{4, 100}, {2, 200}, {1, 400}}));
  EXPECT_EQ(rank0.scratch_count, 800u);
  const Hosts hosts{4, 0.0, 1.0};
  EXPECT_DOUBLE_EQ(estimate(Algorithm::recursive_doubling, params, 0, 0, 0, hosts).time, 4 * 100 * 4.0);
  params.ranks_per_host = 0;
  EXPECT_EQ(sends_of(make(Algorithm::recursive_doubling, params)),
            (std::vector<std::pair<int, std::size_t>>{{1, 100}, {2, 200}, {4, 400}}));
  EXPECT_DOUBLE_EQ(estimate(Algorithm::recursive_doubling, params, 0, 0, 0, hosts).time, 4 * 400 * 4.0);
}

// The messages across hosts on the critical path, where every message costs the same α (the
// path of those that take as long with the most of them): on 2 hosts of 2 ranks, both of
// dissemination's rounds carry a message between the hosts on some path, recursive doubling's
// first round stays within them; on 2 hosts of 4, dissemination crosses in all 3 rounds, recursive
// doubling in its last only.
TEST(Estimate, CountsTheMessagesAcrossHostsOnTheCriticalPath) {
  for (const auto& [p, per_host, bruck_across, doubling_across] :
       {std::tuple{4, 2, 2.0, 1.0}, std::tuple{8, 4, 3.0, 1.0}, std::tuple{8, 2, 3.0, 2.0}}) {
    const Params params = params_of(Collective::barrier, p, 0, 8);
    const Hosts hosts{per_host, 1.0, 0.0};
    const Cost bruck = estimate(Algorithm::bruck, params, 1.0, 0, 0, hosts);
    const Cost doubling = estimate(Algorithm::recursive_doubling, params, 1.0, 0, 0, hosts);
    EXPECT_DOUBLE_EQ(bruck.time, doubling.time) << "p=" << p;
    EXPECT_DOUBLE_EQ(bruck.rounds_across, bruck_across) << "p=" << p << " per host " << per_host;
    EXPECT_DOUBLE_EQ(doubling.rounds_across, doubling_across) << "p=" << p << " per host " << per_host;
    EXPECT_DOUBLE_EQ(estimate(Algorithm::bruck, params, 1.0, 0, 0).rounds_across, 0) << "one host";
  }
  // And on the busiest port: a linear gather's root takes a message from every rank of the other
  // hosts, the binomial tree's one from each host it has a child on (2 hosts x 2 and x 4 ranks:
  // one; 4 hosts x 2: two, against six).
  for (const auto& [p, per_host, linear_across, tree_across] :
       {std::tuple{4, 2, 2.0, 1.0}, std::tuple{8, 4, 4.0, 1.0}, std::tuple{8, 2, 6.0, 2.0}}) {
    Params params = params_of(Collective::gather, p, 4, 8);
    const Hosts hosts{per_host, 1.0, 0.0};
    EXPECT_DOUBLE_EQ(estimate(Algorithm::linear, params, 1.0, 0, 0, hosts).busiest_across, linear_across) << "p=" << p;
    EXPECT_DOUBLE_EQ(estimate(Algorithm::binomial_tree, params, 1.0, 0, 0, hosts).busiest_across, tree_across)
        << "p=" << p << " per host " << per_host;
  }
}

// The busiest port: a rank's sends, or its receives with their reductions, one after another.
TEST(Estimate, BusiestPortSumsARanksMessages) {
  std::vector<Schedule> s(2);
  s[0].send(1, {Buffer::input, 0, 10});
  s[1].recv_reduce(0, {Buffer::output, 0, 10}, {Buffer::input, 0, 10});
  EXPECT_DOUBLE_EQ(estimate(s, 4, 2.0, 0.5, 0.25).busiest, 2.0 + 0.5 * 40 + 0.25 * 10);
  // A reduce of 1000 f32 on 4 ranks: the tree's root receives the whole buffer twice, a chain's
  // ranks once each (one chunk: 4000 bytes is below the default chunk).
  constexpr double alpha = 1, beta = 1e-3, gamma = 1e-4;
  const double message = alpha + beta * 4000, reduced = gamma * 1000;
  EXPECT_DOUBLE_EQ(cost(Collective::reduce, Algorithm::binomial_tree, 4, 1000, alpha, beta, gamma).busiest,
                   2 * (message + reduced));
  EXPECT_DOUBLE_EQ(cost(Collective::reduce, Algorithm::ring, 4, 1000, alpha, beta, gamma).busiest, message + reduced);
  // A broadcast's root sends: twice down the tree, once down the chain.
  EXPECT_DOUBLE_EQ(cost(Collective::broadcast, Algorithm::binomial_tree, 4, 1000, alpha, beta, gamma).busiest,
                   2 * message);
  EXPECT_DOUBLE_EQ(cost(Collective::broadcast, Algorithm::ring, 4, 1000, alpha, beta, gamma).busiest, message);
}

TEST(Estimate, RejectsDeadlockAndMismatch) {
  std::vector<Schedule> s(2);
  for (int r = 0; r < 2; ++r) {
    const auto got = s[static_cast<std::size_t>(r)].recv(1 - r, {Buffer::output, 0, 1});
    s[static_cast<std::size_t>(r)].send(1 - r, {Buffer::input, 0, 1}, {got});
  }
  EXPECT_THROW(estimate(s, 4, 1, 1, 1), Error);
  s[0].steps.pop_back();
  EXPECT_THROW(estimate(s, 4, 1, 1, 1), Error);
}

TEST(Estimate, LatencyBoundRounds) {
  // With β = γ = 0 the time is α times the longest chain of messages.
  for (int p : {2, 3, 4, 5, 6, 7, 8, 9, 16}) {
    const bool pof2 = std::has_single_bit(static_cast<unsigned>(p));
    const double rd = cost(Collective::allreduce, Algorithm::recursive_doubling, p, 64, 1, 0, 0).rounds;
    if (pof2) {
      EXPECT_EQ(rd, log2_floor(p)) << p;
    }
    EXPECT_GE(rd, log2_ceil(p)) << p;
    EXPECT_LE(rd, log2_floor(p) + 2) << p;
    const double rab = cost(Collective::allreduce, Algorithm::rabenseifner, p, 64, 1, 0, 0).rounds;
    EXPECT_LE(rab, 2 * log2_floor(p) + 2) << p;
    if (pof2) {
      EXPECT_EQ(rab, 2 * log2_floor(p)) << p;
    }
    EXPECT_EQ(cost(Collective::allreduce, Algorithm::ring, p, 64, 1, 0, 0).rounds, 2 * (p - 1)) << p;
    EXPECT_EQ(cost(Collective::allgather, Algorithm::ring, p, 64, 1, 0, 0).rounds, p - 1) << p;
    EXPECT_EQ(cost(Collective::allgather, Algorithm::bruck, p, 64, 1, 0, 0).rounds, log2_ceil(p)) << p;
    EXPECT_EQ(cost(Collective::reduce_scatter, Algorithm::ring, p, 64, 1, 0, 0).rounds, p - 1) << p;
  }
}

TEST(Estimate, BandwidthOptimalAlgorithmsMoveTwoTimesPMinusOneOverP) {
  const std::size_t n = std::size_t{1} << 20;  // elements of 4 bytes
  for (int p : {2, 3, 4, 5, 8, 16}) {
    const double optimal = 2.0 * (p - 1) / p * static_cast<double>(n) * 4;
    const Cost ring = cost(Collective::allreduce, Algorithm::ring, p, n, 1e-6, 1e-9, 0);
    EXPECT_NEAR(ring.bytes, optimal, optimal * 0.01) << p;
    if (std::has_single_bit(static_cast<unsigned>(p))) {
      const Cost rab = cost(Collective::allreduce, Algorithm::rabenseifner, p, n, 1e-6, 1e-9, 0);
      EXPECT_NEAR(rab.bytes, optimal, optimal * 0.01) << p;
      const Cost rd = cost(Collective::allreduce, Algorithm::recursive_doubling, p, n, 1e-6, 1e-9, 0);
      // p = 2 has one round, which cannot reduce into output in place: one local copy more.
      const int full_volumes = log2_floor(p) + (p == 2 ? 1 : 0);
      EXPECT_NEAR(rd.bytes, full_volumes * static_cast<double>(n) * 4, 1) << p;
    }
    const Cost ag = cost(Collective::allgather, Algorithm::ring, p, n / static_cast<std::size_t>(p), 1e-6, 1e-9, 0);
    EXPECT_NEAR(ag.bytes, optimal / 2, optimal * 0.01) << p;
  }
}

TEST(Estimate, TimeIsTheSumAlongThePath) {
  for (Collective c : {Collective::allreduce, Collective::reduce_scatter, Collective::allgather})
    for (Algorithm a : algorithms_for(c))
      for (int p : {3, 8}) {
        const Cost k = cost(c, a, p, 1000, 3e-6, 2e-10, 5e-11);
        EXPECT_NEAR(k.time, 3e-6 * k.rounds + 2e-10 * k.bytes + 5e-11 * k.elements, 1e-12);
        EXPECT_GT(k.time, 0);
      }
}

TEST(Estimate, SingleRankCostsOnlyTheCopy) {
  const Cost k = cost(Collective::allreduce, Algorithm::ring, 1, 100, 1, 1, 1);
  EXPECT_EQ(k.rounds, 0);
  EXPECT_EQ(k.bytes, 400);
}

}  // namespace
}  // namespace tutti::schedule
