// The sparse collectives with ranks as processes (under tutti-run): a small sweep of every
// algorithm, index pattern and density (both sides of the dense switch), two value and index
// types, then nonblocking calls through sparse::Communicator. Every rank checks its own result
// against the dense reference; rank 0 prints "N passed, M failed" over all ranks and the exit
// status is non-zero if anything failed on any rank.
#include <cstdio>

#include "sparse_cases.hpp"

namespace {

using namespace tutti;
using namespace tutti::testing;
using namespace tutti::testing::sparse_cases;
using tutti::sparse::Algorithm;
using tutti::sparse::IndexType;

std::vector<Case> sweep(int p) {
  std::vector<Case> out;
  for (Algorithm a : all_algorithms)
    for (Pattern pattern : {Pattern::disjoint, Pattern::identical, Pattern::overlapping})
      for (std::size_t nnz : {std::size_t{0}, std::size_t{1}, std::size_t{100}, std::size_t{2000}, std::size_t{10007}})
        out.push_back(Case{.p = p,
                           .dim = 10007,
                           .nnz = nnz,
                           .pattern = pattern,
                           .duplicates = true,
                           .shuffled = true,
                           .value_type = nnz == 100 ? DataType::f64 : DataType::f32,
                           .index_type = nnz == 2000 ? IndexType::u64 : IndexType::u32,
                           .op = pattern == Pattern::identical ? ReduceOp::max : ReduceOp::sum,
                           .algorithm = a});
  return out;
}

// Issues every case at once on a sparse::Communicator, then waits for them in order.
std::pair<int, int> run_nonblocking(Communicator& world, const std::vector<Case>& cases) {
  sparse::Communicator comm(world);
  std::vector<Input> inputs;
  for (const Case& c : cases) inputs.push_back(input_of(c, world.rank()));
  std::vector<sparse::Request<sparse::Result>> requests;
  for (std::size_t k = 0; k < cases.size(); ++k)
    requests.push_back(comm.iallreduce(inputs[k].vector(), cases[k].op, {.algorithm = cases[k].algorithm}));
  int passed = 0, failed = 0;
  for (std::size_t k = 0; k < cases.size(); ++k) {
    std::string error;
    try {
      error = check(cases[k], requests[k].wait(), reference_of(cases[k]));
    } catch (const std::exception& e) {
      error = std::string("exception: ") + e.what();
    }
    if (error.empty()) {
      ++passed;
    } else {
      ++failed;
      std::printf("FAIL nonblocking %s: %s\n", name_of(cases[k]).c_str(), error.c_str());
    }
  }
  return {passed, failed};
}

}  // namespace

int main() {
  try {
    Communicator world = init();
    const std::vector<Case> cases = sweep(world.size());
    int totals[2] = {0, 0};
    for (const Case& c : cases) {
      std::string error;
      try {
        error = run_case(world, c);
      } catch (const std::exception& e) {
        error = std::string("exception: ") + e.what();
      }
      ++totals[error.empty() ? 0 : 1];
      if (!error.empty()) std::printf("FAIL %s: %s\n", name_of(c).c_str(), error.c_str());
    }
    const std::vector<Case> some(cases.begin(), cases.begin() + 15);
    const auto [passed, failed] = run_nonblocking(world, some);
    totals[0] += passed;
    totals[1] += failed;
    world.allreduce(totals, totals, 2, DataType::i32, ReduceOp::sum, {{}, test_timeout});
    if (world.rank() == 0) std::printf("%d passed, %d failed\n", totals[0], totals[1]);
    return totals[1] == 0 && totals[0] > 0 ? 0 : 1;
  } catch (const std::exception& e) {
    std::printf("FAIL mp_sparse: %s\n", e.what());
    return 1;
  }
}
