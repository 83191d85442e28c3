// The shared-memory transport's life cycle, sleeping, aborts and the liveness of peers. The
// signature table is in shm_signatures.cpp, moving messages in shm_messages.cpp.
#include "transport/shm/shm.hpp"

#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <thread>

#include "bootstrap/auth.hpp"
#include "bootstrap/store.hpp"
#include "core/deadline.hpp"
#include "transport/shm/shm_transport.hpp"

namespace tutti::transport::shm {

namespace {

using clock = std::chrono::steady_clock;

// A sleeping rank wakes at least this often, so that its caller progresses and checks peers.
constexpr auto longest_sleep = std::chrono::milliseconds(100);

}  // namespace

std::unique_ptr<Transport> open(const std::string& name, int rank, int size, std::uint64_t comm_id,
                                std::chrono::milliseconds timeout) {
  auto segment = Segment::attach(name, rank, size, comm_id, clock::now() + timeout);
  return std::make_unique<ShmTransport>(std::move(segment), rank, timeout);
}

std::string world_segment_name(const std::string& job_id, const std::string& nonce) {
  return "tutti-" + job_id + "-world-" + nonce;
}

std::unique_ptr<Transport> open_world(bootstrap::Store& store, const std::string& key, const std::string& job_id,
                                      int rank, int size, std::uint64_t comm_id, std::chrono::milliseconds timeout) {
  const auto deadline = clock::now() + timeout;
  const auto left = [&] { return core::left_until(deadline); };
  std::string nonce;
  if (rank == 0) {
    nonce = bootstrap::random_hex(12);
    store.set(key, nonce);
  } else {
    // A store used before by a job with the same id may still hold that job's nonce: until a
    // segment of that name exists, read the key again (rank 0 overwrites it when it starts).
    for (;;) {
      nonce = store.get(key, left());
      if (nonce.size() != 24 || nonce.find_first_not_of("0123456789abcdef") != std::string::npos)
        throw Error(ErrorCode::invalid_argument, "shm: the segment nonce under store key '" + key + "' is malformed");
      const int fd = shm_open(("/" + world_segment_name(job_id, nonce)).c_str(), O_RDONLY, 0);
      if (fd >= 0) close(fd);
      if (fd >= 0 || errno != ENOENT || clock::now() >= deadline) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
  return open(world_segment_name(job_id, nonce), rank, size, comm_id, left());
}

namespace {

// How a wait passes the time before it sleeps. A futex sleep and wake-up costs several
// microseconds, more than a whole small collective. With a core per rank we spin about as long as
// a small collective takes. With more ranks than cores, spinning would steal the very core the
// peer needs, so we yield it instead (the peer runs, and we need no wake-up when it answers soon).
ShmTransport::WaitPolicy wait_policy(int ranks) {
  if (!ranks_outnumber_cores(ranks)) return {std::chrono::microseconds(50), false};
  return {std::chrono::microseconds(200), true};
}

}  // namespace

ShmTransport::ShmTransport(std::unique_ptr<Segment> segment, int rank, std::chrono::milliseconds attach_timeout)
    : segment_(std::move(segment)),
      rank_(rank),
      size_(segment_->layout().size),
      comm_id_(segment_->header().comm_id),
      attach_timeout_(attach_timeout),
      self_(segment_->rank_block(rank)),
      outbox_(static_cast<std::size_t>(size_)),
      pending_acks_(static_cast<std::size_t>(size_)),
      tail_seen_(static_cast<std::size_t>(size_), 0),
      wake_peer_(static_cast<std::size_t>(size_), 0),
      pidfds_(static_cast<std::size_t>(size_), -1),
      wait_policy_(wait_policy(size_)) {
  // Every pid is registered once attach returns. A pidfd (opened now, before the pid could be
  // reused) also reports a dead child its parent has not reaped yet, which kill(pid, 0) does not.
  const auto me = static_cast<std::int32_t>(getpid());
  for (int r = 0; r < size_; ++r) {
    const std::int32_t pid = segment_->rank_block(r).pid.load(std::memory_order_relaxed);
    if (r == rank_ || pid <= 0 || pid == me) continue;
#ifdef SYS_pidfd_open
    pidfds_[static_cast<std::size_t>(r)] = static_cast<int>(syscall(SYS_pidfd_open, pid, 0));
#endif
  }
}

// The queue fails (and so cancels) every operation before the transport goes; the mapping stays
// valid for the peers until each of them unmaps it.
ShmTransport::~ShmTransport() {
  for (int fd : pidfds_)
    if (fd >= 0) close(fd);
}

std::unique_ptr<Transport> ShmTransport::split(std::uint64_t id, const std::vector<int>& ranks, int new_rank) {
  auto segment = Segment::attach(split_segment_name(*segment_, id), new_rank, static_cast<int>(ranks.size()), id,
                                 clock::now() + attach_timeout_);
  auto child = std::make_unique<ShmTransport>(std::move(segment), new_rank, attach_timeout_);
  // A part of a communicator whose waits yield (crowded, or sharing the core with a TCP I/O thread)
  // shares those cores too.
  if (wait_policy_.yield) child->yield_while_waiting();
  return child;
}

std::uint64_t ShmTransport::generation() const { return doorbell_token(*segment_, rank_, bell_, polls_rings()); }

void ShmTransport::wait(std::uint64_t seen, clock::time_point deadline) {
  // A peer that answers within a few microseconds is cheaper to catch spinning than sleeping;
  // where ranks outnumber cores, the peer may need this very core, so each poll yields it.
  for (int i = 0; i < (wait_policy_.yield ? 0 : 64); ++i) {
    if (generation() != seen) return;
    cpu_relax();
  }
  for (const auto until = std::min(deadline, clock::now() + wait_policy_.budget); clock::now() < until;) {
    for (int i = 0; i < 32; ++i) {
      if (generation() != seen) return;
      if (wait_hook_) wait_hook_(true);
      relax();
    }
  }
  if (wait_hook_) wait_hook_(false);
  wait_in_background(seen, deadline);
}

void ShmTransport::wait_in_background(std::uint64_t seen, clock::time_point deadline) {
  const auto now = clock::now();
  slept_.store(true, std::memory_order_relaxed);
  if (now < deadline)
    sleep_on_doorbell(*segment_, rank_, bell_, seen, polls_rings(),
                      std::min<clock::duration>(deadline - now, longest_sleep));
}

void ShmTransport::wake() { ring_local(bell_, self_); }

void ShmTransport::relax() {
  if (wait_policy_.yield)
    sched_yield();
  else
    cpu_relax();
}

std::optional<Failure> ShmTransport::aborted() const {
  if (segment_->header().abort.state.load(std::memory_order_acquire) != 2) return std::nullopt;  // on every call
  return read_abort(*segment_);
}

void ShmTransport::abort(const Error& error, std::uint64_t seq) {
  AbortRecord& record = segment_->header().abort;
  std::uint32_t expected = 0;
  if (record.state.compare_exchange_strong(expected, 1, std::memory_order_acq_rel)) {
    const std::size_t length = std::min(std::strlen(error.what()), abort_text_bytes);
    record.code = static_cast<std::int32_t>(error.code());
    record.rank = rank_;
    record.seq = seq;
    std::memcpy(record.text, error.what(), length);
    record.length = static_cast<std::uint32_t>(length);
    record.state.store(2, std::memory_order_release);
  }
  for (int r = 0; r < size_; ++r) ring_doorbell(segment_->rank_block(r));
}

// A peer wrote garbage into the rings: every rank fails with the error naming it, and this rank
// reads the rings no more (their indices can no longer be trusted).
void ShmTransport::corrupted(const Error& error) {
  corrupt_ = true;
  abort(error, no_seq);
}

bool ShmTransport::waits_on(int peer) const {
  if (!outbox_[static_cast<std::size_t>(peer)].empty()) return true;
  for (const auto& [key, op] : sends_)
    if (key.peer == peer) return true;
  for (const auto& [key, op] : recvs_)
    if (key.peer == peer) return true;
  return false;
}

bool ShmTransport::peer_dead(int peer, std::int32_t pid) const {
  const int fd = pidfds_[static_cast<std::size_t>(peer)];
  if (fd >= 0) {
    pollfd ready{fd, POLLIN, 0};
    return poll(&ready, 1, 0) > 0;  // readable once the process has terminated
  }
  return kill(pid, 0) != 0 && errno == ESRCH;
}

bool ShmTransport::peer_has_died(int peer) const {
  const std::int32_t pid = segment_->rank_block(peer).pid.load(std::memory_order_relaxed);
  if (peer == rank_ || pid <= 0 || pid == static_cast<std::int32_t>(getpid())) return false;
  return peer_dead(peer, pid);
}

// A dead peer is an error only for a rank that still needs it: a peer that finished its part and
// exited normally has left everything it sent in the rings, which we drain before deciding.
// Reading the clock costs as much as a small message's own work: a caller that polls looks at it
// every 16th round, and at the first round after a sleep (a sleep may have lasted longest_sleep).
void ShmTransport::check_peers() {
  if ((++liveness_rounds_ & 15) != 0 &&
      !(slept_.load(std::memory_order_relaxed) && slept_.exchange(false, std::memory_order_relaxed)))
    return;  // (the load first: an exchange is a locked instruction, in every round)
  const auto now = clock::now();
  if (now < next_liveness_check_) return;
  next_liveness_check_ = now + liveness_period;
  const auto me = static_cast<std::int32_t>(getpid());
  for (int r = 0; r < size_; ++r) {
    const std::int32_t pid = segment_->rank_block(r).pid.load(std::memory_order_relaxed);
    if (r == rank_ || pid <= 0 || pid == me || !peer_dead(r, pid)) continue;
    drain(r);
    if (!waits_on(r)) continue;
    abort(
        Error(ErrorCode::peer_failure, "rank " + std::to_string(named(r)) + " (pid " + std::to_string(pid) + ") died"),
        no_seq);
    return;
  }
}

}  // namespace tutti::transport::shm
