// tuning::measure: a communicator's α, β and γ, as `tutti-bench --calibrate` records them; and
// choice::probe_link, the short form init() runs when the ranks span hosts.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <span>
#include <vector>

#include "comm/tuning.hpp"
#include "core/log.hpp"
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

namespace tutti::comm::choice {

namespace {

using tuning::clock;

double seconds_since(clock::time_point start) { return std::chrono::duration<double>(clock::now() - start).count(); }

// The median one-way time of an 8-byte ping-pong (rank 0 times it; the partner answers).
double latency(Communicator& comm, int partner) {
  constexpr int warm = 4, rounds = 64;
  std::uint64_t word = 0;
  std::vector<double> times;
  for (int i = 0; i < warm + rounds; ++i) {
    if (comm.rank() == 0) {
      const auto start = clock::now();
      comm.send(&word, 1, DataType::u64, partner);
      comm.recv(&word, 1, DataType::u64, partner);
      if (i >= warm) times.push_back(seconds_since(start) / 2);
    } else {
      comm.recv(&word, 1, DataType::u64, 0);
      comm.send(&word, 1, DataType::u64, 0);
    }
  }
  if (times.empty()) return 0;
  std::nth_element(times.begin(), times.begin() + static_cast<std::ptrdiff_t>(times.size() / 2), times.end());
  return times[times.size() / 2];
}

// Streams: rank 0 names a size (0 ends), sends that many bytes as back-to-back messages of at most
// `chunk`, and the partner answers with 8 bytes once all arrived. Rank 0 gets the seconds from the
// first chunk to the answer (the partner 0).
constexpr std::size_t chunk = std::size_t{1} << 20;

double stream(Communicator& comm, int partner, std::size_t bytes, std::vector<std::byte>& buffer) {
  std::uint64_t size = bytes;
  comm.send(&size, 1, DataType::u64, partner);
  const auto start = clock::now();
  std::vector<Request> sends;
  for (std::size_t done = 0; done < bytes; done += chunk)
    sends.push_back(comm.isend(buffer.data(), std::min(chunk, bytes - done), DataType::u8, partner, 1));
  for (Request& r : sends) r.wait();
  comm.recv(&size, 1, DataType::u64, partner);
  return seconds_since(start);
}

void answer_streams(Communicator& comm, std::vector<std::byte>& buffer) {
  for (;;) {
    std::uint64_t size = 0;
    comm.recv(&size, 1, DataType::u64, 0);
    if (size == 0) return;
    if (buffer.size() < size) buffer.resize(size);  // at most 8 MiB: each chunk lands in its own place
    std::vector<Request> receives;
    for (std::size_t done = 0; done < size; done += chunk)
      receives.push_back(
          comm.irecv(buffer.data() + done, std::min<std::size_t>(chunk, size - done), DataType::u8, 0, 1));
    for (Request& r : receives) r.wait();
    comm.send(&size, 1, DataType::u64, 0);
  }
}

}  // namespace

std::optional<CostParams> probe_link(Communicator& comm, std::string_view transport, transport::Kind kind) {
  if (comm.size() < 2) return std::nullopt;
  const int partner = tuning::partner_of_rank_0(comm);
  double measured[2] = {0, 0};  // α, β: rank 0's, then every rank's
  if (comm.rank() == 0 || comm.rank() == partner) {
    const double alpha = latency(comm, partner);
    std::vector<std::byte> buffer(chunk);
    if (comm.rank() == partner) {
      answer_streams(comm, buffer);
    } else {
      // 1 MiB; where that took under 5 ms (a link above about 1.7 Gbit/s), 8 MiB, so that a fast
      // link's burst allowance or a warming connection weighs little.
      std::size_t bytes = chunk;
      double time = stream(comm, partner, bytes, buffer);
      if (time < 5e-3) {
        bytes = 8 * chunk;
        time = stream(comm, partner, bytes, buffer);
      }
      std::uint64_t end = 0;
      comm.send(&end, 1, DataType::u64, partner);
      measured[0] = alpha;
      measured[1] = std::max(0.0, time - 2 * alpha) / static_cast<double>(bytes);
    }
  }
  comm.broadcast(std::span<double>(measured, 2), 0);
  if (!(std::isfinite(measured[0]) && std::isfinite(measured[1]) && measured[0] > 0)) return std::nullopt;
  // Bandwidth beyond 1 TB/s is a clock's rounding, not a link.
  CostParams cost = cost_for(transport, kind);
  cost.alpha = measured[0];
  cost.beta = std::max(measured[1], 1e-12);
  if (core::log_enabled(core::LogLevel::info)) {
    char text[256];
    std::snprintf(text, sizeof(text),
                  "init: link probe, rank 0 to rank %d: α = %.3g s, β = %.3g s/B (%.3g Gbit/s); this communicator's "
                  "cost model (%.*s) uses them",
                  partner, cost.alpha, cost.beta, 8e-9 / cost.beta, static_cast<int>(transport.size()),
                  transport.data());
    core::log(core::LogLevel::info, comm.rank(), text);
  }
  return cost;
}

}  // namespace tutti::comm::choice
