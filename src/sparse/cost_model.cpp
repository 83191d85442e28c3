// Closed forms of the algorithms' critical paths in α (per message round), β (per byte) and γ (per
// combined element). The dense collectives they call are priced with their usual closed forms
// (allgather(v) in ⌈log2 p⌉ rounds, alltoall(v) in p − 1, allreduce as reduce-scatter plus
// allgather in 2⌈log2 p⌉) rather than through schedule::estimate, which simulates every chunk and
// would cost more than a small sparse call itself.
#include "sparse/cost_model.hpp"

#include <algorithm>
#include <bit>
#include <cmath>

#include "sparse/piece.hpp"

namespace tutti::sparse::detail {

namespace {

using tutti::comm::choice::CostParams;

// Handling one pair (checking and unpacking it, a merge step that branches on which side holds
// the index, packing it again) costs about 10 ns here (tutti-bench --collective sparse_allreduce --density
// 0.5 --dim 1M at p = 1 and 2 over shm, 2026-11-26), 50 times the default γ. It is branchy work
// on a core, so it is priced on its own rather than as a multiple of γ: a calibrated γ (the sum
// kernel over 48 MiB of memory on every rank at once) grows with memory contention, 8-10 times
// on the emulated cluster's 4 ranks on 2 cores, and pairs priced from it sent a 10%-dense vector
// through the dense allreduce at 1 Gbit/s, 1.7 times slower than the split algorithms
// (docs/performance.md, 2026-11-28).
constexpr double pair_seconds = 10e-9;

struct Shape {
  double p, dim, n, c, cv, threshold;  // threshold: pairs past which the dense form is smaller
  double pair;                         // seconds to handle one pair once
};

Shape shape_of(const Workload& w) {
  Shape s;
  s.p = w.ranks;
  s.dim = static_cast<double>(w.dim);
  s.n = static_cast<double>(w.total_nnz) / w.ranks;
  s.cv = static_cast<double>(w.value_bytes);
  s.c = static_cast<double>(w.index_bytes + w.value_bytes);
  s.threshold = w.form == Form::sparse ? HUGE_VAL : s.dim * s.cv / s.c;
  s.pair = pair_seconds;
  return s;
}

// Bytes of a partial merge of `pairs` pairs as it travels (dense past the threshold).
double wire_bytes(const Shape& s, double pairs) { return pairs >= s.threshold ? s.dim * s.cv : pairs * s.c; }
// Seconds to merge into a partial of `pairs` pairs (a dense kernel pass past the threshold).
double merge_time(const Shape& s, double pairs, const CostParams& k) {
  return pairs >= s.threshold ? k.gamma * s.dim : s.pair * pairs;
}
double log2_rounds(int p) { return std::ceil(std::log2(static_cast<double>(p))); }

bool hierarchical_serves(const Workload& w) {
  return w.hosts >= 2 && w.local_size >= 2 && w.hosts * w.local_size == w.ranks;
}

// The flat algorithms on hosts of L ranks: of a rank's p − 1 peers, p − L are on other hosts, and
// the L ranks of a host cross its link at once; traffic inside the host (shared memory) is taken
// as free. So a byte to an average peer costs β·L·(p − L)/(p − 1).
CostParams flat_links(const Workload& w, CostParams k) {
  if (hierarchical_serves(w)) k.beta *= static_cast<double>(w.local_size) * (w.ranks - w.local_size) / (w.ranks - 1);
  return k;
}

double predict_allgather(const Workload& w, const Shape& s, const CostParams& k) {
  double merge = 0;  // the tree merge: level by level, p / 2m merges into unions of 2m ranks
  for (int m = 1; m < w.ranks; m *= 2) merge += std::ceil(s.p / (2 * m)) * merge_time(s, expected_union(w, 2 * m), k);
  return k.alpha * log2_rounds(w.ranks) + k.beta * (s.p - 1) * s.n * s.c + s.pair * s.p * s.n + merge;
}

double predict_recursive_doubling(const Workload& w, const Shape& s, const CostParams& k) {
  const int pof2 = static_cast<int>(std::bit_floor(static_cast<unsigned>(w.ranks)));
  double t = 0;
  if (pof2 != w.ranks) {  // the fold: in, and the result back out (two messages each)
    t += 4 * k.alpha + k.beta * (wire_bytes(s, s.n) + wire_bytes(s, expected_union(w, w.ranks)));
  }
  const double per_v = s.p / pof2;  // ranks each virtual rank carries
  for (int m = 1; m < pof2; m *= 2) {
    const double mine = expected_union(w, static_cast<int>(std::lround(m * per_v)));
    const double merged = expected_union(w, static_cast<int>(std::lround(2 * m * per_v)));
    t += 2 * k.alpha + k.beta * wire_bytes(s, mine) + merge_time(s, merged, k) + 2 * merge_time(s, mine, k);
  }
  return t;
}

double predict_split(const Workload& w, const Shape& s, const CostParams& k, bool dense) {
  const double rounds = s.p - 1;
  const double merged = expected_union(w, w.ranks);
  // Counts, then pairs: each rank sends (p−1)/p of its pairs and merges p pieces of its range.
  double t = 2 * k.alpha * rounds + k.beta * s.n * s.c * rounds / s.p + 3 * s.pair * s.n;
  t += k.alpha * 2 * log2_rounds(w.ranks);  // the allgather of the reduced counts, then the data
  if (dense && merged >= s.threshold)
    t += k.beta * rounds / s.p * s.dim * s.cv + k.gamma * s.dim;
  else
    t += k.beta * rounds / s.p * merged * s.c + s.pair * merged;
  return t;
}

Layout layout_of_workload(const Workload& w) {
  Layout layout;
  layout.dim = w.dim;
  layout.index_bytes = w.index_bytes;
  layout.value_bytes = w.value_bytes;
  return layout;
}

// Whether the result is dense whatever the overlap (piece.hpp's surely_dense, on the workload).
bool surely_dense(const Workload& w) { return surely_dense(w.form, layout_of_workload(w), w.max_nnz); }

double predict_dense(const Workload& w, const Shape& s, const CostParams& k) {
  const double bytes = s.dim * s.cv, rounds = s.p - 1;
  // On hosts of several ranks the allreduce is hierarchical (comm/hierarchical.cpp): each host's
  // link carries 2·(H − 1)/H of the vector, its ranks' blocks together.
  const double crossing = hierarchical_serves(w) ? (w.hosts - 1.0) / w.hosts : rounds / s.p;
  // Building the dense vector (zeroing it, a store per pair), then the reduction's passes.
  double t = 2 * k.alpha * log2_rounds(w.ranks) + 2 * k.beta * bytes * crossing + k.gamma * (s.dim + s.n) +
             k.gamma * s.dim * (1 + rounds / s.p);
  if (!surely_dense(w)) {
    // The result may be sparse: every rank's bitmap of dim bits gathered (alongside the values),
    // ORed (p words per 64 indices), and the union's pairs picked out (a few stores each).
    t += k.alpha * log2_rounds(w.ranks) + k.beta * rounds * s.dim / 8 + k.gamma * s.p * s.dim / 64 +
         4 * k.gamma * expected_union(w, w.ranks);
  }
  return t;
}

Form inter_form(const Workload& w);
Workload across_hosts(const Workload& w);

// Inside the host a sparse reduce-scatter of L ranges, across hosts the cheapest flat algorithm
// over one range of dim / L (the host's union of it, from each host), inside the host the
// allgather of the ranges (dense once the result is).
// Where one rank alone outweighs the dense vector it runs dense_allreduce (hierarchical.cpp).
double predict_hierarchical(const Workload& w, const Shape& s, const CostParams& k) {
  if (layout_of_workload(w).dense_is_smaller(w.max_nnz)) return predict_dense(w, s, k);
  const double l = w.local_size, rounds = l - 1;
  const CostParams& local = w.local_cost;
  double t = 2 * local.alpha * rounds + local.beta * s.n * s.c * rounds / l + 3 * s.pair * s.n;
  CostParams shared = k;  // the L ranks of a host cross its link at once
  shared.beta *= l;
  const Workload across = across_hosts(w);
  t += predict(choose(across, shared), across, shared);
  const double merged = expected_union(w, w.ranks);
  t += local.alpha * 2 * log2_rounds(w.local_size);
  if (w.form == Form::dense || merged >= s.threshold)
    t += local.beta * rounds / l * s.dim * s.cv + k.gamma * s.dim / l;
  else
    t += local.beta * rounds / l * merged * s.c + s.pair * merged;
  return t;
}

// The pieces that cross hosts travel as pairs unless the result is dense whatever the overlap
// (src/sparse/hierarchical.cpp says why).
Form inter_form(const Workload& w) { return w.form == Form::dense || surely_dense(w) ? Form::automatic : Form::sparse; }

// The workload among the ranks of one local index: each host's union of one range of dim / L.
Workload across_hosts(const Workload& w) {
  Workload a;
  a.ranks = w.hosts;
  a.dim = w.dim / static_cast<std::size_t>(w.local_size);
  const double range = expected_union(w, w.local_size) / w.local_size;
  a.max_nnz = static_cast<std::size_t>(std::llround(std::max(range, static_cast<double>(w.max_nnz) / w.local_size)));
  a.total_nnz = static_cast<std::size_t>(std::llround(range * w.hosts));
  a.index_bytes = w.index_bytes;
  a.value_bytes = w.value_bytes;
  a.form = inter_form(w);
  return a;
}

}  // namespace

double expected_union(const Workload& w, int m) {
  if (w.dim == 0 || w.total_nnz == 0) return 0;
  const double dim = static_cast<double>(w.dim), n = static_cast<double>(w.total_nnz) / w.ranks;
  const double density = std::min(1.0, n / dim);
  double u = dim * (1 - std::pow(1 - density, m));
  if (m >= w.ranks) u = std::max(u, static_cast<double>(w.max_nnz));
  return std::clamp(u, std::min(n, dim), std::min(dim, m * n));
}

double predict(Algorithm algorithm, const Workload& w, const CostParams& cost) {
  if (w.ranks < 1) throw Error(ErrorCode::invalid_argument, "sparse cost model: ranks must be at least 1");
  if (w.ranks == 1) return 0;
  const Shape s = shape_of(w);
  const CostParams flat = flat_links(w, cost);
  switch (algorithm) {
    case Algorithm::ssar_recursive_doubling:
      return predict_recursive_doubling(w, s, flat);
    case Algorithm::ssar_split_allgather:
      return predict_split(w, s, flat, false);
    case Algorithm::dsar_split_allgather:
      return predict_split(w, s, flat, true);
    case Algorithm::allgather:
      return predict_allgather(w, s, flat);
    case Algorithm::dense_allreduce:
      return predict_dense(w, s, cost);
    case Algorithm::hierarchical:
      if (w.hosts < 1 || w.local_size < 1 || w.hosts * w.local_size != w.ranks)
        throw Error(ErrorCode::invalid_argument, "sparse cost model: hierarchical needs hosts x local_size = ranks");
      if (w.local_size == 1 || w.hosts == 1) {  // one level: the flat algorithm it runs
        Workload flat = w;
        flat.hosts = flat.local_size = 1;
        return w.local_size == 1 ? predict(choose(flat, cost), flat, cost)
                                 : predict(Algorithm::dsar_split_allgather, flat, w.local_cost);
      }
      return predict_hierarchical(w, s, cost);
    default:
      throw Error(ErrorCode::invalid_argument, "sparse cost model: no prediction for automatic");
  }
}

Algorithm choose(const Workload& w, const CostParams& cost) {
  if (w.ranks <= 1 || w.total_nnz == 0) return Algorithm::allgather;
  Algorithm best = Algorithm::automatic;
  double best_time = 0;
  for (Algorithm a :
       {Algorithm::ssar_recursive_doubling, Algorithm::ssar_split_allgather, Algorithm::dsar_split_allgather,
        Algorithm::allgather, Algorithm::dense_allreduce, Algorithm::hierarchical}) {
    if (a == Algorithm::hierarchical && !hierarchical_serves(w)) continue;
    const double t = predict(a, w, cost);
    if (best == Algorithm::automatic || t < best_time * (1 - 1e-3)) {
      best = a;
      best_time = t;
    }
  }
  return best;
}

}  // namespace tutti::sparse::detail
