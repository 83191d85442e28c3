// The sparse collectives with ranks as processes (under tutti-run): a small sweep of every
// algorithm, index pattern and density (both sides of the dense switch), two value and index
// types, then nonblocking calls through sparse::Communicator. Every rank checks its own result
// against the dense reference; rank 0 prints "N passed, M failed" over all ranks and the exit
// status is non-zero if anything failed on any rank.
#include <cstdio>

#include "mp_tally.hpp"
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
Tally run_nonblocking(Communicator& world, const std::vector<Case>& cases) {
  sparse::Communicator comm(world);
  std::vector<Input> inputs;
  for (const Case& c : cases) inputs.push_back(input_of(c, world.rank()));
  std::vector<sparse::Request<sparse::Result>> requests;
  for (std::size_t k = 0; k < cases.size(); ++k)
    requests.push_back(comm.iallreduce(inputs[k].vector(), cases[k].op, {.algorithm = cases[k].algorithm}));
  Tally tally;
  for (std::size_t k = 0; k < cases.size(); ++k)
    tally.record("nonblocking " + name_of(cases[k]),
                 [&] { return check(cases[k], requests[k].wait(), reference_of(cases[k])); });
  return tally;
}

}  // namespace

int main() {
  try {
    Communicator world = init();
    const std::vector<Case> cases = sweep(world.size());
    Tally tally;
    for (const Case& c : cases) tally.record(name_of(c), [&] { return run_case(world, c); });
    tally += run_nonblocking(world, std::vector<Case>(cases.begin(), cases.begin() + 15));
    return finish(world, tally);
  } catch (const std::exception& e) {
    std::printf("FAIL sparse_program: %s\n", e.what());
    return 1;
  }
}
