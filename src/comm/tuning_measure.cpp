// tuning::measure: a communicator's α, β and γ, as `tutti-bench --calibrate` records them.
#include <algorithm>
#include <chrono>
#include <span>
#include <vector>

#include "reduce/reduce.hpp"
#include "tutti/topology.hpp"
#include "tutti/tuning.hpp"
#include "tutti/tutti.hpp"

namespace tutti::tuning {

namespace {

using clock = std::chrono::steady_clock;

double slowest(Communicator& comm, double seconds) {
  comm.allreduce(std::span<double>(&seconds, 1), ReduceOp::max);
  return seconds;
}

// One-way time of a `bytes` message between rank 0 and `partner` (ping-pong), the same on every rank.
double one_way(Communicator& comm, std::size_t bytes, int rounds, int partner) {
  std::vector<std::byte> buffer(std::max<std::size_t>(bytes, 1));
  const bool measures = comm.rank() == 0 || comm.rank() == partner;
  comm.barrier();
  const auto start = clock::now();
  for (int i = 0; i < rounds && measures; ++i) {
    if (comm.rank() == 0) {
      comm.send(buffer.data(), bytes, DataType::u8, partner);
      comm.recv(buffer.data(), bytes, DataType::u8, partner);
    } else {
      comm.recv(buffer.data(), bytes, DataType::u8, 0);
      comm.send(buffer.data(), bytes, DataType::u8, 0);
    }
  }
  const double seconds = measures ? std::chrono::duration<double>(clock::now() - start).count() : 0;
  return slowest(comm, seconds / (2.0 * rounds));
}

// The rank that rank 0 measures against: the first on another host where the ranks span hosts
// (the links between hosts are what limit a composite transport such as shm+tcp), else rank 1.
int partner_of_rank_0(Communicator& comm) {
  const HostLayout layout = host_layout(comm);
  for (int r = 1; r < comm.size(); ++r)
    if (layout.host_of_rank[static_cast<std::size_t>(r)] != layout.host_of_rank[0]) return r;
  return 1;
}

// Seconds per f32 element of the sum kernel on one core (the slowest rank's).
double reduce_time(Communicator& comm) {
  constexpr std::size_t n = std::size_t{1} << 22;
  std::vector<float> a(n, 1.0f), b(n, 2.0f);
  reduce::apply(ReduceOp::sum, DataType::f32, a.data(), a.data(), b.data(), n);  // warm
  const auto start = clock::now();
  constexpr int repeats = 5;
  for (int i = 0; i < repeats; ++i) reduce::apply(ReduceOp::sum, DataType::f32, a.data(), a.data(), b.data(), n);
  return slowest(comm, std::chrono::duration<double>(clock::now() - start).count() / (repeats * n));
}

}  // namespace

CostModel measure(Communicator& comm) {
  CostModel cost;
  cost.gamma = reduce_time(comm);
  if (comm.size() < 2) return cost;
  const int partner = partner_of_rank_0(comm);
  cost.alpha = one_way(comm, 8, 2000, partner);
  constexpr std::size_t large = std::size_t{4} << 20;
  cost.beta = std::max(0.0, one_way(comm, large, 20, partner) - cost.alpha) / static_cast<double>(large);
  return cost;
}

}  // namespace tutti::tuning
