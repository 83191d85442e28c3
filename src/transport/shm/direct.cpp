// Direct collectives over the segment's data area. Every step of an algorithm uses one of two
// data sets (alternately): each rank writes its part of the set, all meet at a barrier, then
// each reads what it needs. A set is written again two steps later, after a barrier that every
// rank reaches only once done reading it, so the next step's writes overlap the slowest reads.
//
// The barrier: rank r stores the round it enters in its DirectRound and rings every peer's
// doorbell; it waits (spinning briefly, then on its own futex) until every rank's round is as
// high. Ranks call the same collectives in the same order, so their rounds advance together.
#include "transport/shm/direct.hpp"

#include <algorithm>
#include <cstring>
#include <string>
#include <utility>

#include "reduce/reduce.hpp"
#include "transport/shm/shm_transport.hpp"

namespace tutti::transport::shm {

namespace {

using clock = std::chrono::steady_clock;

// Up to this many bytes an allreduce is one step in which every rank reduces everything itself:
// a second barrier costs more than reducing a few KiB p times.
constexpr std::size_t small_allreduce_bytes = 16 * 1024;
constexpr int spins_before_sleep = 64;
constexpr auto longest_sleep = std::chrono::milliseconds(100);  // then liveness is checked again
constexpr auto liveness_period = std::chrono::milliseconds(100);

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

// Elements [first, last) of `n` that rank `r` of `p` owns (balanced, contiguous).
std::pair<std::size_t, std::size_t> slice(std::size_t n, int p, int r) {
  const auto up = static_cast<std::size_t>(p);
  return {n * static_cast<std::size_t>(r) / up, n * static_cast<std::size_t>(r + 1) / up};
}

// One collective's view of the data area, and the barrier between its steps.
class DirectRun {
 public:
  DirectRun(ShmTransport& transport, std::string_view kind, clock::time_point deadline)
      : transport_(transport), segment_(transport.segment()), kind_(kind), deadline_(deadline) {}

  int rank() const { return transport_.rank(); }
  int size() const { return transport_.size(); }
  std::size_t chunk_bytes() const { return segment_.layout().direct_chunk; }
  std::uint64_t next_use() { return transport_.next_direct_use(); }
  std::byte* slot(std::uint64_t use, int rank) const { return segment_.direct_slot(use, rank); }
  void barrier();
  [[noreturn]] void fail(const Error& error);

 private:
  bool all_arrived(std::uint64_t round) const;
  std::string missing(std::uint64_t round) const;
  void check_liveness(std::uint64_t round);

  ShmTransport& transport_;
  Segment& segment_;
  std::string_view kind_;
  clock::time_point deadline_;
  clock::time_point next_liveness_check_{};
};

void DirectRun::fail(const Error& error) {
  transport_.abort(error, no_seq);
  throw error;
}

std::string DirectRun::missing(std::uint64_t round) const {
  std::string ranks;
  for (int q = 0; q < size(); ++q)
    if (segment_.direct_round(q).round.load(std::memory_order_seq_cst) < round)
      ranks += (ranks.empty() ? "" : ", ") + std::to_string(q);
  return ranks;
}

void DirectRun::check_liveness(std::uint64_t round) {
  const auto now = clock::now();
  if (now < next_liveness_check_) return;
  next_liveness_check_ = now + liveness_period;
  for (int q = 0; q < size(); ++q)
    if (segment_.direct_round(q).round.load(std::memory_order_seq_cst) < round && transport_.peer_has_died(q))
      fail(Error(ErrorCode::peer_failure, "shm direct " + std::string(kind_) + " on rank " + std::to_string(rank()) +
                                              ": rank " + std::to_string(q) + " died"));
}

bool DirectRun::all_arrived(std::uint64_t round) const {
  for (int q = 0; q < size(); ++q)
    if (segment_.direct_round(q).round.load(std::memory_order_seq_cst) < round) return false;
  return true;
}

// seq_cst throughout. The rank whose store comes last in the total order sees every round
// arrived and rings everyone; a waiter reads its generation before the rounds, so it either sees
// that store or sleeps on a generation that the ring bumps afterwards (see ring_doorbell).
void DirectRun::barrier() {
  auto& mine = segment_.direct_round(rank()).round;
  const std::uint64_t round = mine.load(std::memory_order_relaxed) + 1;
  mine.store(round, std::memory_order_seq_cst);
  if (all_arrived(round)) {
    for (int q = 0; q < size(); ++q)
      if (q != rank()) ring_doorbell(segment_.rank_block(q));
    return;
  }
  RankBlock& self = segment_.rank_block(rank());
  for (int spins = 0;; ++spins) {
    const std::uint32_t seen = self.generation.load(std::memory_order_seq_cst);
    if (all_arrived(round)) return;
    if (const auto failure = transport_.aborted()) throw failure->error;
    if (spins < spins_before_sleep) {
      cpu_relax();
      continue;
    }
    const auto now = clock::now();
    if (now >= deadline_)
      fail(Error(ErrorCode::timeout, "shm direct " + std::string(kind_) + " on rank " + std::to_string(rank()) +
                                         ": timed out waiting for rank(s) " + missing(round)));
    check_liveness(round);
    sleep_on_doorbell(self, seen, std::min<clock::duration>(deadline_ - now, longest_sleep));
  }
}

// dst = part 0 op part 1 op ... of every rank's slot of `use`, at byte `offset`: the same order
// on every rank, so that ranks that each reduce everything get the same bits.
void reduce_all(DirectRun& run, std::uint64_t use, std::size_t offset, std::byte* dst, std::size_t n, DataType type,
                ReduceOp op) {
  if (run.size() == 1) {
    std::memcpy(dst, run.slot(use, 0) + offset, n * size_of(type));
    return;
  }
  reduce::apply(op, type, dst, run.slot(use, 0) + offset, run.slot(use, 1) + offset, n);
  for (int q = 2; q < run.size(); ++q) reduce::apply(op, type, dst, dst, run.slot(use, q) + offset, n);
}

void allreduce_small(DirectRun& run, const std::byte* send, std::byte* recv, std::size_t count, DataType type,
                     ReduceOp op) {
  const std::uint64_t use = run.next_use();
  std::memcpy(run.slot(use, run.rank()), send, count * size_of(type));
  run.barrier();
  reduce_all(run, use, 0, recv, count, type, op);
  if (op == ReduceOp::avg) reduce::divide(type, recv, count, run.size());
}

// Per chunk: copy in, barrier, each rank reduces its slice into its own slot, barrier, copy out.
void allreduce_chunked(DirectRun& run, const std::byte* send, std::byte* recv, std::size_t count, DataType type,
                       ReduceOp op) {
  const std::size_t esize = size_of(type), per_chunk = run.chunk_bytes() / esize;
  const int p = run.size(), r = run.rank();
  for (std::size_t done = 0; done < count; done += per_chunk) {
    const std::size_t n = std::min(per_chunk, count - done);
    const std::uint64_t use = run.next_use();
    std::memcpy(run.slot(use, r), send + done * esize, n * esize);
    run.barrier();
    const auto [first, last] = slice(n, p, r);
    std::byte* mine = run.slot(use, r) + first * esize;
    for (int q = 0; q < p; ++q)
      if (q != r) reduce::apply(op, type, mine, mine, run.slot(use, q) + first * esize, last - first);
    if (op == ReduceOp::avg) reduce::divide(type, mine, last - first, p);
    run.barrier();
    for (int q = 0; q < p; ++q) {
      const auto [lo, hi] = slice(n, p, q);
      std::memcpy(recv + (done + lo) * esize, run.slot(use, q) + lo * esize, (hi - lo) * esize);
    }
  }
}

// Per chunk: each rank copies its chunk of all p blocks in, barrier, rank r reduces block r's.
void reduce_scatter(DirectRun& run, const std::byte* send, std::byte* recv, std::size_t count, DataType type,
                    ReduceOp op) {
  const int p = run.size(), r = run.rank();
  const std::size_t esize = size_of(type), per_chunk = run.chunk_bytes() / esize / static_cast<std::size_t>(p);
  for (std::size_t done = 0; done < count; done += per_chunk) {
    const std::size_t n = std::min(per_chunk, count - done);
    const std::uint64_t use = run.next_use();
    for (int q = 0; q < p; ++q)
      std::memcpy(run.slot(use, r) + static_cast<std::size_t>(q) * n * esize,
                  send + (static_cast<std::size_t>(q) * count + done) * esize, n * esize);
    run.barrier();
    reduce_all(run, use, static_cast<std::size_t>(r) * n * esize, recv + done * esize, n, type, op);
    if (op == ReduceOp::avg) reduce::divide(type, recv + done * esize, n, p);
  }
}

void allgather(DirectRun& run, const std::byte* send, std::byte* recv, std::size_t count, DataType type) {
  const int p = run.size(), r = run.rank();
  const std::size_t esize = size_of(type), per_chunk = run.chunk_bytes() / esize;
  const bool in_place = send == recv + static_cast<std::size_t>(r) * count * esize;
  for (std::size_t done = 0; done < count; done += per_chunk) {
    const std::size_t n = std::min(per_chunk, count - done);
    const std::uint64_t use = run.next_use();
    std::memcpy(run.slot(use, r), send + done * esize, n * esize);
    run.barrier();
    for (int q = 0; q < p; ++q)
      if (q != r || !in_place)
        std::memcpy(recv + (static_cast<std::size_t>(q) * count + done) * esize, run.slot(use, q), n * esize);
  }
}

// The root writes a whole data set (the p parts are contiguous) per step; the others read it.
void broadcast(DirectRun& run, std::byte* buffer, std::size_t count, DataType type, int root) {
  const std::size_t esize = size_of(type);
  const std::size_t per_chunk = run.chunk_bytes() * static_cast<std::size_t>(run.size()) / esize;
  for (std::size_t done = 0; done < count; done += per_chunk) {
    const std::size_t n = std::min(per_chunk, count - done);
    const std::uint64_t use = run.next_use();
    if (run.rank() == root) std::memcpy(run.slot(use, 0), buffer + done * esize, n * esize);
    run.barrier();
    if (run.rank() != root) std::memcpy(buffer + done * esize, run.slot(use, 0), n * esize);
  }
}

ReduceOp required_op(std::string_view kind, std::optional<ReduceOp> op) {
  if (!op) throw Error(ErrorCode::invalid_argument, "shm direct " + std::string(kind) + ": a reduction needs an op");
  return *op;
}

void run_kind(DirectRun& run, std::string_view kind, const std::byte* send, std::byte* recv, std::size_t count,
              DataType type, std::optional<ReduceOp> op, int root) {
  if (kind == "allreduce") {
    if (count * size_of(type) <= small_allreduce_bytes)
      allreduce_small(run, send, recv, count, type, required_op(kind, op));
    else
      allreduce_chunked(run, send, recv, count, type, required_op(kind, op));
  } else if (kind == "reduce_scatter") {
    reduce_scatter(run, send, recv, count, type, required_op(kind, op));
  } else if (kind == "allgather") {
    allgather(run, send, recv, count, type);
  } else {
    broadcast(run, recv, count, type, root);
  }
}

}  // namespace

bool direct_collective(Transport& transport, std::string_view kind, const void* send, void* recv, std::size_t count,
                       DataType type, std::optional<ReduceOp> op, int root, clock::time_point deadline) {
  auto* shm = dynamic_cast<ShmTransport*>(&transport);
  if (shm == nullptr) return false;
  if (kind != "allreduce" && kind != "reduce_scatter" && kind != "allgather" && kind != "broadcast")
    throw Error(ErrorCode::unsupported, "shm direct: no direct algorithm for " + std::string(kind));
  // A rank's part of a data set must hold one element of each of the p blocks.
  if (kind == "reduce_scatter" && shm->segment().layout().direct_chunk / size_of(type) < std::size_t(shm->size()))
    throw Error(ErrorCode::unsupported, "shm direct reduce_scatter: too many ranks for the data area");
  DirectRun run(*shm, kind, deadline);
  try {
    if (const auto failure = shm->aborted()) throw failure->error;
    if (kind == "broadcast" && (root < 0 || root >= shm->size()))
      throw Error(ErrorCode::invalid_argument, "shm direct broadcast: root " + std::to_string(root) +
                                                   " is out of range for size " + std::to_string(shm->size()));
    if (count == 0) return true;
    run_kind(run, kind, static_cast<const std::byte*>(send), static_cast<std::byte*>(recv), count, type, op, root);
  } catch (const Error& error) {
    run.fail(error);  // peers may be waiting at a barrier this rank will not reach
  }
  return true;
}

bool is_shm(const Transport& transport) { return dynamic_cast<const ShmTransport*>(&transport) != nullptr; }

}  // namespace tutti::transport::shm
