#include "bench/ceiling.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <memory>
#include <random>
#include <stdexcept>
#include <string>

#include "bench/runner.hpp"

namespace tutti::bench {

namespace {

using clock = std::chrono::steady_clock;

constexpr std::size_t copy_bytes = std::size_t{64} << 20;
constexpr int copy_repeats = 4;
constexpr int ping_pongs = 20000;

double memory_bandwidth(Communicator& world) {
  auto src = std::make_unique<std::byte[]>(copy_bytes);  // zeroed: every page is touched
  auto dst = std::make_unique<std::byte[]>(copy_bytes);
  std::memcpy(dst.get(), src.get(), copy_bytes);
  world.barrier();
  const auto start = clock::now();
  for (int i = 0; i < copy_repeats; ++i) {
    std::memcpy(dst.get(), src.get(), copy_bytes);
    src.swap(dst);
  }
  const double seconds = max_over_ranks(world, std::chrono::duration<double>(clock::now() - start).count());
  return 2.0 * static_cast<double>(copy_bytes) * copy_repeats * world.size() / seconds;
}

inline void relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

// Ranks 0 and 1 bounce a counter through a page of shared memory; the others wait at the barrier.
double flag_latency(Communicator& world) {
  if (world.size() < 2) return 0;
  char name[64] = {};
  if (world.rank() == 0)
    std::snprintf(name, sizeof(name), "/tutti-bench-%d-%u", static_cast<int>(::getpid()), std::random_device{}());
  world.broadcast(name, sizeof(name), DataType::u8, 0);
  int fd = -1;
  if (world.rank() == 0) fd = ::shm_open(name, O_CREAT | O_EXCL | O_RDWR, 0600);
  if (world.rank() == 0 && fd >= 0 && ::ftruncate(fd, 4096) != 0) ::close(fd), fd = -1;
  world.barrier();
  if (world.rank() == 1) fd = ::shm_open(name, O_RDWR, 0600);
  world.barrier();
  if (world.rank() == 0) ::shm_unlink(name);
  int ok = world.rank() > 1 || fd >= 0;
  world.allreduce(std::span<int>(&ok, 1), ReduceOp::min);
  if (!ok) throw std::runtime_error("ceiling: cannot create shared memory for the flag latency");
  double one_way = 0;
  if (world.rank() <= 1) {
    void* page = ::mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    ::close(fd);
    if (page == MAP_FAILED) throw std::runtime_error("ceiling: mmap failed");
    auto* flag = static_cast<std::atomic<std::uint64_t>*>(page);
    const std::uint64_t me = static_cast<std::uint64_t>(world.rank());
    const auto start = clock::now();
    for (std::uint64_t k = 0; k < 2 * ping_pongs; k += 2) {  // rank 0 writes even+1, rank 1 answers +1
      const std::uint64_t wait_for = k + me;
      while (flag->load(std::memory_order_acquire) != wait_for) relax();
      flag->store(wait_for + 1, std::memory_order_release);
    }
    one_way = std::chrono::duration<double>(clock::now() - start).count() / (2.0 * ping_pongs);
    ::munmap(page, 4096);
  }
  world.barrier();
  return max_over_ranks(world, one_way);
}

// Bytes every rank's inputs and outputs move through memory, at least (BENCHMARKS.md).
double memory_bytes(const Case& c, int ranks) {
  const double p = ranks, size = static_cast<double>(case_bytes(c, ranks));
  if (c.kind == sendrecv) return 2 * p * size;
  switch (*c.kind) {
    case Collective::allreduce:
    case Collective::alltoall:
    case Collective::alltoallv:
      return 2 * p * size;
    case Collective::reduce_scatter:
    case Collective::allgather:
    case Collective::allgatherv:
    case Collective::reduce:
      return (p + 1) * size;
    case Collective::broadcast:
      return p * size;
    case Collective::gather:  // every block read once, the root's result written once
    case Collective::scatter:
      return 2 * size;
    case Collective::barrier:
      return 0;
  }
  return 0;
}

}  // namespace

Ceiling measure_ceiling(Communicator& world) {
  Ceiling ceiling;
  ceiling.memory_bandwidth = memory_bandwidth(world);
  ceiling.latency = flag_latency(world);
  return ceiling;
}

double time_bound(const Case& c, int ranks, const Ceiling& ceiling) {
  if (ceiling.memory_bandwidth <= 0) return 0;
  return std::max(memory_bytes(c, ranks) / ceiling.memory_bandwidth, ranks > 1 ? ceiling.latency : 0.0);
}

}  // namespace tutti::bench
