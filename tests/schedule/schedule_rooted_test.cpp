// The rooted and personalized collectives' schedules (broadcast, reduce, allreduce by binomial
// tree, alltoall(v), gather, scatter, barrier), swept through the in-process checker over every
// size that breaks tree and ring arithmetic (1..9 and 16), every root, the counts that break
// block splitting, in place and out of place, and chunk sizes that force one or many chunks.
// A few structural tests pin down the round counts that make each algorithm worth having.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <numeric>
#include <ostream>
#include <string>
#include <vector>

#include "schedule/algorithms.hpp"
#include "schedule/check.hpp"

namespace tutti::schedule {
namespace {

struct Case {
  Collective collective;
  Algorithm algorithm;
};

// gtest prints a failing case's parameter with this instead of its bytes.
void PrintTo(const Case& c, std::ostream* os) {
  *os << to_string(c.collective) << "/" << tutti::to_string(c.algorithm);
}

const Case kCases[] = {
    {Collective::broadcast, Algorithm::binomial_tree},
    {Collective::broadcast, Algorithm::ring},
    {Collective::reduce, Algorithm::binomial_tree},
    {Collective::reduce, Algorithm::ring},
    {Collective::allreduce, Algorithm::binomial_tree},
    {Collective::alltoall, Algorithm::pairwise},
    {Collective::alltoall, Algorithm::bruck},
    {Collective::gather, Algorithm::linear},
    {Collective::gather, Algorithm::binomial_tree},
    {Collective::scatter, Algorithm::linear},
    {Collective::scatter, Algorithm::binomial_tree},
    {Collective::barrier, Algorithm::bruck},
    {Collective::barrier, Algorithm::recursive_doubling},
};

const int kSizes[] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 16};

bool is_rooted(Collective c) {
  return c == Collective::broadcast || c == Collective::reduce || c == Collective::gather || c == Collective::scatter;
}

bool has_in_place(Collective c) {
  return c == Collective::allreduce || c == Collective::reduce || c == Collective::gather || c == Collective::scatter;
}

std::vector<int> roots_for(Collective c, int p) {
  if (!is_rooted(c)) return {0};
  if (p <= 9) {
    std::vector<int> all(p);
    std::iota(all.begin(), all.end(), 0);
    return all;
  }
  return {0, 1, p / 2, p - 1};
}

std::vector<std::size_t> counts_for(Collective c, int p) {
  if (c == Collective::barrier) return {0};
  const auto n = static_cast<std::size_t>(p);
  return {0, 1, n - 1, n, n + 1, 97};
}

std::string describe(const Case& c, const Params& params, bool in_place) {
  return std::string(to_string(c.collective)) + "/" + std::string(tutti::to_string(c.algorithm)) +
         " p=" + std::to_string(params.size) + " root=" + std::to_string(params.root) +
         " count=" + std::to_string(params.count) + " chunk_bytes=" + std::to_string(params.chunk_bytes) +
         (in_place ? " in place" : " out of place");
}

class RootedSchedule : public ::testing::TestWithParam<Case> {};

TEST_P(RootedSchedule, CorrectForEverySizeRootCountAndChunking) {
  const Case c = GetParam();
  for (int p : kSizes) {
    for (int root : roots_for(c.collective, p)) {
      for (std::size_t count : counts_for(c.collective, p)) {
        for (std::size_t chunk_bytes : {std::size_t{8}, std::size_t{1} << 18}) {
          for (bool in_place : {false, true}) {
            if (in_place && !has_in_place(c.collective)) continue;
            Params params;
            params.collective = c.collective;
            params.size = p;
            params.root = root;
            params.count = count;
            params.elem_size = 4;
            params.chunk_bytes = chunk_bytes;
            CheckOptions options;
            options.in_place = in_place;
            ASSERT_EQ(check(c.algorithm, params, options), "") << describe(c, params, in_place);
          }
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(All, RootedSchedule, ::testing::ValuesIn(kCases),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           return std::string(to_string(info.param.collective)) + "_" +
                                  std::string(tutti::to_string(info.param.algorithm));
                         });

// ---- alltoallv ----

// send_counts[i][j]: what rank i sends to rank j; rank j's recv_counts[i] is the same number.
using Matrix = std::vector<std::vector<std::size_t>>;

Matrix irregular_counts(int p, int seed) {
  Matrix m(p, std::vector<std::size_t>(p));
  for (int i = 0; i < p; ++i)
    for (int j = 0; j < p; ++j)
      m[i][j] = static_cast<std::size_t>((i * 7 + j * 3 + seed * 5 + i * j) % 6);  // zeros too
  return m;
}

TEST(AlltoallvPairwise, CorrectForIrregularCountsWithZeros) {
  for (int p : kSizes) {
    for (int seed = 0; seed < 4; ++seed) {
      const Matrix m = irregular_counts(p, seed);
      std::vector<std::size_t> flat;
      for (const auto& row : m) flat.insert(flat.end(), row.begin(), row.end());
      Params params;
      params.collective = Collective::alltoallv;
      params.size = p;
      CheckOptions options;
      options.alltoallv_counts = flat;
      EXPECT_EQ(check(Algorithm::pairwise, params, options), "") << "p=" << p << " seed=" << seed;
    }
  }
}

TEST(AlltoallvPairwise, ZeroCountPairsExchangeNothing) {
  const int p = 4;
  const std::vector<std::size_t> send = {1, 0, 2, 0}, recv = {3, 0, 2, 0};  // rank 2's view
  Params params;
  params.collective = Collective::alltoallv;
  params.size = p;
  params.rank = 2;
  params.counts = send;
  params.recv_counts = recv;
  const Schedule s = alltoall_pairwise(params);
  for (const Step& step : s.steps) {
    EXPECT_NE(step.peer, 1);
    EXPECT_NE(step.peer, 3);
  }
  ASSERT_EQ(s.steps.size(), 3u);  // own copy, send to 0, recv from 0
  EXPECT_EQ(s.steps[0].kind, StepKind::copy);
  EXPECT_EQ(s.steps[0].region.offset, 3u);   // output block of rank 2 after 3 + 0 elements
  EXPECT_EQ(s.steps[0].operand.offset, 1u);  // input block for rank 2 after 1 + 0 elements
}

// ---- structure: the round counts each algorithm exists for ----

int log2_ceil(int p) { return static_cast<int>(std::bit_width(static_cast<unsigned>(p - 1))); }

int count_kind(const Schedule& s, StepKind kind) {
  int n = 0;
  for (const Step& step : s.steps) n += step.kind == kind ? 1 : 0;
  return n;
}

Params rooted_params(Collective c, int p, int rank, int root, std::size_t count) {
  Params params;
  params.collective = c;
  params.size = p;
  params.rank = rank;
  params.root = root;
  params.count = count;
  return params;
}

TEST(RootedStructure, BinomialRootsTalkToCeilLog2PChildren) {
  for (int p : kSizes) {
    const int root = p / 2;
    EXPECT_EQ(
        count_kind(broadcast_binomial_tree(rooted_params(Collective::broadcast, p, root, root, 5)), StepKind::send),
        log2_ceil(p));
    EXPECT_EQ(
        count_kind(reduce_binomial_tree(rooted_params(Collective::reduce, p, root, root, 5)), StepKind::recv_reduce),
        log2_ceil(p));
    EXPECT_EQ(count_kind(gather_binomial_tree(rooted_params(Collective::gather, p, root, root, 5)), StepKind::recv),
              log2_ceil(p));
    EXPECT_EQ(count_kind(scatter_binomial_tree(rooted_params(Collective::scatter, p, root, root, 5)), StepKind::send),
              log2_ceil(p));
  }
}

TEST(RootedStructure, ChainsForwardEveryChunk) {
  Params params = rooted_params(Collective::broadcast, 5, 3, 1, 100);
  params.chunk_bytes = 40;  // 10 elements of 4 bytes: 10 chunks
  const Schedule b = broadcast_ring(params);
  EXPECT_EQ(count_kind(b, StepKind::recv), 10);
  EXPECT_EQ(count_kind(b, StepKind::send), 10);
  params.collective = Collective::reduce;
  const Schedule r = reduce_ring(params);
  EXPECT_EQ(count_kind(r, StepKind::recv_reduce), 10);
  EXPECT_EQ(count_kind(r, StepKind::send), 10);
}

// fit_chunks: a chain's chunk is sqrt(n·α / ((p−2)·β)), at least 16 KiB, never above the default;
// other algorithms, p = 2 and messages of at most 16 KiB keep theirs.
TEST(RootedStructure, ChainChunksFollowTheLink) {
  const std::size_t standard = Params{}.chunk_bytes;
  auto fitted = [](Collective c, Algorithm a, int p, std::size_t count, double alpha, double beta) {
    Params params = rooted_params(c, p, 0, 0, count);
    fit_chunks(params, a, alpha, beta);
    return params.chunk_bytes;
  };
  // 1 MiB over a 1 Gbit/s link (β = 8 ns/B) with α = 8 µs on 4 ranks: sqrt(2^20 · 1000 / 2) bytes.
  const auto expected = static_cast<std::size_t>(std::sqrt(double(1 << 20) * 8e-6 / (2 * 8e-9)));
  EXPECT_EQ(expected, 22897u);
  for (Collective c : {Collective::broadcast, Collective::reduce}) {
    EXPECT_EQ(fitted(c, Algorithm::ring, 4, 1 << 18, 8e-6, 8e-9), expected) << to_string(c);
    EXPECT_EQ(fitted(c, Algorithm::ring, 4, 1 << 14, 1e-9, 8e-9), std::size_t{16384}) << to_string(c);  // floor
    EXPECT_EQ(fitted(c, Algorithm::ring, 4, 1 << 18, 1e-3, 1e-12), standard) << to_string(c);           // ceiling
    EXPECT_EQ(fitted(c, Algorithm::ring, 2, 1 << 18, 8e-6, 8e-9), standard) << to_string(c);            // no chain
    EXPECT_EQ(fitted(c, Algorithm::ring, 4, 4096, 1e-9, 8e-9), standard) << to_string(c);               // 16 KiB
    EXPECT_EQ(fitted(c, Algorithm::ring, 4, 1 << 18, 0, 8e-9), standard) << to_string(c);               // no costs
    EXPECT_EQ(fitted(c, Algorithm::binomial_tree, 4, 1 << 18, 8e-6, 8e-9), standard) << to_string(c);
  }
  EXPECT_EQ(fitted(Collective::allreduce, Algorithm::ring, 4, 1 << 18, 8e-6, 8e-9), standard);
  // The chain then moves 1 MiB in ceil(2^20 / 22896) = 46 chunks.
  Params params = rooted_params(Collective::broadcast, 4, 1, 0, 1 << 18);
  fit_chunks(params, Algorithm::ring, 8e-6, 8e-9);
  EXPECT_EQ(count_kind(broadcast_ring(params), StepKind::recv), 46);
}

TEST(RootedStructure, NonRootsOfReduceAndGatherNeverTouchOutput) {
  for (int p : kSizes) {
    for (int rank = 0; rank < p; ++rank) {
      if (rank == 1 % p) continue;  // the root
      for (const Schedule& s : {reduce_binomial_tree(rooted_params(Collective::reduce, p, rank, 1 % p, 7)),
                                reduce_ring(rooted_params(Collective::reduce, p, rank, 1 % p, 7)),
                                gather_binomial_tree(rooted_params(Collective::gather, p, rank, 1 % p, 7)),
                                gather_linear(rooted_params(Collective::gather, p, rank, 1 % p, 7))}) {
        for (const Step& step : s.steps) {
          EXPECT_NE(step.region.buffer, Buffer::output) << "p=" << p << " rank=" << rank;
          if (step.kind == StepKind::copy || step.kind == StepKind::recv_reduce) {
            EXPECT_NE(step.operand.buffer, Buffer::output) << "p=" << p << " rank=" << rank;
          }
        }
      }
    }
  }
}

bool same_region(const Region& a, const Region& b) {
  return a.buffer == b.buffer && a.offset == b.offset && a.count == b.count;
}

// Scatter is generated as gather's mirror: mirroring twice must give back every step as it was.
TEST(Mirror, TwiceGivesBackTheSchedule) {
  for (int p : kSizes)
    for (int rank = 0; rank < p; ++rank)
      for (const Schedule& s : {gather_binomial_tree(rooted_params(Collective::gather, p, rank, p / 2, 3)),
                                gather_linear(rooted_params(Collective::gather, p, rank, p / 2, 3))}) {
        const Schedule back = mirror(mirror(s));
        ASSERT_EQ(back.steps.size(), s.steps.size()) << "p=" << p << " rank=" << rank;
        EXPECT_EQ(back.scratch_count, s.scratch_count);
        for (std::size_t i = 0; i < s.steps.size(); ++i) {
          const Step &a = s.steps[i], &b = back.steps[i];
          EXPECT_TRUE(a.kind == b.kind && a.peer == b.peer && same_region(a.region, b.region) &&
                      same_region(a.operand, b.operand) && a.deps == b.deps)
              << "p=" << p << " rank=" << rank << " step " << i;
        }
      }
}

TEST(Mirror, ARecvReduceHasNone) {
  EXPECT_THROW(mirror(reduce_binomial_tree(rooted_params(Collective::reduce, 4, 0, 0, 5))), Error);
}

TEST(RootedStructure, BruckAndDisseminationTakeCeilLog2PRounds) {
  for (int p : kSizes) {
    Params params = rooted_params(Collective::alltoall, p, p - 1, 0, 3);
    EXPECT_EQ(count_kind(alltoall_bruck(params), StepKind::send), log2_ceil(p)) << "p=" << p;
    params.collective = Collective::barrier;
    const Schedule b = barrier_dissemination(params);
    EXPECT_EQ(count_kind(b, StepKind::send), log2_ceil(p)) << "p=" << p;
    EXPECT_EQ(count_kind(b, StepKind::recv), log2_ceil(p)) << "p=" << p;
  }
}

// Recursive doubling's barrier: log2 p exchanges on a power of two, the first with the nearest
// rank (rank ^ 1), so that ranks in blocks on hosts exchange within their host first; beyond a
// power of two, the even rank of each of the first 2·rest pairs only signals its neighbour and
// waits for its release, and the neighbour exchanges those two messages besides its rounds.
TEST(RootedStructure, RecursiveDoublingBarrierPairsTheNearestRanksFirst) {
  for (int p : kSizes) {
    const int pof2 = static_cast<int>(std::bit_floor(static_cast<unsigned>(p))), rest = p - pof2;
    const int rounds = static_cast<int>(std::countr_zero(static_cast<unsigned>(pof2)));
    for (int r = 0; r < p; ++r) {
      Params params = rooted_params(Collective::barrier, p, r, 0, 0);
      const Schedule b = barrier_recursive_doubling(params);
      const bool sits_out = r < 2 * rest && r % 2 == 0, folds = r < 2 * rest && r % 2 == 1;
      const int messages = sits_out ? 1 : rounds + (folds ? 1 : 0);
      EXPECT_EQ(count_kind(b, StepKind::send), messages) << "p=" << p << " r=" << r;
      EXPECT_EQ(count_kind(b, StepKind::recv), messages) << "p=" << p << " r=" << r;
      if (rest == 0 && p > 1) {
        EXPECT_EQ(b.steps.front().peer, r ^ 1) << "p=" << p << " r=" << r;
        EXPECT_EQ(b.steps.back().peer, r ^ (pof2 / 2)) << "p=" << p << " r=" << r;
      }
    }
  }
}

// The exchange steps of a pairwise alltoall on rank 2 of 6: step k (to rank 2 + k, from 2 - k)
// and the peers of the steps it waits for.
std::vector<std::pair<int, std::vector<int>>> pairwise_waits(std::size_t count) {
  const Schedule s = alltoall_pairwise(rooted_params(Collective::alltoall, 6, 2, 0, count));
  EXPECT_EQ(count_kind(s, StepKind::send), 5);
  EXPECT_EQ(count_kind(s, StepKind::recv), 5);
  std::vector<std::pair<int, std::vector<int>>> waits;
  for (const Step& step : s.steps) {
    if (step.kind != StepKind::send) continue;
    std::vector<int> peers;
    for (std::uint32_t dep : step.deps) peers.push_back(s.steps[dep].peer);
    std::sort(peers.begin(), peers.end());
    waits.emplace_back(step.peer, peers);
  }
  return waits;
}

TEST(RootedStructure, PairwiseChainsLargeBlocksAndSendsSmallOnesTogether) {
  using Waits = std::vector<std::pair<int, std::vector<int>>>;
  // 64 KiB blocks (above the 32 KiB in flight): each exchange waits for the one before (its send
  // to 2 + k - 1 and its receive from 2 - k + 1).
  EXPECT_EQ(pairwise_waits(16384), (Waits{{3, {}}, {4, {1, 3}}, {5, {0, 4}}, {0, {5, 5}}, {1, {0, 4}}}));
  // 8 KiB blocks: four in flight, so step 5 (to rank 1, from 3) waits for step 1 (to 3, from 1).
  EXPECT_EQ(pairwise_waits(2048), (Waits{{3, {}}, {4, {}}, {5, {}}, {0, {}}, {1, {1, 3}}}));
  // 16-byte blocks: all five at once.
  EXPECT_EQ(pairwise_waits(4), (Waits{{3, {}}, {4, {}}, {5, {}}, {0, {}}, {1, {}}}));
}

}  // namespace
}  // namespace tutti::schedule
