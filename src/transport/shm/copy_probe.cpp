// Whether the direct collectives that move whole blocks (allgather(v), alltoall, gather, scatter,
// broadcast) read the peers' buffers (single copy) or copy through the segment's data sets:
// measured between ranks 0 and 1 as they attach. Which is faster depends on the machine, not on
// the code: on one of this project's machines the data sets were 1.3-3x faster from 32 KiB to
// 2 MiB, on another single copy was 1.3-2x faster over the same range (docs/performance.md), so
// neither can be fixed here.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include <sched.h>
#include <unistd.h>

#include "core/copy.hpp"
#include "core/env.hpp"
#include "transport/shm/segment.hpp"
#include "transport/shm/shm.hpp"

namespace tutti::transport::shm {

namespace {

using clock = std::chrono::steady_clock;

// forced_single: TUTTI_SHM_COLLECTIVE_COPY=single, which holds for every collective that moves
// whole blocks even where ranks share cores (a measured single holds for fewer there).
enum Verdict : std::uint32_t { undecided = 0, single = 1, sets = 2, probing = 3, forced_single = 4 };

constexpr std::size_t probe_bytes = 128 * 1024;
constexpr int probe_rounds = 8;  // of each way, alternated; the fastest of each counts
constexpr int extra_rounds = 8;  // of each way, while no round has run on two cpus

// A verdict this process measured already (a split communicator's segment asks again).
std::atomic<std::uint32_t> measured{undecided};

// Spins until `done`, or throws at the deadline; where ranks share cores (`yield`), it yields the
// core every 512 polls (some 20 us), which the other side of the probe may need.
template <typename Done>
void spin_until(const Done& done, bool yield, clock::time_point deadline, const std::string& what) {
  for (unsigned i = 1; !done(); ++i) {
    if (yield && i % 512 == 0)
      sched_yield();
    else
      cpu_relax();
    if (i % 4096 == 0 && clock::now() >= deadline)
      throw Error(ErrorCode::timeout, "shm: " + what + " before the deadline (while attaching)");
  }
}

// Keeps the calling thread off one cpu until destroyed, which restores its affinity; does
// nothing where that cpu is the only one the thread may run on.
class AwayFrom {
 public:
  explicit AwayFrom(int cpu) {
    if (cpu < 0 || cpu >= CPU_SETSIZE || sched_getaffinity(0, sizeof saved_, &saved_) != 0) return;
    cpu_set_t away = saved_;
    CPU_CLR(cpu, &away);
    moved_ = CPU_COUNT(&away) > 0 && sched_setaffinity(0, sizeof away, &away) == 0;
  }
  ~AwayFrom() {
    if (moved_) sched_setaffinity(0, sizeof saved_, &saved_);
  }
  AwayFrom(const AwayFrom&) = delete;
  AwayFrom& operator=(const AwayFrom&) = delete;

 private:
  cpu_set_t saved_{};
  bool moved_ = false;
};

Verdict setting() {
  const std::string value = core::env("TUTTI_SHM_COLLECTIVE_COPY").value_or("auto");
  if (value == "auto") return undecided;
  if (value == "single") return forced_single;
  if (value == "sets") return sets;
  throw Error(ErrorCode::invalid_argument,
              "TUTTI_SHM_COLLECTIVE_COPY must be auto, single or sets, not '" + value + "'");
}

}  // namespace

namespace {
std::atomic<int> machine_ranks{0};
}  // namespace

void set_ranks_on_machine(int ranks) { machine_ranks.store(std::max(ranks, 0), std::memory_order_relaxed); }
int ranks_on_machine() { return machine_ranks.load(std::memory_order_relaxed); }

std::string machine_id(const std::string& host) {
  std::ifstream boot("/proc/sys/kernel/random/boot_id");
  std::string id;
  if (boot && std::getline(boot, id) && !id.empty()) return "boot:" + id;
  return "host:" + host;
}

bool ranks_outnumber_cores(int ranks) {
  const long online = sysconf(_SC_NPROCESSORS_ONLN);
  const long cores = online > 0 ? online : static_cast<long>(std::thread::hardware_concurrency());
  return cores > 0 && std::max(ranks, ranks_on_machine()) > cores;
}

// Rank 1 decides and every other rank follows its verdict, so that all run the same protocol.
// The probe: rank 1 says go, rank 0 either copies 128 KiB from its own buffer into data set 0
// (the data sets) or does nothing (single copy), and answers; rank 1 then copies the bytes out of
// the set, or reads them from rank 0's buffer with process_vm_readv and waits for one more answer
// (the barrier after which a single-copy collective's owner may reuse its buffer). Rank 1 times
// each round from its go to its last step: the same steps as one chunk of either path.
void Segment::decide_collective_copy(int rank, clock::time_point deadline) {
  const int size = layout_.size;
  const Verdict forced = setting();  // every rank checks its own setting
  const bool yield = ranks_outnumber_cores(size);
  if (size < 2 || !single_copy_) {
    single_copy_collectives_ = crowded_ = false;
    return;
  }
  RankBlock &zero = rank_block(0), &one = rank_block(1);
  const std::size_t bytes = std::min(probe_bytes, static_cast<std::size_t>(size) * layout_.direct_chunk);
  if (rank == 1) {
    Verdict verdict = forced;
    if (verdict == undecided) verdict = static_cast<Verdict>(measured.load(std::memory_order_relaxed));
    if (verdict != undecided) {
      one.collective_copy.store(verdict, std::memory_order_release);
    } else {
      one.collective_copy.store(probing, std::memory_order_release);
      auto dst = std::make_unique<std::byte[]>(bytes);  // zeroed: its pages are touched
      spin_until([&] { return zero.probe_step.load(std::memory_order_acquire) >= 1; }, yield, deadline,
                 "rank 0 did not join the copy probe");
      const auto pid = zero.pid.load(std::memory_order_relaxed);
      const std::uint64_t source = zero.probe_buffer.load(std::memory_order_relaxed);
      // The fastest round of each way, [0] where rank 0 ran its step on a cpu rank 1 then did
      // not run on, [1] of any. Where ranks share cores, the scheduler can keep the two on one
      // cpu, where the data set's lines are still in its cache and single copy's extra step costs
      // a switch: on one machine the data sets measured 2.5x faster there and single copy 2.5x
      // faster between two cores, run to run. Rank 1 then leaves rank 0's cpu for the rest of
      // the probe (where its affinity allows another).
      clock::duration best[2][2];
      for (auto& of : best) of[0] = of[1] = clock::duration::max();
      const auto apart = [&] { return best[0][0] != clock::duration::max() && best[0][1] != clock::duration::max(); };
      std::optional<AwayFrom> away;
      for (std::uint32_t round = 0; round < 2 * probe_rounds || (!apart() && round < 2 * (probe_rounds + extra_rounds));
           ++round) {
        if (round == (yield ? 0 : 2 * probe_rounds)) away.emplace(zero.probe_cpu.load(std::memory_order_relaxed));
        const bool single_copy = round % 2 == 1;
        const std::uint32_t go = 2 + 2 * round, done = go + 1;
        const auto start = clock::now();
        one.probe_step.store(go, std::memory_order_release);
        spin_until([&] { return zero.probe_step.load(std::memory_order_acquire) >= go; }, yield, deadline,
                   "rank 0 stopped in the copy probe");
        if (single_copy) {
          if (read_process_memory(pid, dst.get(), source, bytes) != 0) {
            best[0][1] = best[1][1] = clock::duration::max();  // cannot: the data sets then
            break;
          }
        } else {
          core::copy(dst.get(), direct_slot(0, 0), bytes);
        }
        one.probe_step.store(done, std::memory_order_release);
        if (single_copy)
          spin_until([&] { return zero.probe_step.load(std::memory_order_acquire) >= done; }, yield, deadline,
                     "rank 0 stopped in the copy probe");
        const auto took = clock::now() - start;
        const int way = single_copy ? 1 : 0;
        if (zero.probe_cpu.load(std::memory_order_relaxed) != sched_getcpu())
          best[0][way] = std::min(best[0][way], took);
        best[1][way] = std::min(best[1][way], took);
      }
      const auto& counted = apart() ? best[0] : best[1];
      verdict = counted[1] < counted[0] ? single : sets;
      measured.store(verdict, std::memory_order_relaxed);
      one.collective_copy.store(verdict, std::memory_order_release);
    }
  }
  std::uint32_t verdict;
  for (;;) {
    // Rank 0 joins a probe; the others wait for its verdict.
    while ((verdict = one.collective_copy.load(std::memory_order_acquire)) == undecided ||
           (verdict == probing && rank != 0)) {
      if (clock::now() >= deadline)
        throw Error(ErrorCode::timeout, "shm: rank 1 attached to segment /" + name_ +
                                            " but did not decide how collectives copy before the deadline");
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
    if (verdict != probing) break;
    // Rank 0's part of the probe, until rank 1 gives its verdict.
    auto source = std::make_unique<std::byte[]>(bytes);
    std::memset(source.get(), 1, bytes);
    zero.probe_buffer.store(reinterpret_cast<std::uintptr_t>(source.get()), std::memory_order_relaxed);
    zero.probe_cpu.store(sched_getcpu(), std::memory_order_relaxed);
    zero.probe_step.store(1, std::memory_order_release);
    for (std::uint32_t round = 0;; ++round) {  // until rank 1's verdict
      const std::uint32_t go = 2 + 2 * round, done = go + 1;
      spin_until(
          [&] { return one.probe_step.load(std::memory_order_acquire) >= go || one.collective_copy.load() != probing; },
          yield, deadline, "rank 1 stopped in the copy probe");
      if (one.collective_copy.load(std::memory_order_acquire) != probing) break;  // it could not read: done early
      if (round % 2 == 0) core::copy(direct_slot(0, 0), source.get(), bytes);
      zero.probe_cpu.store(sched_getcpu(), std::memory_order_relaxed);
      zero.probe_step.store(go, std::memory_order_release);
      spin_until(
          [&] {
            return one.probe_step.load(std::memory_order_acquire) >= done || one.collective_copy.load() != probing;
          },
          yield, deadline, "rank 1 stopped in the copy probe");
      zero.probe_step.store(done, std::memory_order_release);
    }
    // The source stays until the verdict: rank 1 reads it no more after that.
    spin_until([&] { return one.collective_copy.load(std::memory_order_acquire) != probing; }, yield, deadline,
               "rank 1 did not finish the copy probe");
  }
  if (verdict != single && verdict != sets && verdict != forced_single)
    throw corrupt_segment(*this, 1, "a copy verdict of " + std::to_string(verdict));
  single_copy_collectives_ = verdict != sets;
  crowded_ = verdict == single && yield;
}

}  // namespace tutti::transport::shm
