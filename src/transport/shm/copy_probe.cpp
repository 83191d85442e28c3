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
#include <memory>
#include <string>
#include <thread>

#include <unistd.h>

#include "core/copy.hpp"
#include "core/env.hpp"
#include "transport/shm/segment.hpp"

namespace tutti::transport::shm {

namespace {

using clock = std::chrono::steady_clock;

enum Verdict : std::uint32_t { undecided = 0, single = 1, sets = 2, probing = 3 };

constexpr std::size_t probe_bytes = 128 * 1024;
constexpr int probe_rounds = 8;  // of each way, alternated; the fastest of each counts

// A verdict this process measured already (a split communicator's segment asks again).
std::atomic<std::uint32_t> measured{undecided};

// Spins (every rank has a core: the probe runs only then) until `done`, or throws at the deadline.
template <typename Done>
void spin_until(const Done& done, clock::time_point deadline, const std::string& what) {
  for (unsigned i = 1; !done(); ++i) {
    cpu_relax();
    if (i % 4096 == 0 && clock::now() >= deadline)
      throw Error(ErrorCode::timeout, "shm: " + what + " before the deadline (while attaching)");
  }
}

Verdict setting() {
  const std::string value = core::env("TUTTI_SHM_COLLECTIVE_COPY").value_or("auto");
  if (value == "auto") return undecided;
  if (value == "single") return single;
  if (value == "sets") return sets;
  throw Error(ErrorCode::invalid_argument,
              "TUTTI_SHM_COLLECTIVE_COPY must be auto, single or sets, not '" + value + "'");
}

}  // namespace

// Rank 1 decides and every other rank follows its verdict, so that all run the same protocol.
// The probe: rank 1 says go, rank 0 either copies 128 KiB from its own buffer into data set 0
// (the data sets) or does nothing (single copy), and answers; rank 1 then copies the bytes out of
// the set, or reads them from rank 0's buffer with process_vm_readv and waits for one more answer
// (the barrier after which a single-copy collective's owner may reuse its buffer). Rank 1 times
// each round from its go to its last step: the same steps as one chunk of either path.
void Segment::decide_collective_copy(int rank, clock::time_point deadline) {
  const int size = layout_.size;
  const Verdict forced = setting();  // every rank checks its own setting
  if (size < 2 || !single_copy_) {
    single_copy_collectives_ = false;
    return;
  }
  RankBlock &zero = rank_block(0), &one = rank_block(1);
  const std::size_t bytes = std::min(probe_bytes, static_cast<std::size_t>(size) * layout_.direct_chunk);
  if (rank == 1) {
    const long online = sysconf(_SC_NPROCESSORS_ONLN);
    Verdict verdict = forced;
    if (verdict == undecided && online > 0 && size > online) verdict = sets;  // no core each: no probe
    if (verdict == undecided) verdict = static_cast<Verdict>(measured.load(std::memory_order_relaxed));
    if (verdict != undecided) {
      one.collective_copy.store(verdict, std::memory_order_release);
    } else {
      one.collective_copy.store(probing, std::memory_order_release);
      auto dst = std::make_unique<std::byte[]>(bytes);  // zeroed: its pages are touched
      spin_until([&] { return zero.probe_step.load(std::memory_order_acquire) >= 1; }, deadline,
                 "rank 0 did not join the copy probe");
      const auto pid = zero.pid.load(std::memory_order_relaxed);
      const std::uint64_t source = zero.probe_buffer.load(std::memory_order_relaxed);
      clock::duration best[2] = {clock::duration::max(), clock::duration::max()};
      for (std::uint32_t round = 0; round < 2 * probe_rounds; ++round) {
        const bool single_copy = round % 2 == 1;
        const std::uint32_t go = 2 + 2 * round, done = go + 1;
        const auto start = clock::now();
        one.probe_step.store(go, std::memory_order_release);
        spin_until([&] { return zero.probe_step.load(std::memory_order_acquire) >= go; }, deadline,
                   "rank 0 stopped in the copy probe");
        if (single_copy) {
          if (read_process_memory(pid, dst.get(), source, bytes) != 0) {
            best[1] = clock::duration::max();  // cannot: the data sets then
            break;
          }
        } else {
          core::copy(dst.get(), direct_slot(0, 0), bytes);
        }
        one.probe_step.store(done, std::memory_order_release);
        if (single_copy)
          spin_until([&] { return zero.probe_step.load(std::memory_order_acquire) >= done; }, deadline,
                     "rank 0 stopped in the copy probe");
        best[single_copy ? 1 : 0] = std::min(best[single_copy ? 1 : 0], clock::now() - start);
      }
      verdict = best[1] < best[0] ? single : sets;
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
    zero.probe_step.store(1, std::memory_order_release);
    for (std::uint32_t round = 0; round < 2 * probe_rounds; ++round) {
      const std::uint32_t go = 2 + 2 * round, done = go + 1;
      spin_until(
          [&] { return one.probe_step.load(std::memory_order_acquire) >= go || one.collective_copy.load() != probing; },
          deadline, "rank 1 stopped in the copy probe");
      if (one.collective_copy.load(std::memory_order_acquire) != probing) break;  // it could not read: done early
      if (round % 2 == 0) core::copy(direct_slot(0, 0), source.get(), bytes);
      zero.probe_step.store(go, std::memory_order_release);
      spin_until(
          [&] {
            return one.probe_step.load(std::memory_order_acquire) >= done || one.collective_copy.load() != probing;
          },
          deadline, "rank 1 stopped in the copy probe");
      zero.probe_step.store(done, std::memory_order_release);
    }
    // The source stays until the verdict: rank 1 reads it no more after that.
    spin_until([&] { return one.collective_copy.load(std::memory_order_acquire) != probing; }, deadline,
               "rank 1 did not finish the copy probe");
  }
  if (verdict != single && verdict != sets)
    throw corrupt_segment(*this, 1, "a copy verdict of " + std::to_string(verdict));
  single_copy_collectives_ = verdict == single;
}

}  // namespace tutti::transport::shm
