// Predicted times. Schedule algorithms are simulated (schedule::estimate over every rank's
// schedule), so pipelining, uneven blocks and non-powers of two count as they run. `direct` has
// no schedule: its time is written out below from what transport/shm/direct.cpp does.
#include "comm/cost_model.hpp"

#include <algorithm>
#include <cmath>
#include <string>

#include "transport/shm/direct.hpp"

namespace tutti::detail::choice {

namespace {

// The model's element: f32. The choice depends on bytes, not on the type.
constexpr std::size_t elem_size = 4;
// transport/shm/direct.cpp: bytes per rank per step, and the one-step allreduce limit.
constexpr double direct_chunk = 256.0 * 1024;
// A direct copy is one memcpy into or out of the shared data area; a shared-memory message, which
// β prices, is two (into the ring slot, out of it) plus its chunking, acknowledgements and
// doorbells. Measured side by side (p = 2, 2026-11-25, tutti-bench --all-algorithms, no tuning
// file): a 2 MiB direct allreduce took 233-250 µs where ring took 620 µs and the model, with a
// direct byte at half a message byte and a barrier at half a round, said 706 and 632 µs, so that
// `automatic` chose ring. A direct byte costs a fifth of a message byte, and a byte copied out
// with streaming stores (transport::shm::streaming_bytes), which skip reading the destination
// line first, an eighth (2 MiB: 390 µs predicted; 16 MiB: 2,100 µs predicted, 3,000-3,560 µs
// measured, ring 5,040 µs predicted).
constexpr double direct_copy_share = 0.2;
constexpr double direct_streamed_share = 0.125;
// A direct barrier is one store and a poll of p flags, about 0.3 µs here (an 8-byte inline
// allreduce is one such exchange); a message round, which α prices at 3 µs for shm, also fills a
// ring slot, rings a doorbell and returns an acknowledgement.
constexpr double direct_barrier_share = 0.1;
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

// Barriers (each ≈ α/2), copied bytes and reduced elements on one rank's path; ranks run alike.
double predict_direct(Collective c, int p, std::size_t bytes, const CostParams& cost) {
  const double n = static_cast<double>(per_rank_count(c, p, bytes)) * elem_size;  // bytes per rank
  const double up = static_cast<double>(p), elements = n / elem_size;
  const double copy = cost.beta * direct_copy_share, barrier = cost.alpha * direct_barrier_share;
  // Copying results out: streamed from streaming_bytes of them on all ranks (`bytes` is one
  // rank's here).
  const double copy_out =
      cost.beta * (bytes * static_cast<std::size_t>(p) >= transport::shm::streaming_bytes ? direct_streamed_share
                                                                                          : direct_copy_share);
  const auto steps = [](double data, double per_step) { return std::max(1.0, std::ceil(data / per_step)); };
  switch (c) {
    case Collective::allreduce:
      // Small: copy in, barrier, every rank reduces all p parts into its output.
      if (bytes <= transport::shm::small_allreduce_bytes)
        return barrier + copy * n * (p == 1 ? 2 : 1) + cost.gamma * (up - 1) * elements;
      // Per chunk: copy in the others' slices, barrier, reduce my 1/p slice into my output and
      // publish it, barrier, copy the others' slices out.
      return 2 * steps(n, direct_chunk) * barrier + copy * n + copy_out * n * (up - 1) / up +
             cost.gamma * (up - 1) / up * elements;
    case Collective::reduce_scatter:
      // Per chunk: copy my chunk of the others' p - 1 blocks in, barrier, reduce my block from
      // my input and the others' parts.
      return steps(n, direct_chunk / up) * barrier + copy * n * (up - 1) + cost.gamma * (up - 1) * elements;
    case Collective::allgather:
      // Per chunk: copy my block in, barrier, copy the p blocks out.
      return steps(n, direct_chunk) * barrier + copy * n + copy_out * n * up;
    case Collective::broadcast:
      // Per chunk of p slots: the root copies in, barrier, the others copy out.
      return steps(n, direct_chunk * up) * barrier + copy * n + copy_out * n;
    default:
      throw Error(ErrorCode::unsupported, "cost model: direct does not serve " + std::string(to_string(c)));
  }
}

bool direct_serves(Collective c) { return transport::shm::serves(c); }

}  // namespace

bool bytes_are_total(Collective c) {
  return c == Collective::reduce_scatter || c == Collective::allgather || c == Collective::allgatherv ||
         c == Collective::alltoall || c == Collective::gather || c == Collective::scatter;
}

CostParams default_cost(std::string_view transport) {
  if (transport == "inproc") return {2.0e-6, 1.5e-10, 2.0e-10};
  if (transport == "shm") return {3.0e-6, 3.0e-10, 2.0e-10};
  if (transport == "mpi") return {2.0e-6, 3.0e-10, 2.0e-10};
  return {50.0e-6, 6.5e-10, 2.0e-10};  // tcp, and what we know nothing about
}

std::vector<Algorithm> candidates(Collective collective, bool direct_available) {
  std::vector<Algorithm> out = schedule::algorithms_for(collective);
  if (direct_available && direct_serves(collective)) out.push_back(Algorithm::direct);
  return out;
}

double predict(Algorithm algorithm, Collective collective, int ranks, std::size_t bytes, const CostParams& cost) {
  if (ranks < 1) throw Error(ErrorCode::invalid_argument, "cost model: ranks must be at least 1");
  if (algorithm == Algorithm::direct && direct_serves(collective))
    return predict_direct(collective, ranks, bytes, cost);
  if (!schedule::applies(algorithm, collective))
    throw Error(ErrorCode::unsupported, "cost model: " + std::string(to_string(algorithm)) + " does not serve " +
                                            std::string(to_string(collective)));
  return predict_schedule(algorithm, collective, ranks, bytes, cost);
}

Algorithm cheapest(Collective collective, int ranks, std::size_t bytes, bool direct_available, const CostParams& cost) {
  // A direct collective of no elements waits for no rank: nothing is cheaper (a schedule of no
  // bytes, which the model also prices at 0, still runs its rounds).
  if (bytes == 0 && direct_available && direct_serves(collective)) return Algorithm::direct;
  Algorithm best = Algorithm::automatic;
  double best_time = 0;
  for (Algorithm a : candidates(collective, direct_available)) {
    const double t = predict(a, collective, ranks, bytes, cost);
    if (best == Algorithm::automatic || t < best_time * (1 - tie_margin)) {
      best = a;
      best_time = t;
    }
  }
  return best;
}

}  // namespace tutti::detail::choice
