#include "exec/queue.hpp"

#include <algorithm>
#include <array>

#include "core/log.hpp"
#include "exec/matched_recv.hpp"
#include "exec/progress.hpp"

namespace tutti::exec {

OperationQueue::OperationQueue(std::unique_ptr<transport::Transport> transport) : transport_(std::move(transport)) {}

OperationQueue::~OperationQueue() {
  // Buffers of unfinished operations must not be touched once the communicator is gone.
  std::lock_guard lock(mutex_);
  for (auto& op : active_) op->fail(Error(ErrorCode::aborted, "communicator destroyed"));
  for (auto& op : unordered_) op->fail(Error(ErrorCode::aborted, "communicator destroyed"));
}

void OperationQueue::check_usable(bool collective) {
  if (!failed_.load(std::memory_order_acquire) && !transport_->aborted()) return;  // every call: no lock
  std::lock_guard lock(mutex_);
  if (!aborted_) {
    if (auto failure = transport_->aborted()) fail_all_locked(*failure);
  }
  if (!aborted_) return;
  if (!reported_) {  // the caller has not seen the failure yet (it was between calls, or late)
    reported_ = true;
    if (collective && aborted_->seq == next_seq_) ++next_seq_;
    throw aborted_->error;
  }
  throw Error(ErrorCode::aborted, "communicator was aborted earlier: " + std::string(aborted_->error.what()));
}

transport::MessageKey OperationQueue::next_send_key(int peer, int tag) {
  std::lock_guard lock(mutex_);
  const std::uint32_t index = send_counters_[{peer, tag}]++;
  return transport::MessageKey{transport::Channel::point_to_point, static_cast<std::uint64_t>(tag), index};
}

std::optional<transport::MessageKey> OperationQueue::take_direct_recv_key(int peer, int tag) {
  std::lock_guard lock(mutex_);
  if (!matcher_.direct(peer, tag)) return std::nullopt;
  return matcher_.take_key(peer, tag);
}

std::shared_ptr<Operation> OperationQueue::make_matched_recv(const PointToPoint& message) {
  return std::make_shared<MatchedRecv>(*transport_, matcher_, message);
}

bool OperationQueue::run_messages(std::span<const PointToPoint> messages, std::chrono::milliseconds timeout) {
  using clock = std::chrono::steady_clock;
  constexpr std::size_t most = 2;
  if (messages.size() > most) throw Error(ErrorCode::invalid_argument, "run_messages: more than two messages");
  std::array<transport::Completion, most> done;
  const std::size_t n = messages.size();
  std::unique_lock lock(mutex_);
  for (const PointToPoint& m : messages)
    if (!m.is_send && (m.peer == PointToPoint::any_peer || !matcher_.direct(m.peer, m.tag))) return false;
  // Read at the first wait, then at every 8th: most calls end without the clock (a read costs as
  // much as a small message's own work); a wait past the deadline returns at once.
  clock::time_point deadline{};
  for (std::size_t i = 0; i < n; ++i) {
    const PointToPoint& m = messages[i];
    if (m.is_send) {
      const std::uint32_t index = send_counters_[{m.peer, m.tag}]++;
      transport_->post_send(m.peer, {transport::Channel::point_to_point, static_cast<std::uint64_t>(m.tag), index},
                            m.data, m.bytes(), &done[i]);
    } else {
      transport_->post_recv(m.peer, matcher_.take_key(m.peer, m.tag), m.data, m.bytes(), &done[i]);
    }
  }
  // What is still posted is withdrawn before an error leaves: the buffers are the caller's.
  const auto withdraw = [&] {
    for (std::size_t i = 0; i < n; ++i)
      if (done[i].state() == transport::Completion::posted) transport_->cancel(&done[i]);
  };
  for (std::uint32_t turn = 0;; ++turn) {
    const std::uint64_t seen = transport_->generation();  // read first: no wake-up is lost
    progress_locked();
    bool pending = false;
    for (std::size_t i = 0; i < n; ++i) {
      const auto state = done[i].state();
      pending = pending || state == transport::Completion::posted;
      if (state != transport::Completion::failed) continue;
      withdraw();
      const Error error(ErrorCode::mismatch, messages[i].describe() + ": " + done[i].error);
      if (!aborted_) abort_locked(error, transport::no_seq);
      reported_ = true;
      throw error;
    }
    if (!pending) return true;
    if (aborted_) {
      withdraw();
      reported_ = true;
      throw aborted_->error;
    }
    if (turn == 0) {
      deadline = clock::now() + timeout;
    } else if (turn % 8 == 0 && clock::now() >= deadline) {
      std::vector<int> peers;
      for (std::size_t i = 0; i < n; ++i)
        if (done[i].state() == transport::Completion::posted && !std::ranges::count(peers, messages[i].peer))
          peers.push_back(messages[i].peer);
      const std::size_t first_pending = done[0].state() == transport::Completion::posted ? 0 : 1;
      withdraw();
      raise_timeout_locked(messages[first_pending].describe(), peers, timeout, transport::no_seq);
    }
    lock.unlock();
    transport_->wait(seen, deadline);
    lock.lock();
  }
}

std::shared_ptr<Operation> OperationQueue::submit(std::shared_ptr<Operation> op, bool blocking) {
  std::shared_ptr<Operation> shared = std::move(op);
  std::lock_guard lock(mutex_);
  if (shared->ordered()) {
    shared->ordinal = next_ordinal_++;
    transport_->announce(shared->signature());
    active_.push_back(shared);
  } else {
    unordered_.push_back(shared);
  }
  // A rank whose signature disagrees never posts a step: announce has aborted the communicator.
  if (auto failure = transport_->aborted(); failure && shared->ordered()) {
    fail_all_locked(*failure);
    return shared;
  }
  shared->start();
  progress_locked();
  if (!blocking && outstanding_.load() > 0 && !transport_->progressed_by_caller_only())
    engine_notify(shared_from_this());
  return shared;
}

bool OperationQueue::announce_when_idle(const transport::Signature& signature) {
  std::lock_guard lock(mutex_);
  if (!active_.empty()) return false;
  transport_->announce(signature);
  if (auto failure = transport_->aborted()) {
    fail_all_locked(*failure);
    reported_ = true;
    throw failure->error;
  }
  return true;
}

// No lock: collectives are issued by one thread at a time, and with nothing outstanding the
// progress engine leaves this queue alone (what it finished is visible through `outstanding_`).
bool OperationQueue::run_now(Algorithm algorithm, const transport::NativeCall& call, transport::Signature& signature,
                             std::chrono::milliseconds timeout) {
  if (outstanding_.load(std::memory_order_acquire) != 0) return false;
  signature.seq = next_seq_;
  try {
    if (!transport_->run_now(algorithm, call, signature, timeout)) return false;
  } catch (const Error&) {
    ++next_seq_;
    mark_reported();
    throw;
  }
  ++next_seq_;
  return true;
}

void OperationQueue::fail_all_locked(const transport::Failure& failure) {
  if (!aborted_) aborted_ = failure;
  failed_.store(true, std::memory_order_release);
  if (core::log_enabled(core::LogLevel::info))
    for (auto& op : active_)
      if (!op->finished()) {
        std::string peers;
        for (int peer : op->waiting_for()) peers += " " + std::to_string(peer);
        core::log(core::LogLevel::info, rank(),
                  op->describe() + " fails with the communicator's abort; waiting for:" + peers);
      }
  for (auto& op : active_) op->fail(failure.error);
  for (auto& op : unordered_) op->fail(failure.error);
}

void OperationQueue::abort_locked(const Error& error, std::uint64_t seq) {
  transport_->abort(error, seq);  // every rank learns of it; the first error reported wins
  fail_all_locked(transport_->aborted().value_or(transport::Failure{error, seq}));
}

void OperationQueue::progress_locked() {
  // Read the abort state before progressing: whatever peers delivered before they aborted is then
  // visible to the progress below, so an operation whose messages all arrived still completes
  // (a slow rank finishing the previous call while a later one failed elsewhere).
  const std::optional<transport::Failure> failure = aborted_ ? std::nullopt : transport_->aborted();
  transport_->progress();
  const std::size_t before = active_.size() + unordered_.size();
  bool earlier_finished = true;  // every collective before `op`
  for (auto& op : active_) {
    if (op->exclusive() && !earlier_finished) continue;
    if (op->progress() && op->error() && !aborted_) abort_locked(*op->error(), op->signature().seq);
    earlier_finished = earlier_finished && op->finished();
  }
  for (auto& op : unordered_)
    if (op->progress() && op->error() && !aborted_) abort_locked(*op->error(), transport::no_seq);
  if (failure && !aborted_) fail_all_locked(*failure);
  while (!active_.empty() && active_.front()->finished()) active_.pop_front();
  std::erase_if(unordered_, [](const auto& op) { return op->finished(); });
  const std::size_t after = active_.size() + unordered_.size();
  outstanding_.store(after, std::memory_order_release);
  if (after < before) transport_->wake();  // a waiter on another thread may be waiting for these
}

void OperationQueue::wait_all() {
  std::shared_ptr<Operation> last;
  {
    std::lock_guard lock(mutex_);
    progress_locked();
    if (active_.empty()) return;
    last = active_.back();
  }
  wait(*last, std::nullopt);
}

std::optional<std::chrono::microseconds> OperationQueue::poll_period() {
  std::lock_guard lock(mutex_);
  return active_.empty() ? std::nullopt : active_.front()->poll_period();
}

bool OperationQueue::progress_in_background() {
  std::lock_guard lock(mutex_);
  progress_locked();
  return !active_.empty() || !unordered_.empty();
}

bool OperationQueue::complete_locked(const Operation& op) {
  if (!op.finished()) return false;
  if (op.error()) {
    reported_ = true;
    throw *op.error();
  }
  if (!op.ordered()) return true;
  return active_.empty() || active_.front()->ordinal > op.ordinal;
}

bool OperationQueue::test(const Operation& op) {
  std::lock_guard lock(mutex_);
  progress_locked();
  return complete_locked(op);
}

void OperationQueue::raise_timeout_locked(const Operation& op) {
  // Blame the earliest unfinished operation this one waits behind: that is what is stuck.
  const Operation* stuck = &op;
  if (op.ordered() && !active_.empty() && active_.front()->ordinal < op.ordinal) stuck = active_.front().get();
  raise_timeout_locked(stuck->describe(), stuck->waiting_for(), op.timeout,
                       stuck->ordered() ? stuck->signature().seq : transport::no_seq);
}

void OperationQueue::raise_timeout_locked(const std::string& what, const std::vector<int>& peers,
                                          std::chrono::milliseconds timeout, std::uint64_t seq) {
  std::string named;
  for (int peer : peers) named += (named.empty() ? "" : ", ") + std::to_string(peer);
  Error error(ErrorCode::timeout, "rank " + std::to_string(rank()) + ": " + what + " timed out after " +
                                      std::to_string(timeout.count()) + " ms" +
                                      (named.empty() ? "" : "; still waiting for rank(s) " + named));
  core::log(core::LogLevel::warn, rank(), error.what());
  abort_locked(error, seq);
  reported_ = true;
  throw error;
}

bool OperationQueue::wait(const Operation& op, std::optional<std::chrono::milliseconds> limit,
                          std::optional<std::chrono::steady_clock::time_point> since) {
  using clock = std::chrono::steady_clock;
  const auto start = clock::now();
  const auto deadline = since.value_or(start) + op.timeout;
  const auto give_up = limit ? std::min(deadline, start + *limit) : deadline;
  for (;;) {
    const std::uint64_t seen = transport_->generation();  // read first: no wake-up is lost
    auto wake_by = give_up;
    {
      std::lock_guard lock(mutex_);
      progress_locked();
      if (complete_locked(op)) return true;
      const auto now = clock::now();
      if (now >= deadline) raise_timeout_locked(op);
      if (now >= give_up) return false;
      // A composite at the front progresses on other communicators: poll it.
      if (!active_.empty())
        if (const auto period = active_.front()->poll_period()) wake_by = std::min(give_up, now + *period);
    }
    transport_->wait(seen, wake_by);
  }
}

}  // namespace tutti::exec
