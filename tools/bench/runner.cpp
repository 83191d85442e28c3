#include "bench/runner.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <numeric>
#include <random>

namespace tutti::bench {

namespace {

using clock = std::chrono::steady_clock;

double seconds_since(clock::time_point start) { return std::chrono::duration<double>(clock::now() - start).count(); }

}  // namespace

double max_over_ranks(Communicator& world, double value) {
  world.allreduce(std::span<double>(&value, 1), ReduceOp::max);
  return value;
}

void run_tutti(Communicator& world, const Case& c, Buffers& buffers, Algorithm algorithm) {
  const Options options{.algorithm = algorithm};
  const void* send = buffers.send();
  void* recv = buffers.recv();
  if (c.kind == sendrecv) {
    const int next = (world.rank() + 1) % world.size(), prev = (world.rank() + world.size() - 1) % world.size();
    world.sendrecv(send, c.count, next, recv, c.count, prev, c.type);
    return;
  }
  switch (*c.kind) {
    case Collective::allreduce:
      return world.allreduce(send, recv, c.count, c.type, c.op, options);
    case Collective::reduce_scatter:
      return world.reduce_scatter(send, recv, c.count, c.type, c.op, options);
    case Collective::allgather:
      return world.allgather(send, recv, c.count, c.type, options);
    case Collective::broadcast:
      return world.broadcast(recv, c.count, c.type, c.root, options);
    case Collective::reduce:
      return world.reduce(send, recv, c.count, c.type, c.op, c.root, options);
    case Collective::alltoall:
      return world.alltoall(send, recv, c.count, c.type, options);
    case Collective::allgatherv:
      return world.allgatherv(send, buffers.send_counts()[0], recv, buffers.recv_counts(), c.type, options);
    case Collective::alltoallv:
      return world.alltoallv(send, buffers.send_counts(), recv, buffers.recv_counts(), c.type, options);
    case Collective::gather:
      return world.gather(send, recv, c.count, c.type, c.root, options);
    case Collective::scatter:
      return world.scatter(send, recv, c.count, c.type, c.root, options);
    case Collective::barrier:
      return world.barrier(options);
  }
}

double time_op(Communicator& world, const std::function<void()>& op, int warmup, int iterations) {
  for (int i = 0; i < warmup; ++i) op();
  world.barrier();
  const auto start = clock::now();
  for (int i = 0; i < iterations; ++i) op();
  return max_over_ranks(world, seconds_since(start) / iterations);
}

CallTimes time_calls(Communicator& world, const std::function<void()>& op, int warmup, int iterations) {
  for (int i = 0; i < warmup; ++i) op();
  std::vector<double> calls(static_cast<std::size_t>(std::max(iterations, 1)), 0.0);
  world.barrier();
  const auto start = clock::now();
  auto last = start;
  for (int i = 0; i < iterations; ++i) {
    op();
    const auto now = clock::now();
    calls[static_cast<std::size_t>(i)] = std::chrono::duration<double>(now - last).count();
    last = now;
  }
  const double mean = seconds_since(start) / iterations;
  const auto middle = calls.begin() + static_cast<std::ptrdiff_t>(calls.size() / 2);
  std::nth_element(calls.begin(), middle, calls.end());
  return {max_over_ranks(world, mean), max_over_ranks(world, *middle)};
}

std::vector<double> time_alternating(Communicator& world, const std::vector<std::function<void()>>& ops, int warmup,
                                     const std::vector<int>& iterations) {
  for (int i = 0; i < warmup; ++i)
    for (const auto& op : ops) op();
  std::vector<double> total(ops.size(), 0.0);
  const int rounds = iterations.empty() ? 0 : *std::max_element(iterations.begin(), iterations.end());
  // Each round in its own order, the same on every rank (a fixed seed): no op always follows the same one.
  std::vector<std::size_t> order(ops.size());
  std::iota(order.begin(), order.end(), std::size_t{0});
  std::mt19937 random(12345);
  for (int round = 0; round < rounds; ++round) {
    std::shuffle(order.begin(), order.end(), random);
    for (const std::size_t k : order) {
      if (round >= iterations[k]) continue;
      world.barrier();
      const auto start = clock::now();
      ops[k]();
      total[k] += seconds_since(start);
    }
  }
  for (std::size_t k = 0; k < ops.size(); ++k) total[k] = max_over_ranks(world, total[k] / iterations[k]);
  return total;
}

int choose_iterations(Communicator& world, const std::function<void()>& op, std::optional<int> fixed) {
  if (fixed) return *fixed;
  constexpr double target_seconds = 0.05;
  // Every rank makes the same number of calls: the counts derive from maxima over ranks.
  int calls = 2;
  double per_call = 0;
  for (int pass = 0; pass < 2; ++pass) {
    world.barrier();
    const auto start = clock::now();
    for (int i = 0; i < calls; ++i) op();
    per_call = max_over_ranks(world, seconds_since(start) / calls);
    if (per_call * calls >= 0.002) break;  // long enough to judge
    calls = static_cast<int>(std::clamp(0.002 / std::max(per_call, 1e-9), 2.0, 2000.0));
  }
  return static_cast<int>(std::clamp(std::ceil(target_seconds / std::max(per_call, 1e-9)), 5.0, 100000.0));
}

std::size_t check_op(Communicator& world, Buffers& buffers, const std::function<void()>& op, bool corrupt) {
  buffers.prepare();
  world.barrier();  // nobody reads a peer's input before the peer has written it
  op();
  if (corrupt && world.rank() == 0) buffers.corrupt();
  auto wrong = static_cast<std::uint64_t>(buffers.count_wrong());
  world.allreduce(std::span<std::uint64_t>(&wrong, 1), ReduceOp::sum);
  return static_cast<std::size_t>(wrong);
}

}  // namespace tutti::bench
