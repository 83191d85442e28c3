// The watchdog of ipc and nccl (watchdog.hpp).
#include "gpu/watchdog.hpp"

#include <algorithm>

#include "gpu/verdict.hpp"

namespace tutti::gpu::detail {

Watchdog::Watchdog(Watched& backend, tutti::Communicator& host, std::vector<std::int64_t> pids)
    : backend_(backend), host_(host), pids_(std::move(pids)), rank_(host.rank()), thread_([this] { run(); }) {}

Watchdog::~Watchdog() { stop(); }

void Watchdog::post(Operation op) {
  {
    std::lock_guard lock(mutex_);
    posted_.push_back(std::move(op));
  }
  wake_.notify_one();
}

void Watchdog::stop() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void Watchdog::fail(const Error& error) {
  failures_.record(Error(error.code(), std::string("tutti::gpu: ") + error.what()));
  backend_.release(error);
}

bool Watchdog::failed() {
  if (!failures_.failed())
    if (auto error = backend_.noticed(nullptr)) fail(*error);
  return failures_.failed();
}

void Watchdog::check() {
  // A failure the backend noticed (a peer's) counts at once, before this thread looks.
  if (failed()) failures_.check();
}

void Watchdog::run() {
  std::deque<Watch> following;  // compared, not yet done on this rank's stream
  std::chrono::microseconds nap{1};
  for (;;) {
    std::deque<Operation> fresh;
    bool stopping = false;
    {
      std::unique_lock lock(mutex_);
      if (following.empty()) wake_.wait(lock, [this] { return stopping_ || !posted_.empty(); });
      fresh.swap(posted_);
      stopping = stopping_;
    }
    // Comparisons first (ipc's streams wait for their verdict at the end of each operation);
    // when stopping, only those: they are owed to the peers.
    for (Operation& op : fresh) {
      compare(op);
      if (!stopping) following.push_back(Watch{std::move(op), std::nullopt, std::chrono::steady_clock::now()});
    }
    if (stopping) return;
    if (following.empty()) continue;
    if (look(following.front())) {
      following.pop_front();
      nap = std::chrono::microseconds{1};
      continue;
    }
    // A nap that a newly posted operation ends: its comparison is what its stream waits for (ipc),
    // so it must not sit out the rest of a nap taken while following an earlier one.
    {
      std::unique_lock lock(mutex_);
      wake_.wait_for(lock, nap, [this] { return stopping_ || !posted_.empty(); });
    }
    nap = std::min(nap * 2, std::chrono::microseconds{1000});
  }
}

void Watchdog::compare(const Operation& op) {
  if (!failed()) {
    auto error = check_same_call(host_, op.call, backend_.describe(op));
    if (error && !failures_.failed()) fail(*error);
  }
  backend_.compared(op, failures_.failed());
}

bool Watchdog::look(Watch& w) {
  using clock = std::chrono::steady_clock;
  const Operation& op = w.op;
  if (backend_.stream_done(op)) {
    failed();  // done, perhaps because another rank failed and released every stream: its failure is ours
    return true;
  }
  if (failures_.failed()) {
    if (!backend_.follow_after_failure()) return true;
    backend_.release(*failures_.failure());  // until this rank's stream is through: a peer's may write a flag back
    return false;
  }
  if (auto error = backend_.noticed(&op)) {
    fail(*error);
    return false;
  }
  const auto timeout = timeout_of(op.call);
  const auto now = clock::now();
  if (!w.reached_at && backend_.stream_reached(op)) w.reached_at = now;
  if (w.reached_at && now - *w.reached_at > timeout) {
    fail(Error(ErrorCode::timeout, backend_.describe(op) + " timed out after " + std::to_string(timeout.count()) +
                                       " ms on this rank's stream" + backend_.late(op)));
  } else if (now >= w.next_liveness) {
    w.next_liveness = now + liveness_period;
    for (std::size_t j = 0; j < pids_.size(); ++j)
      if (static_cast<int>(j) != rank_ && pids_[j] > 0 && process_dead(pids_[j])) {
        fail(Error(ErrorCode::peer_failure, backend_.describe(op) + ": rank " + std::to_string(j) + " (pid " +
                                                std::to_string(pids_[j]) + ") died"));
        break;
      }
  }
  return false;
}

}  // namespace tutti::gpu::detail
