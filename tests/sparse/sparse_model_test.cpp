// The sparse layer's pieces and cost model, in process: the zero-filling merge, the checks on
// bytes from peers, and the algorithm choice at clear extremes.
#include <gtest/gtest.h>

#include <cstring>

#include "comm/cost_model.hpp"
#include "sparse/cost_model.hpp"
#include "sparse/piece.hpp"

namespace {

using namespace tutti;
using namespace tutti::sparse::detail;
using tutti::sparse::Algorithm;
using tutti::sparse::Form;
using tutti::sparse::IndexType;

Piece piece_of(std::vector<std::uint64_t> indices, std::vector<std::int32_t> values) {
  Piece p;
  p.indices = std::move(indices);
  p.values.resize(values.size() * 4);
  std::memcpy(p.values.data(), values.data(), p.values.size());
  return p;
}

std::vector<std::int32_t> values_of(const Piece& p) {
  std::vector<std::int32_t> out(p.values.size() / 4);
  std::memcpy(out.data(), p.values.data(), p.values.size());
  return out;
}

TEST(SparsePiece, MergeCombinesAnAbsentIndexWithZero) {
  const Layout l = layout_of(10, IndexType::u32, DataType::i32);
  const Piece a = piece_of({1, 4}, {5, -2}), b = piece_of({2, 4}, {-3, 7});
  const Piece min = merge(a, b, ReduceOp::min, l);
  EXPECT_EQ(min.indices, (std::vector<std::uint64_t>{1, 2, 4}));
  EXPECT_EQ(values_of(min), (std::vector<std::int32_t>{0, -3, -2}));
  EXPECT_EQ(values_of(merge(a, b, ReduceOp::max, l)), (std::vector<std::int32_t>{5, 0, 7}));
  EXPECT_EQ(values_of(merge(a, b, ReduceOp::sum, l)), (std::vector<std::int32_t>{5, -3, 5}));
  const Piece dense = merge(densify(a, l), b, ReduceOp::sum, l);
  ASSERT_TRUE(dense.dense);
  EXPECT_EQ(values_of(dense), (std::vector<std::int32_t>{0, 5, -3, 0, 5, 0, 0, 0, 0, 0}));
}

TEST(SparsePiece, CanonicalSortsAndCombinesDuplicatesInInputOrder) {
  const Layout l = layout_of(10, IndexType::u64, DataType::i32);
  const std::vector<std::uint64_t> indices{7, 2, 7, 0, 2};
  const std::vector<std::int32_t> values{1, 2, 3, 4, 5};
  const sparse::Vector v{.dim = 10,
                         .nnz = 5,
                         .indices = indices.data(),
                         .index_type = IndexType::u64,
                         .values = values.data(),
                         .value_type = DataType::i32};
  check_input(v, "test", 0);
  const Piece p = canonical(v, ReduceOp::sum, l);
  EXPECT_EQ(p.indices, (std::vector<std::uint64_t>{0, 2, 7}));
  EXPECT_EQ(values_of(p), (std::vector<std::int32_t>{4, 7, 4}));
}

TEST(SparsePiece, UnpackRefusesWhatAPeerMustNotSend) {
  const Layout l = layout_of(100, IndexType::u32, DataType::i32);
  std::vector<std::byte> wire;
  pack(piece_of({3, 9, 40}, {1, 2, 3}), 0, 3, l, wire);
  EXPECT_EQ(unpack(wire, 0, 100, l, "peer").indices, (std::vector<std::uint64_t>{3, 9, 40}));
  const auto code_of = [&](std::span<const std::byte> bytes, std::uint64_t lo, std::uint64_t hi) {
    try {
      unpack(bytes, lo, hi, l, "peer");
    } catch (const Error& e) {
      return static_cast<int>(e.code());
    }
    return -1;
  };
  const int invalid = static_cast<int>(ErrorCode::invalid_argument);
  EXPECT_EQ(code_of(wire, 0, 40), invalid);                                     // 40 is outside [0, 40)
  EXPECT_EQ(code_of(wire, 4, 100), invalid);                                    // 3 is below the range
  EXPECT_EQ(code_of(std::span(wire).first(wire.size() - 1), 0, 100), invalid);  // not whole pairs
  std::vector<std::byte> unsorted;
  pack(piece_of({9, 3}, {1, 2}), 0, 2, l, unsorted);
  EXPECT_EQ(code_of(unsorted, 0, 100), invalid);
  std::vector<std::byte> repeated;
  pack(piece_of({9, 9}, {1, 2}), 0, 2, l, repeated);
  EXPECT_EQ(code_of(repeated, 0, 100), invalid);
}

TEST(SparsePiece, RangesCoverTheIndexSpace) {
  for (std::size_t dim : {0, 1, 7, 100, 1000003})
    for (int p = 1; p <= 9; ++p) {
      EXPECT_EQ(range_begin(dim, 0, p), 0u);
      EXPECT_EQ(range_begin(dim, p, p), dim);
      for (int r = 0; r < p; ++r) EXPECT_LE(range_begin(dim, r, p), range_begin(dim, r + 1, p));
    }
}

Workload workload(int p, std::size_t dim, std::size_t per_rank, Form form = Form::automatic) {
  Workload w;
  w.ranks = p;
  w.dim = dim;
  w.total_nnz = per_rank * static_cast<std::size_t>(p);
  w.max_nnz = per_rank;
  w.form = form;
  return w;
}

TEST(SparseCostModel, ExpectedUnionAtTheExtremes) {
  EXPECT_DOUBLE_EQ(expected_union(workload(8, 1000, 100), 1), 100);
  EXPECT_NEAR(expected_union(workload(8, 100000000, 10), 8), 80, 1e-3);  // rare collisions
  EXPECT_DOUBLE_EQ(expected_union(workload(8, 1000, 1000), 8), 1000);    // every index everywhere
  EXPECT_DOUBLE_EQ(expected_union(workload(8, 1000, 0), 8), 0);
}

TEST(SparseCostModel, ChoicesAtClearExtremes) {
  const auto tcp = tutti::transport::default_cost(tutti::transport::Kind::tcp);
  // One pair per rank in a huge vector: latency only, and the allgather has the fewest rounds.
  EXPECT_EQ(choose(workload(8, 100000000, 1), tcp), Algorithm::allgather);
  // Half of a large vector on every rank: every rank alone is past the threshold, the result is
  // dense, and the dense allreduce moves the least.
  EXPECT_EQ(choose(workload(8, 10000000, 5000000), tcp), Algorithm::dense_allreduce);
  // The same forced to a sparse result: still the dense allreduce, the union picked out of it
  // by the gathered bitmaps (dim/8 bytes a rank), cheaper than merging 40 million pairs.
  EXPECT_EQ(choose(workload(8, 10000000, 5000000, Form::sparse), tcp), Algorithm::dense_allreduce);
  // Each rank below the threshold, but the union of 8 independent sets far past it (density 1/4
  // of a large vector, f32 and u32: dense from 1/2). On a link of 1 Gbit/s, where bytes cost
  // more than handling pairs: the dense allgather of the reduced ranges, which moves the fewest.
  // At the default TCP's 1.5 GB/s: the dense allreduce (with the bitmaps), which handles no pairs.
  const tutti::comm::choice::CostParams gigabit{60e-6, 8e-9, 2e-10};
  EXPECT_EQ(choose(workload(8, 10000000, 2500000), gigabit), Algorithm::dsar_split_allgather);
  EXPECT_EQ(choose(workload(8, 10000000, 2500000), tcp), Algorithm::dense_allreduce);
  // Sparse enough for a sparse result, but too many pairs for one round of latency to matter:
  // not the dense allreduce, which would move every value and every rank's bitmap.
  const Algorithm sparse_enough = choose(workload(8, 10000000, 10000), tcp);
  EXPECT_NE(sparse_enough, Algorithm::dense_allreduce);
  // The bitmaps are priced where the result may be sparse (and only there): the same dense
  // allreduce costs more at 20% density a rank than at 60% (dense whatever the overlap).
  EXPECT_GT(predict(Algorithm::dense_allreduce, workload(8, 10000000, 2000000), tcp),
            predict(Algorithm::dense_allreduce, workload(8, 10000000, 6000000), tcp));
  // Nothing to move, or one rank: the allgather (which sends nothing then).
  EXPECT_EQ(choose(workload(1, 1000, 500), tcp), Algorithm::allgather);
  EXPECT_EQ(choose(workload(8, 1000, 0), tcp), Algorithm::allgather);
  // The sparse algorithms' predictions grow with the pairs.
  for (Algorithm a : {Algorithm::ssar_recursive_doubling, Algorithm::ssar_split_allgather,
                      Algorithm::dsar_split_allgather, Algorithm::allgather})
    EXPECT_LT(predict(a, workload(8, 1000000, 100), tcp), predict(a, workload(8, 1000000, 10000), tcp));
}

// Hosts of several ranks on a slow link: hierarchical sends each host's union once across it,
// where the flat algorithms send each rank's pairs; with one rank a host, or one host, it is no
// candidate (nothing to merge first, or nothing to cross).
TEST(SparseCostModel, HierarchicalWhereHostsShareALink) {
  const tutti::comm::choice::CostParams gigabit{60e-6, 8e-9, 2e-10};
  const auto shm = tutti::transport::default_cost(tutti::transport::Kind::shm);
  auto hosts = [&](int count, int local, std::size_t per_rank) {
    Workload w = workload(count * local, 16000000, per_rank);
    w.hosts = count;
    w.local_size = local;
    w.local_cost = shm;
    return w;
  };
  // 2 hosts x 2 ranks, 1% a rank: the host's link carries half the bytes of the flat split.
  const Workload two_by_two = hosts(2, 2, 160000);
  EXPECT_EQ(choose(two_by_two, gigabit), Algorithm::hierarchical);
  Workload flat = two_by_two;
  flat.hosts = flat.local_size = 1;
  EXPECT_NE(choose(flat, gigabit), Algorithm::hierarchical);
  EXPECT_LT(predict(Algorithm::hierarchical, two_by_two, gigabit),
            predict(Algorithm::dsar_split_allgather, two_by_two, gigabit));
  EXPECT_EQ(choose(hosts(4, 2, 160000), gigabit), Algorithm::hierarchical);
  EXPECT_NE(choose(hosts(4, 1, 160000), gigabit), Algorithm::hierarchical);  // one rank a host
  EXPECT_NE(choose(hosts(1, 4, 160000), gigabit), Algorithm::hierarchical);  // one host
  // Its prediction needs hosts that make up the ranks.
  Workload bad = two_by_two;
  bad.hosts = 3;
  EXPECT_THROW(predict(Algorithm::hierarchical, bad, gigabit), Error);
}

}  // namespace
