// Sparse collectives (include/tutti/sparse.hpp), ranks as threads: exact results against a dense
// reference for every algorithm, p = 1..8, nnz from 0 to dim, every index pattern, duplicates and
// unsorted input, the dense switch on both sides of the threshold, forced forms, every value type,
// both index types and every op; nonblocking calls; bad input and disagreeing ranks.
#include <gtest/gtest.h>

#include <atomic>
#include <functional>

#include "comm/access.hpp"
#include "comm/comm_impl.hpp"
#include "comm/cost_model.hpp"
#include "comm/tuning.hpp"
#include "harness.hpp"
#include "sparse/algorithms.hpp"
#include "sparse/cost_model.hpp"
#include "sparse_cases.hpp"

namespace {

using namespace tutti;
using namespace tutti::testing;
using namespace tutti::testing::sparse_cases;
using tutti::sparse::Algorithm;
using tutti::sparse::Form;
using tutti::sparse::IndexType;

// Runs `cases` (each made for p ranks) on one local group of p, every rank checking its result;
// `setup` first runs on each rank's communicator (e.g. to give the rank a host).
std::string run_all(
    int p, const std::vector<Case>& cases, const std::function<void(Communicator&)>& setup = [](Communicator&) {}) {
  return run_ranks(p, [&](Communicator& comm) {
    setup(comm);
    for (const Case& c : cases) {
      const std::string error = run_case(comm, c);
      if (!error.empty()) throw std::runtime_error(error);
    }
  });
}

TEST(SparseAllreduce, EveryAlgorithmEveryPatternAndNnz) {
  for (int p = 1; p <= 8; ++p) {
    std::vector<Case> cases;
    for (Algorithm a : all_algorithms)  // an empty vector, and one of a single element
      for (std::size_t dim : {std::size_t{0}, std::size_t{1}})
        cases.push_back(Case{.p = p, .dim = dim, .nnz = dim, .pattern = Pattern::identical, .algorithm = a});
    for (Algorithm a : all_algorithms)
      for (Pattern pattern : {Pattern::disjoint, Pattern::identical, Pattern::overlapping})
        for (std::size_t nnz : {std::size_t{0}, std::size_t{1}, std::size_t{4}, std::size_t{13}, std::size_t{37}})
          for (bool messy : {false, true})
            cases.push_back(Case{.p = p,
                                 .dim = 37,
                                 .nnz = nnz,
                                 .pattern = pattern,
                                 .duplicates = messy,
                                 .shuffled = messy,
                                 .algorithm = a});
    EXPECT_EQ(run_all(p, cases), "") << "p = " << p;
  }
}

TEST(SparseAllreduce, EveryValueTypeIndexTypeAndOp) {
  for (int p : {3, 4}) {
    std::vector<Case> cases;
    for (DataType t : {DataType::i8, DataType::u8, DataType::i32, DataType::u32, DataType::i64, DataType::u64,
                       DataType::f16, DataType::bf16, DataType::f32, DataType::f64})
      for (IndexType it : {IndexType::u32, IndexType::u64})
        for (ReduceOp op : {ReduceOp::sum, ReduceOp::min, ReduceOp::max, ReduceOp::avg, ReduceOp::prod})
          for (Algorithm a : all_algorithms)
            cases.push_back(Case{.p = p,
                                 .dim = 41,
                                 .nnz = 9,
                                 .pattern = Pattern::overlapping,
                                 .duplicates = op != ReduceOp::prod,
                                 .shuffled = true,
                                 .value_type = t,
                                 .index_type = it,
                                 .op = op,
                                 .algorithm = a});
    EXPECT_EQ(run_all(p, cases), "") << "p = " << p;
  }
}

// dim 100, f32 values, u32 indices: dense once the union holds 50 indices. Disjoint sets make the
// union exactly p · nnz. Also u64 indices with i8 values (dense from 12 of 100: 9 bytes a pair).
TEST(SparseAllreduce, DenseSwitchOnEitherSideOfTheThreshold) {
  for (int p : {2, 5}) {
    std::vector<Case> cases;
    for (Algorithm a : all_algorithms) {
      for (std::size_t union_size : {std::size_t{49}, std::size_t{50}}) {
        if (union_size % p != 0) continue;
        cases.push_back(Case{.p = p, .dim = 100, .nnz = union_size / p, .pattern = Pattern::disjoint, .algorithm = a});
      }
      if (p == 5) {  // 45 sparse and 55 dense, as 9 and 11 per rank
        cases.push_back(Case{.p = p, .dim = 100, .nnz = 9, .pattern = Pattern::disjoint, .algorithm = a});
        cases.push_back(Case{.p = p, .dim = 100, .nnz = 11, .pattern = Pattern::disjoint, .algorithm = a});
      }
      for (std::size_t nnz : {std::size_t{11}, std::size_t{12}})  // identical sets: the union is nnz
        cases.push_back(Case{.p = p,
                             .dim = 100,
                             .nnz = nnz,
                             .pattern = Pattern::identical,
                             .value_type = DataType::i8,
                             .index_type = IndexType::u64,
                             .algorithm = a});
    }
    for (const Case& c : cases) {
      // The cases themselves must straddle the rule, or this test checks nothing.
      const std::size_t u = reference_of(c).union_indices.size();
      ASSERT_TRUE(u == 45 || u == 49 || u == 50 || u == 55 || u == 11 || u == 12) << name_of(c) << " union " << u;
    }
    EXPECT_EQ(run_all(p, cases), "") << "p = " << p;
  }
}

TEST(SparseAllreduce, ForcedForms) {
  for (int p : {1, 3, 6}) {
    std::vector<Case> cases;
    for (Algorithm a : all_algorithms) {
      // Every index on every rank, forced sparse: the union is all of dim, still as pairs.
      cases.push_back(
          Case{.p = p, .dim = 50, .nnz = 50, .pattern = Pattern::identical, .algorithm = a, .form = Form::sparse});
      cases.push_back(Case{.p = p,
                           .dim = 50,
                           .nnz = 30,
                           .pattern = Pattern::overlapping,
                           .duplicates = true,
                           .op = ReduceOp::max,
                           .algorithm = a,
                           .form = Form::sparse});
      // One index per rank, forced dense.
      cases.push_back(Case{.p = p,
                           .dim = 1000,
                           .nnz = 1,
                           .pattern = Pattern::overlapping,
                           .op = ReduceOp::min,
                           .algorithm = a,
                           .form = Form::dense});
      cases.push_back(
          Case{.p = p, .dim = 1000, .nnz = 0, .pattern = Pattern::overlapping, .algorithm = a, .form = Form::dense});
    }
    EXPECT_EQ(run_all(p, cases), "") << "p = " << p;
  }
}

// A larger vector, so that the split algorithms' ranges and the recursive doubling's mid-way
// switch see hundreds of pairs.
TEST(SparseAllreduce, LargerVectors) {
  for (int p : {4, 7}) {
    std::vector<Case> cases;
    for (Algorithm a : all_algorithms)
      for (std::size_t nnz : {std::size_t{40}, std::size_t{700}, std::size_t{3000}})
        cases.push_back(Case{.p = p,
                             .dim = 5003,
                             .nnz = nnz,
                             .pattern = Pattern::overlapping,
                             .duplicates = true,
                             .shuffled = true,
                             .value_type = DataType::i32,
                             .algorithm = a});
    EXPECT_EQ(run_all(p, cases), "") << "p = " << p;
  }
}

// Algorithm::hierarchical across emulated hosts (each rank claims one, as tests/hierarchical_test
// does): equal hosts (blocks and interleaved ranks: reduce-scatter inside, ranges across, allgather
// inside), unequal ones (through one leader a host), one rank a host; every pattern, the dense switch
// on both sides of the threshold (one rank alone past it, so that the ranges cross hosts dense, and
// only the union past it), forced forms, and ops and types whose order of combination shows.
TEST(SparseAllreduce, HierarchicalAcrossHosts) {
  struct Placement {
    int p;
    std::vector<int> host;  // of each rank
  };
  const std::vector<Placement> placements = {{4, {0, 0, 1, 1}},
                                             {4, {0, 1, 0, 1}},
                                             {6, {0, 0, 0, 1, 1, 1}},
                                             {6, {0, 1, 2, 0, 1, 2}},
                                             {8, {0, 0, 1, 1, 2, 2, 3, 3}},
                                             {3, {0, 0, 1}},
                                             {5, {0, 0, 1, 2, 2}},
                                             {7, {0, 1, 2, 0, 1, 2, 0}},
                                             {3, {0, 1, 2}},
                                             {2, {0, 1}}};
  for (const Placement& placement : placements) {
    const int p = placement.p;
    std::vector<Case> cases;
    for (Algorithm a : {Algorithm::hierarchical, Algorithm::automatic}) {
      for (Pattern pattern : {Pattern::disjoint, Pattern::identical, Pattern::overlapping})
        for (std::size_t nnz : {std::size_t{0}, std::size_t{1}, std::size_t{13}, std::size_t{37}})
          for (Form form : {Form::automatic, Form::sparse, Form::dense})
            cases.push_back(Case{.p = p,
                                 .dim = 37,
                                 .nnz = nnz,
                                 .pattern = pattern,
                                 .duplicates = true,
                                 .shuffled = true,
                                 .algorithm = a,
                                 .form = form});
      for (std::size_t nnz : {std::size_t{7}, std::size_t{10}, std::size_t{12}, std::size_t{60}})  // dim 100
        for (Pattern pattern : {Pattern::disjoint, Pattern::identical})
          cases.push_back(Case{.p = p, .dim = 100, .nnz = nnz, .pattern = pattern, .algorithm = a});
      for (ReduceOp op : {ReduceOp::max, ReduceOp::avg, ReduceOp::prod})
        for (DataType t : {DataType::f32, DataType::i32, DataType::f64})
          cases.push_back(Case{.p = p,
                               .dim = 5003,
                               .nnz = 900,
                               .pattern = Pattern::overlapping,
                               .duplicates = op != ReduceOp::prod,
                               .shuffled = true,
                               .value_type = t,
                               .index_type = t == DataType::f64 ? IndexType::u64 : IndexType::u32,
                               .op = op,
                               .algorithm = a});
    }
    const std::string error = run_all(p, cases, [&](Communicator& comm) {
      tutti::comm::set_host_for_testing(comm, "host" + std::to_string(placement.host[comm.rank()]));
    });
    std::string hosts;
    for (int h : placement.host) hosts += std::to_string(h);
    EXPECT_EQ(error, "") << "hosts of the ranks " << hosts;
  }
}

// A step that fails on one rank fails the hierarchy's pair and the communicator for every rank at
// once: rank 2's communicator across hosts (with rank 0, local index 0 of hosts a and b) is
// aborted before the call, so ranks 0 and 2 fail in their step across hosts while ranks 1 and 3,
// whose step across hosts succeeds, wait inside their hosts for them. Everyone gave the call 60 s;
// ranks 1 and 3 raise within a few seconds all the same, and the communicator is failed after.
TEST(SparseAllreduce, HierarchicalStepFailureReachesTheHostPeersAtOnce) {
  const Case c{.p = 4, .dim = 101, .nnz = 20, .pattern = Pattern::overlapping, .algorithm = Algorithm::hierarchical};
  const std::string failures = run_ranks(4, [&](Communicator& comm) {
    tutti::comm::set_host_for_testing(comm, comm.rank() < 2 ? "a" : "b");
    const Input in = input_of(c, comm.rank());
    const sparse::Options options{.algorithm = Algorithm::hierarchical, .timeout = test_timeout};
    const std::string first = check(c, sparse_allreduce(comm, in.vector(), ReduceOp::sum, options), reference_of(c));
    if (!first.empty()) throw std::runtime_error("before the failure: " + first);  // (the pair is made)
    comm.barrier();
    if (comm.rank() == 2)
      tutti::comm::Access::impl(tutti::comm::Access::impl(comm)->caller_hierarchy().inter)
          ->abort_transport(Error(ErrorCode::peer_failure, "injected: rank 2's step across hosts fails"));
    const auto start = std::chrono::steady_clock::now();
    try {
      (void)sparse_allreduce(comm, in.vector(), ReduceOp::sum, options);
      ADD_FAILURE() << "rank " << comm.rank() << ": the allreduce with a failed step succeeded";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::peer_failure) << "rank " << comm.rank() << ": " << e.what();
      EXPECT_NE(std::string(e.what()).find("injected"), std::string::npos)
          << "rank " << comm.rank() << ": " << e.what();
    }
    EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5)) << "rank " << comm.rank();
    EXPECT_THROW(comm.barrier(), Error) << "rank " << comm.rank();
  });
  EXPECT_EQ(failures, "");
}

// The dense allreduce builds and reduces large vectors in pieces that overlap
// (src/sparse/dense_allreduce.cpp): with pieces of at least 1 MiB (set for the test) vectors of 2
// to 16 pieces, the last one short, then with the default (16 MiB) as one piece, every value
// type width, both index types, canonical input and input with duplicates out of order (which
// goes through the canonical copy), every op; each rank checks every element, computed here from
// the formula its peers' inputs follow (the harness's reference is too slow at this size).
TEST(SparseAllreduce, LargeDenseVectorsReducedInOverlappingPieces) {
  struct Shape {
    std::size_t dim;
    DataType type;
    IndexType index_type;
    ReduceOp op;
    bool messy;
  };
  const std::vector<Shape> shapes = {
      {(std::size_t{2} << 18) + 5, DataType::f32, IndexType::u32, ReduceOp::sum, false},   // 2 pieces + a short one
      {(std::size_t{9} << 18) + 3, DataType::f64, IndexType::u64, ReduceOp::sum, false},   // 16 pieces
      {(std::size_t{3} << 18) + 1, DataType::i32, IndexType::u32, ReduceOp::max, true},    // through the copy
      {(std::size_t{5} << 18), DataType::f32, IndexType::u64, ReduceOp::avg, false},       // divided at the end
      {(std::size_t{9} << 18) + 11, DataType::i8, IndexType::u32, ReduceOp::min, false}};  // 1-byte values
  const int p = 3;
  // Rank r holds index i when (i + r) % 4 != 0 (so every index is held by 2 or 3 ranks: a dense
  // result), with value 1 + (i * 7 + r) % 5; the messy input adds a duplicate pair of value 0 for
  // every index divisible by 8 (sum: +0; max: no change since values are at least 1), then the
  // pairs in reverse order.
  const auto holds = [](std::size_t i, int r) { return (i + static_cast<std::size_t>(r)) % 4 != 0; };
  const auto value = [](std::size_t i, int r) {
    return static_cast<double>(1 + (i * 7 + static_cast<std::size_t>(r)) % 5);
  };
  const std::size_t default_piece_bytes = tutti::sparse::detail::set_least_piece_bytes_for_testing(1 << 20);
  for (std::size_t piece_bytes : {std::size_t{1} << 20, default_piece_bytes}) {
    tutti::sparse::detail::set_least_piece_bytes_for_testing(piece_bytes);
    const std::string failures = run_ranks(p, [&](Communicator& comm) {
      const int r = comm.rank();
      for (const Shape& s : shapes) {
        const std::size_t cv = size_of(s.type), ci = s.index_type == IndexType::u32 ? 4 : 8;
        std::vector<std::pair<std::uint64_t, double>> pairs;
        for (std::size_t i = 0; i < s.dim; ++i)
          if (holds(i, r)) {
            pairs.emplace_back(i, value(i, r));
            if (s.messy && i % 8 == 0) pairs.emplace_back(i, 0.0);
          }
        if (s.messy) std::reverse(pairs.begin(), pairs.end());
        std::vector<std::byte> indices(pairs.size() * ci), values(pairs.size() * cv);
        for (std::size_t k = 0; k < pairs.size(); ++k) {
          std::memcpy(indices.data() + k * ci, &pairs[k].first, ci);  // little-endian
          store(s.type, values.data() + k * cv, pairs[k].second);
        }
        const sparse::Vector input{.dim = s.dim,
                                   .nnz = pairs.size(),
                                   .indices = indices.data(),
                                   .index_type = s.index_type,
                                   .values = values.data(),
                                   .value_type = s.type};
        const sparse::Result got = sparse_allreduce(comm, input, s.op, {.algorithm = Algorithm::dense_allreduce});
        const std::string what = "dim " + std::to_string(s.dim) + " " + std::string(to_string(s.type)) + " " +
                                 std::string(to_string(s.op)) + ": ";
        if (got.form != Form::dense || got.nnz != s.dim || got.values.size() != s.dim * cv)
          throw std::runtime_error(what + "not a dense result of dim values");
        for (std::size_t i = 0; i < s.dim; ++i) {
          double want = 0;
          bool first = true;
          for (int q = 0; q < p; ++q) {
            const double v = holds(i, q) ? value(i, q) : 0.0;
            want = first ? v : combine(s.op == ReduceOp::avg ? ReduceOp::sum : s.op, want, v);
            first = false;
          }
          if (s.op == ReduceOp::avg) want = static_cast<double>(static_cast<float>(want) / static_cast<float>(p));
          if (load(s.type, got.values.data() + i * cv) != want)
            throw std::runtime_error(what + "element " + std::to_string(i) + " is " +
                                     std::to_string(load(s.type, got.values.data() + i * cv)) + ", want " +
                                     std::to_string(want));
        }
      }
    });
    EXPECT_EQ(failures, "") << "pieces of at least " << piece_bytes << " bytes";
  }
  tutti::sparse::detail::set_least_piece_bytes_for_testing(default_piece_bytes);
}

// A Result handed back (the overloads that take one) gives exactly a fresh call's result, in any
// sequence of shapes: storage larger or smaller than the next result needs, of another value or
// index type, a dense result's storage reused for a sparse one and back, every byte of it
// overwritten with 0x7f first (what is reused must be zeroed); the object handed back is left
// empty. A large dense result goes through dense_allreduce's pieces (64 KiB here) built in the
// reused vector, through the switch of recursive doubling, and through dsar's dense allgather.
TEST(SparseAllreduce, RecycledResultsGiveFreshResults) {
  const std::size_t default_piece_bytes = tutti::sparse::detail::set_least_piece_bytes_for_testing(64 << 10);
  const std::size_t big = (std::size_t{1} << 16) + 5;
  for (int p : {1, 3, 4}) {
    const Case large{.p = p, .dim = big, .nnz = big, .pattern = Pattern::identical, .op = ReduceOp::max};
    const Reference large_reference = reference_of(large);
    std::vector<Case> cases;
    for (Algorithm a : all_algorithms) {
      const bool dense_path = a == Algorithm::automatic || a == Algorithm::dense_allreduce ||
                              a == Algorithm::ssar_recursive_doubling || a == Algorithm::dsar_split_allgather;
      if (dense_path) {  // fresh storage for the first, the first's for the second
        Case c = large;
        c.algorithm = a;
        cases.insert(cases.end(), {c, c});
      }
      cases.push_back(Case{.p = p, .dim = 61, .nnz = 20, .duplicates = true, .shuffled = true, .algorithm = a});
      cases.push_back(Case{.p = p,
                           .dim = 61,
                           .nnz = 61,
                           .pattern = Pattern::identical,
                           .value_type = DataType::f64,
                           .index_type = IndexType::u64,
                           .op = ReduceOp::max,
                           .algorithm = a,
                           .form = Form::dense});
      cases.push_back(Case{.p = p, .dim = 0, .nnz = 0, .algorithm = a});
      cases.push_back(Case{.p = p,
                           .dim = 500,
                           .nnz = 40,
                           .pattern = Pattern::disjoint,
                           .value_type = DataType::i32,
                           .op = ReduceOp::avg,
                           .algorithm = a,
                           .form = Form::sparse});
      if (dense_path) {  // large again, in the small results' storage
        Case c = large;
        c.algorithm = a;
        cases.push_back(c);
      }
    }
    const std::string failures = run_ranks(p, [&](Communicator& comm) {
      const Input large_input = input_of(large, comm.rank());
      sparse::Communicator nonblocking(comm);
      sparse::Result kept;
      for (std::size_t k = 0; k < cases.size(); ++k) {
        const Case& c = cases[k];
        const bool is_large = c.dim == big;
        const Input in = is_large ? Input{} : input_of(c, comm.rank());
        const sparse::Vector vector = is_large ? large_input.vector() : in.vector();
        std::fill(kept.values.begin(), kept.values.end(), std::byte{0x7f});
        std::fill(kept.indices.begin(), kept.indices.end(), std::byte{0x7f});
        sparse::Result handed = std::move(kept);
        const sparse::Options options{.algorithm = c.algorithm, .form = c.form};
        // Alternately the blocking call and sparse::Communicator's nonblocking one.
        sparse::Result got = k % 2 == 0 ? sparse_allreduce(comm, vector, c.op, options, std::move(handed))
                                        : nonblocking.iallreduce(vector, c.op, options, std::move(handed)).wait();
        if (!handed.values.empty() || !handed.indices.empty() || handed.nnz != 0)
          throw std::runtime_error(name_of(c) + ": the result handed back was not left empty");
        const std::string error = check(c, got, is_large ? large_reference : reference_of(c));
        if (!error.empty()) throw std::runtime_error(name_of(c) + " (call " + std::to_string(k) + "): " + error);
        kept = std::move(got);
      }
    });
    EXPECT_EQ(failures, "") << "p = " << p;
  }
  tutti::sparse::detail::set_least_piece_bytes_for_testing(default_piece_bytes);
}

// dense_allreduce where the result may be sparse (no rank past the threshold alone): the vector
// reduced in pieces as above, the ranks' index bitmaps gathered beside it, and the form decided
// by the union's size. Three ranks, dim 1.25 Mi + 7 (5 and 10 pieces of 1 MiB, then one piece of
// the default size), f32 values with u32 indices or f64 with u64:
// - "sparse": rank r holds i when i % 8 == r, and all three hold i % 16 == 4, where their values
//   (+2, -2, 0) cancel: the union (7/16 of dim) is sparse and keeps those indices with value 0;
// - "dense by the union": rank r holds i when i % 6 is r or r + 3 (a third of dim each): every
//   index is held, so the automatic form is dense, and Form::sparse gives all dim pairs.
TEST(SparseAllreduce, DenseAllreduceGivesTheFormTheUnionCalls) {
  struct Shape {
    bool spread;  // the "dense by the union" sets
    DataType type;
    IndexType index_type;
    Form form;
  };
  const std::vector<Shape> shapes = {{false, DataType::f32, IndexType::u32, Form::automatic},
                                     {false, DataType::f64, IndexType::u64, Form::automatic},
                                     {true, DataType::f32, IndexType::u32, Form::automatic},
                                     {true, DataType::f32, IndexType::u32, Form::sparse}};
  const std::size_t dim = (std::size_t{5} << 18) + 7;
  const int p = 3;
  const auto holds = [](bool spread, std::size_t i, int r) {
    const auto ur = static_cast<std::size_t>(r);
    return spread ? i % 6 == ur || i % 6 == ur + 3 : i % 8 == ur || i % 16 == 4;
  };
  const auto value = [](bool spread, std::size_t i, int r) {
    if (!spread && i % 16 == 4) return r == 0 ? 2.0 : r == 1 ? -2.0 : 0.0;
    return static_cast<double>(1 + (i * 7 + static_cast<std::size_t>(r)) % 5);
  };
  const std::size_t default_piece_bytes = tutti::sparse::detail::set_least_piece_bytes_for_testing(1 << 20);
  for (std::size_t piece_bytes : {std::size_t{1} << 20, default_piece_bytes}) {
    tutti::sparse::detail::set_least_piece_bytes_for_testing(piece_bytes);
    const std::string failures = run_ranks(p, [&](Communicator& comm) {
      const int r = comm.rank();
      for (const Shape& s : shapes) {
        const std::size_t cv = size_of(s.type), ci = s.index_type == IndexType::u32 ? 4 : 8;
        std::vector<std::byte> indices, values;
        std::size_t nnz = 0;
        for (std::size_t i = 0; i < dim; ++i)
          if (holds(s.spread, i, r)) {
            indices.resize((nnz + 1) * ci);
            values.resize((nnz + 1) * cv);
            std::memcpy(indices.data() + nnz * ci, &i, ci);  // little-endian
            store(s.type, values.data() + nnz * cv, value(s.spread, i, r));
            ++nnz;
          }
        const sparse::Vector input{.dim = dim,
                                   .nnz = nnz,
                                   .indices = indices.data(),
                                   .index_type = s.index_type,
                                   .values = values.data(),
                                   .value_type = s.type};
        const sparse::Result got =
            sparse_allreduce(comm, input, ReduceOp::sum, {.algorithm = Algorithm::dense_allreduce, .form = s.form});
        const std::string what = std::string(s.spread ? "dense by the union" : "sparse") + " " +
                                 std::string(to_string(s.type)) + " form " + std::string(to_string(s.form)) + ": ";
        const auto want = [&](std::size_t i) {
          double sum = 0;
          for (int q = 0; q < p; ++q) sum += holds(s.spread, i, q) ? value(s.spread, i, q) : 0.0;
          return sum;
        };
        const auto held = [&](std::size_t i) {
          return holds(s.spread, i, 0) || holds(s.spread, i, 1) || holds(s.spread, i, 2);
        };
        if (got.algorithm != Algorithm::dense_allreduce) throw std::runtime_error(what + "ran another algorithm");
        const bool want_dense = s.spread && s.form == Form::automatic;
        if ((got.form == Form::dense) != want_dense) throw std::runtime_error(what + "the wrong form");
        if (want_dense) {
          if (got.nnz != dim || !got.indices.empty() || got.values.size() != dim * cv)
            throw std::runtime_error(what + "not a dense result of dim values");
          for (std::size_t i = 0; i < dim; ++i)
            if (load(s.type, got.values.data() + i * cv) != want(i))
              throw std::runtime_error(what + "element " + std::to_string(i) + " differs");
          continue;
        }
        std::size_t k = 0;
        for (std::size_t i = 0; i < dim; ++i) {
          if (!held(i)) continue;
          if (k >= got.nnz) throw std::runtime_error(what + "only " + std::to_string(got.nnz) + " pairs");
          std::uint64_t index = 0;
          std::memcpy(&index, got.indices.data() + k * ci, ci);
          if (index != i)
            throw std::runtime_error(what + "pair " + std::to_string(k) + " has index " + std::to_string(index) +
                                     ", want " + std::to_string(i));
          if (load(s.type, got.values.data() + k * cv) != want(i))
            throw std::runtime_error(what + "the value at " + std::to_string(i) + " differs");
          ++k;
        }
        if (got.nnz != k || got.indices.size() != k * ci || got.values.size() != k * cv)
          throw std::runtime_error(what + std::to_string(got.nnz) + " pairs, want " + std::to_string(k));
      }
    });
    EXPECT_EQ(failures, "") << "pieces of at least " << piece_bytes << " bytes";
  }
  tutti::sparse::detail::set_least_piece_bytes_for_testing(default_piece_bytes);
}

// automatic prices the transport with the tuning file's calibrated cost model (as tutti-bench
// --calibrate writes it) where it has one: a slow link there changes the algorithm chosen.
TEST(SparseAllreduce, AutomaticUsesTheCalibratedCostModel) {
  namespace choice = tutti::comm::choice;
  const int p = 4;
  const std::size_t dim = 4096, nnz = 400;
  tutti::sparse::detail::Workload w;
  w.ranks = p, w.dim = dim, w.total_nnz = p * nnz, w.max_nnz = nnz;
  // Disjoint index sets of nnz each, so the canonical nnz are exactly nnz.
  const auto chosen_with = [&](const choice::Table& table) {
    choice::set_active(table);
    Algorithm got = Algorithm::automatic;
    const std::string failures = run_ranks(p, [&](Communicator& comm) {
      std::vector<std::uint32_t> indices(nnz);
      std::vector<float> values(nnz, 1.0f);
      for (std::size_t k = 0; k < nnz; ++k) indices[k] = static_cast<std::uint32_t>(comm.rank() + p * k);
      const auto result =
          sparse_allreduce(comm, {dim, nnz, indices.data(), IndexType::u32, values.data()}, ReduceOp::sum);
      if (comm.rank() == 0) got = result.algorithm;
    });
    EXPECT_EQ(failures, "");
    return got;
  };
  choice::Table slow;  // a link of 1 MB/s with 10 ms of latency
  slow.cost_models["inproc"] = {1e-2, 1e-6, 2e-10};
  const Algorithm by_default =
      tutti::sparse::detail::choose(w, tutti::transport::default_cost(tutti::transport::Kind::inproc));
  const Algorithm by_table = tutti::sparse::detail::choose(w, slow.cost_models["inproc"]);
  ASSERT_NE(by_default, by_table) << "pick a workload the two cost models decide differently";
  EXPECT_EQ(chosen_with(slow), by_table);
  EXPECT_EQ(chosen_with(choice::Table{}), by_default);
}

TEST(SparseAllgather, EveryRanksCanonicalPairsInRankOrder) {
  for (int p : {1, 2, 5, 8}) {
    const std::string failures = run_ranks(p, [&](Communicator& comm) {
      for (IndexType it : {IndexType::u32, IndexType::u64}) {
        const Case c{.p = p,
                     .dim = 29,
                     .nnz = 7,
                     .pattern = Pattern::overlapping,
                     .duplicates = true,
                     .shuffled = true,
                     .value_type = DataType::i64,
                     .index_type = it,
                     .op = ReduceOp::max};
        const sparse::GatherResult got = sparse_allgather(comm, input_of(c, comm.rank()).vector(), c.op);
        const std::size_t ci = it == IndexType::u32 ? 4 : 8;
        if (got.offsets.size() != static_cast<std::size_t>(p) + 1) throw std::runtime_error("offsets");
        for (int r = 0; r < p; ++r) {
          const Input in = input_of(c, r);  // its canonical pairs: the set, sorted, dense values
          if (got.offsets[r + 1] - got.offsets[r] != in.set.size()) throw std::runtime_error("block size");
          std::size_t k = got.offsets[r];
          for (std::uint64_t i : in.set) {
            std::uint64_t index = 0;
            std::memcpy(&index, got.indices.data() + k * ci, ci);
            if (index != i || load(c.value_type, got.values.data() + k * 8) != in.dense[i])
              throw std::runtime_error("rank " + std::to_string(r) + "'s pair " + std::to_string(k) + " differs");
            ++k;
          }
        }
        if (got.indices.size() != got.offsets[p] * ci || got.values.size() != got.offsets[p] * 8)
          throw std::runtime_error("buffer sizes");
      }
    });
    EXPECT_EQ(failures, "") << "p = " << p;
  }
}

// Nonblocking: requests complete in order while the caller uses the host communicator itself.
TEST(SparseCommunicator, NonblockingCallsDeliverInOrder) {
  const int p = 4;
  const std::string failures = run_ranks(p, [&](Communicator& host) {
    sparse::Communicator sparse_comm(host);
    if (sparse_comm.size() != p || sparse_comm.rank() != host.rank()) throw std::runtime_error("shape");
    std::vector<Case> cases;
    std::vector<Input> inputs;
    for (Algorithm a : all_algorithms) {
      cases.push_back(Case{.p = p, .dim = 61, .nnz = 20, .duplicates = true, .shuffled = true, .algorithm = a});
      inputs.push_back(input_of(cases.back(), host.rank()));
    }
    std::vector<sparse::Request<sparse::Result>> requests;
    for (std::size_t k = 0; k < cases.size(); ++k)
      requests.push_back(sparse_comm.iallreduce(inputs[k].vector(), cases[k].op, {.algorithm = cases[k].algorithm}));
    const Case gather_case{.p = p, .dim = 61, .nnz = 5};
    const Input gather_input = input_of(gather_case, host.rank());
    auto gathered = sparse_comm.iallgather(gather_input.vector(), ReduceOp::sum);
    // The host communicator stays free for the caller meanwhile.
    std::vector<int> ones(8, 1), sums(8, 0);
    host.allreduce(ones.data(), sums.data(), ones.size(), DataType::i32, ReduceOp::sum);
    if (sums != std::vector<int>(8, p)) throw std::runtime_error("host allreduce");
    for (std::size_t k = 0; k < cases.size(); ++k) {
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
      while (!requests[k].test())
        if (std::chrono::steady_clock::now() > deadline) throw std::runtime_error("request never completed");
      const std::string error = check(cases[k], requests[k].wait(), reference_of(cases[k]));
      if (!error.empty()) throw std::runtime_error(name_of(cases[k]) + ": " + error);
      try {
        requests[k].wait();
        throw std::runtime_error("a second wait delivered again");
      } catch (const Error& e) {
        if (e.code() != ErrorCode::invalid_argument) throw;
      }
    }
    std::size_t pairs = 0;
    for (int r = 0; r < p; ++r) pairs += input_of(gather_case, r).set.size();
    if (gathered.wait().offsets.back() != pairs) throw std::runtime_error("allgather");
    // Blocking twin, after the nonblocking ones.
    const std::string error =
        check(cases[0], sparse_comm.allreduce(inputs[0].vector(), ReduceOp::sum), reference_of(cases[0]));
    if (!error.empty()) throw std::runtime_error("blocking: " + error);
    // Moved: the new object works, the old one refuses.
    sparse::Communicator moved = std::move(sparse_comm);
    const sparse::Result after = moved.allreduce(inputs[1].vector(), ReduceOp::sum, {.algorithm = cases[1].algorithm});
    if (!check(cases[1], after, reference_of(cases[1])).empty()) throw std::runtime_error("after a move");
    try {
      (void)sparse_comm.rank();  // the refusal of a moved-from object is what is tested
      throw std::runtime_error("a moved-from sparse::Communicator answered");
    } catch (const Error& e) {
      if (e.code() != ErrorCode::invalid_argument) throw;
    }
  });
  EXPECT_EQ(failures, "");
}

// Every rank runs `call`; returns each rank's error code (-1: none) and message.
std::vector<std::pair<int, std::string>> errors_of(int p, const std::function<void(Communicator&)>& call) {
  std::vector<std::pair<int, std::string>> out(p, {-1, ""});
  const std::string failures = run_ranks(p, [&](Communicator& comm) {
    try {
      call(comm);
    } catch (const Error& e) {
      out[comm.rank()] = {static_cast<int>(e.code()), e.what()};
    }
    // The communicator must still work: a valid call afterwards.
    const Case c{.p = p, .dim = 23, .nnz = 6};
    const std::string error = run_case(comm, c);
    if (!error.empty()) throw std::runtime_error("after the error: " + error);
  });
  EXPECT_EQ(failures, "");
  return out;
}

void expect_all(const std::vector<std::pair<int, std::string>>& got, ErrorCode code, const std::string& word) {
  for (std::size_t r = 0; r < got.size(); ++r) {
    EXPECT_EQ(got[r].first, static_cast<int>(code)) << "rank " << r << ": " << got[r].second;
    EXPECT_NE(got[r].second.find(word), std::string::npos) << "rank " << r << ": " << got[r].second;
  }
}

TEST(SparseErrors, BadInputOnOneRankRaisesEverywhere) {
  const int p = 3;
  const Case c{.p = p, .dim = 23, .nnz = 6};
  // An index >= dim on rank 1.
  expect_all(errors_of(p,
                       [&](Communicator& comm) {
                         Input in = input_of(c, comm.rank());
                         if (comm.rank() == 1) {
                           const std::uint32_t bad = 23;
                           std::memcpy(in.indices.data() + 4, &bad, 4);
                         }
                         const std::vector<std::byte> values_before = in.values, indices_before = in.indices;
                         try {
                           sparse_allreduce(comm, in.vector(), ReduceOp::sum);
                         } catch (...) {
                           if (in.values != values_before || in.indices != indices_before)
                             throw std::runtime_error("input written");
                           throw;
                         }
                       }),
             ErrorCode::invalid_argument, "rank 1");
  // A null pointer with nnz > 0 on rank 2, for either collective.
  for (bool gather : {false, true})
    expect_all(errors_of(p,
                         [&](Communicator& comm) {
                           Input in = input_of(c, comm.rank());
                           sparse::Vector v = in.vector();
                           if (comm.rank() == 2) v.values = nullptr;
                           if (gather)
                             sparse_allgather(comm, v, ReduceOp::sum);
                           else
                             sparse_allreduce(comm, v, ReduceOp::sum);
                         }),
               ErrorCode::invalid_argument, "rank 2");
  // sparse_allgather takes no algorithm.
  expect_all(errors_of(p,
                       [&](Communicator& comm) {
                         const Input in = input_of(c, comm.rank());
                         sparse_allgather(comm, in.vector(), ReduceOp::sum, {.algorithm = Algorithm::allgather});
                       }),
             ErrorCode::invalid_argument, "neither");
  // An invalid enum.
  expect_all(errors_of(p,
                       [&](Communicator& comm) {
                         const Input in = input_of(c, comm.rank());
                         sparse_allreduce(
                             comm, in.vector(), ReduceOp::sum,
                             {.algorithm = comm.rank() == 0 ? static_cast<Algorithm>(99) : Algorithm::automatic});
                       }),
             ErrorCode::invalid_argument, "rank 0");
}

// A dense vector no host holds (dim 2^40 of f32: 4 TiB), forced by the form or the algorithm, is
// refused on every rank with its size in elements and bytes, before anything is allocated or
// sent (under ASan a huge malloc aborts: the check must come first); the sparse form of the same
// dim runs.
TEST(SparseErrors, ADenseVectorLargerThanMemoryIsRefusedWithItsSize) {
  const std::size_t dim = std::size_t{1} << 40;
  const std::vector<std::uint64_t> indices = {5, dim - 1};
  const std::vector<float> values = {1, 2};
  const sparse::Vector v{dim, 2, indices.data(), IndexType::u64, values.data(), DataType::f32};
  const sparse::Options forced[] = {{.form = Form::dense},
                                    {.algorithm = Algorithm::ssar_recursive_doubling, .form = Form::dense},
                                    {.algorithm = Algorithm::dense_allreduce}};
  for (const sparse::Options& options : forced) {
    const auto got = errors_of(2, [&](Communicator& comm) { sparse_allreduce(comm, v, ReduceOp::sum, options); });
    expect_all(got, ErrorCode::invalid_argument, std::to_string(dim) + " elements");
    expect_all(got, ErrorCode::invalid_argument, std::to_string(dim * 4) + " bytes");
  }
  const std::string failures = run_ranks(2, [&](Communicator& comm) {
    const sparse::Result r = sparse_allreduce(comm, v, ReduceOp::sum, {.form = Form::sparse});
    const auto i = r.indices_as<std::uint64_t>();
    const auto x = r.values_as<float>();
    if (std::vector<std::uint64_t>(i.begin(), i.end()) != indices ||
        std::vector<float>(x.begin(), x.end()) != std::vector<float>{2, 4})
      throw std::runtime_error("the sparse form of dim 2^40 gave a wrong result");
  });
  EXPECT_EQ(failures, "");
}

TEST(SparseErrors, RanksThatDisagreeRaiseMismatchEverywhere) {
  const int p = 4;
  // Rank 3's case differs from the others' in one thing; each input is valid on its own.
  using Tweak = std::function<void(Case&)>;
  const std::vector<std::pair<Tweak, std::string>> tweaks = {
      {[](Case& c) { c.dim = 24; }, "dim"},
      {[](Case& c) { c.index_type = IndexType::u64; }, "index type"},
      {[](Case& c) { c.value_type = DataType::i32; }, "value type"},
      {[](Case& c) { c.op = ReduceOp::max; }, "op"},
      {[](Case& c) { c.algorithm = Algorithm::allgather; }, "algorithm"},
      {[](Case& c) { c.form = Form::dense; }, "form"},
  };
  for (const auto& [tweak, word] : tweaks) {
    expect_all(errors_of(p,
                         [&](Communicator& comm) {
                           Case c{.p = p, .dim = 23, .nnz = 6, .pattern = Pattern::disjoint};
                           if (comm.rank() == 3) tweak(c);
                           const Input in = input_of(c, comm.rank());
                           sparse_allreduce(comm, in.vector(), c.op, {.algorithm = c.algorithm, .form = c.form});
                         }),
               ErrorCode::mismatch, word);
  }
}

}  // namespace

namespace {

// A peer that lies: rank 0 plays by hand the part of a recursive-doubling exchange (the descriptor
// allgather as src/sparse/sparse.cpp lays it out, then the size and the pairs), announcing more
// pairs than dim, or sending an index outside the vector. Rank 1 must raise invalid_argument
// naming rank 0 before it sizes a buffer from the count or writes at the index.
TEST(SparseErrors, APeerThatLiesIsRefused) {
  for (bool huge_count : {true, false}) {
    std::string rank1_error;
    const std::string failures = run_ranks(2, [&](Communicator& comm) {
      const Case c{
          .p = 2, .dim = 23, .nnz = 4, .pattern = Pattern::disjoint, .algorithm = Algorithm::ssar_recursive_doubling};
      const Input in = input_of(c, comm.rank());
      if (comm.rank() == 1) {
        try {
          sparse_allreduce(comm, in.vector(), ReduceOp::sum, {.algorithm = c.algorithm});
        } catch (const Error& e) {
          if (e.code() == ErrorCode::invalid_argument) rank1_error = e.what();
        }
        return;
      }
      // status, dim, index type, value type, op, algorithm, form, nnz
      const std::uint64_t mine[8] = {0, 23,
                                     0, static_cast<std::uint64_t>(DataType::f32),
                                     0, static_cast<std::uint64_t>(Algorithm::ssar_recursive_doubling),
                                     0, 1};
      std::uint64_t all[16];
      comm.allgather(mine, all, 8, DataType::u64);
      const std::uint64_t header = huge_count ? std::uint64_t{1} << 60 : 1;
      std::uint64_t theirs = 0;
      Request sent = comm.isend(&header, 1, DataType::u64, 1, sparse::detail::sparse_tag);
      comm.recv(&theirs, 1, DataType::u64, 1, sparse::detail::sparse_tag);
      sent.wait();
      if (huge_count) return;
      const std::uint32_t pair[2] = {99, 0x3f800000};  // index 99 of a vector of 23, value 1.0f
      std::vector<std::byte> their_pairs(theirs * 8);
      sent = comm.isend(pair, 8, DataType::u8, 1, sparse::detail::sparse_tag);
      comm.recv(their_pairs.data(), their_pairs.size(), DataType::u8, 1, sparse::detail::sparse_tag);
      sent.wait();
    });
    EXPECT_EQ(failures, "");
    EXPECT_NE(rank1_error.find(huge_count ? "announced" : "index 99"), std::string::npos) << rank1_error;
    EXPECT_NE(rank1_error.find("rank 0"), std::string::npos) << rank1_error;
  }
}

}  // namespace
