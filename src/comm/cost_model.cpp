// Predicted times. Schedule algorithms are simulated (schedule::estimate over every rank's
// schedule), so pipelining, uneven blocks and non-powers of two count as they run. A native
// algorithm (shared memory's `direct`) has no schedule: the transport that runs it prices it.
#include "comm/cost_model.hpp"

#include <algorithm>
#include <cmath>
#include <string>

namespace tutti::comm::choice {

namespace {

// The model's element: f32. The choice depends on bytes, not on the type.
constexpr std::size_t elem_size = 4;
// Predictions closer than this (relative) are a tie, which the earlier candidate wins: where two
// algorithms are alike (p = 2, where ring and tree broadcast are the same message), rounding
// must not flip the choice from one size class to the next.
constexpr double tie_margin = 1e-3;

std::size_t ceil_div(std::size_t a, std::size_t b) { return (a + b - 1) / b; }

// Elements per rank (the schedule's count) for `bytes`: at least one for a non-empty call.
std::size_t per_rank_count(Collective c, int p, std::size_t bytes) {
  const std::size_t parts = bytes_are_total(c) ? static_cast<std::size_t>(p) : 1;
  return ceil_div(bytes, elem_size * parts);
}

double simulate(Algorithm algorithm, Collective c, int p, std::size_t bytes, const CostParams& cost) {
  schedule::Params params;
  params.collective = c;
  params.size = p;
  params.count = per_rank_count(c, p, bytes);
  params.elem_size = elem_size;
  const std::vector<std::size_t> counts(static_cast<std::size_t>(p), params.count);
  if (c == Collective::allgatherv || c == Collective::alltoallv) params.counts = counts;
  schedule::fit_chunks(params, algorithm, cost.alpha, cost.beta);  // as CommImpl::plan_for cuts them
  return schedule::estimate(algorithm, params, cost.alpha, cost.beta, cost.gamma).time;
}

// Simulating every chunk of a 256 MiB call on 8 ranks takes tens of milliseconds; by 16 MiB every
// algorithm is in its linear regime (pipelines full, rounds growing with the chunks), so larger
// calls are extrapolated along the line through 8 and 16 MiB.
constexpr std::size_t simulated_bytes = std::size_t{16} << 20;

double predict_schedule(Algorithm algorithm, Collective c, int p, std::size_t bytes, const CostParams& cost) {
  if (bytes <= simulated_bytes) return simulate(algorithm, c, p, bytes, cost);
  const double half = simulate(algorithm, c, p, simulated_bytes / 2, cost);
  const double full = simulate(algorithm, c, p, simulated_bytes, cost);
  const double per_byte = (full - half) / static_cast<double>(simulated_bytes / 2);
  return full + per_byte * static_cast<double>(bytes - simulated_bytes);
}

}  // namespace

bool bytes_are_total(Collective c) {
  return c == Collective::reduce_scatter || c == Collective::allgather || c == Collective::allgatherv ||
         c == Collective::alltoall || c == Collective::gather || c == Collective::scatter;
}

std::vector<Algorithm> candidates(transport::Kind kind, Collective collective, bool direct_available) {
  std::vector<Algorithm> out = schedule::algorithms_for(collective);
  if (direct_available)
    for (Algorithm a : transport::native_candidates(kind, collective)) out.push_back(a);
  return out;
}

double predict(Algorithm algorithm, Collective collective, int ranks, std::size_t bytes, const CostParams& cost) {
  if (ranks < 1) throw Error(ErrorCode::invalid_argument, "cost model: ranks must be at least 1");
  if (const auto price = transport::native_price(algorithm, collective, ranks, bytes, cost)) return *price;
  if (!schedule::applies(algorithm, collective))
    throw Error(ErrorCode::unsupported, "cost model: " + std::string(to_string(algorithm)) + " does not serve " +
                                            std::string(to_string(collective)));
  return predict_schedule(algorithm, collective, ranks, bytes, cost);
}

Algorithm cheapest(transport::Kind kind, Collective collective, int ranks, std::size_t bytes, bool direct_available,
                   const CostParams& cost) {
  // A native collective of no elements waits for no rank: nothing is cheaper (a schedule of no
  // bytes, which the model also prices at 0, still runs its rounds).
  if (bytes == 0 && direct_available)
    if (const auto native = transport::native_candidates(kind, collective); !native.empty()) return native.front();
  Algorithm best = Algorithm::automatic;
  double best_time = 0;
  for (Algorithm a : candidates(kind, collective, direct_available)) {
    const double t = predict(a, collective, ranks, bytes, cost);
    if (best == Algorithm::automatic || t < best_time * (1 - tie_margin)) {
      best = a;
      best_time = t;
    }
  }
  return best;
}

}  // namespace tutti::comm::choice
