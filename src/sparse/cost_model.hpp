// The cost model behind sparse::Algorithm::automatic: predicted seconds of each algorithm from
// what every rank knows after the descriptor exchange (p, dim, every rank's nnz) and the
// transport's α/β/γ from the comm layer's model (comm/cost_model.hpp), plus one measured constant
// (the time to handle a pair; cost_model.cpp says why it is not a multiple of γ).
// The overlap of the ranks' index sets is not known before merging; the model expects that of
// independent uniformly random sets (SparCML's estimate), bounded below by the largest nnz.
#pragma once

#include <cstddef>

#include "comm/cost_model.hpp"
#include "tutti/sparse.hpp"

namespace tutti::sparse::detail {

struct Workload {
  int ranks = 1;
  std::size_t dim = 0;
  std::size_t total_nnz = 0;  // summed over ranks (each rank's canonical nnz)
  std::size_t max_nnz = 0;
  std::size_t index_bytes = 4;
  std::size_t value_bytes = 4;
  Form form = Form::automatic;
  /// Where the ranks live: `hosts` hosts of `local_size` ranks each (hosts · local_size == ranks),
  /// the ranks of a host joined at `local_cost`. With at least two hosts of at least two ranks,
  /// hierarchical is a candidate, every algorithm's bytes across hosts are priced with the host's
  /// link shared by its ranks, and dense_allreduce's as the hierarchical dense allreduce's.
  int hosts = 1;
  int local_size = 1;
  tutti::comm::choice::CostParams local_cost{};
};

/// Expected size of the union of m ranks' index sets: dim·(1 − (1 − n/dim)^m) with n the mean
/// nnz, at least max_nnz when m covers every rank, at most min(dim, m·n).
double expected_union(const Workload& w, int m);

/// Predicted seconds of `algorithm` (not automatic); `cost` prices the links between hosts
/// (between every two ranks for the flat algorithms). Error(invalid_argument) for automatic, and
/// for hierarchical on a workload whose hosts and local_size do not make up its ranks.
double predict(Algorithm algorithm, const Workload& w, const tutti::comm::choice::CostParams& cost);

/// The algorithm with the least predicted time; the earlier one in the enum on a tie. p = 1 or
/// an empty workload: allgather (it sends nothing then). Every algorithm is a candidate: where
/// the result may be sparse, dense_allreduce is priced with the gather of the index bitmaps;
/// hierarchical where the workload's hosts say it may run.
Algorithm choose(const Workload& w, const tutti::comm::choice::CostParams& cost);

}  // namespace tutti::sparse::detail
