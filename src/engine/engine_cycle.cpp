// The background thread's loop: when it wakes, and each cycle's negotiation round (the messages
// exchanged, the decision applied, stall warnings, join) before execute runs what is ready.
#include <algorithm>
#include <cstdio>
#include <cstring>

#include "core/log.hpp"
#include "engine/engine_core.hpp"

namespace tutti::engine {

void EngineCore::run() {
  auto next = Clock::now() + options_.cycle_time;
  try {
    for (;;) {
      // While a caller here waits, negotiate again at once: this rank then sits in the next
      // negotiation when the ranks still computing arrive, rather than in its sleep, which they
      // would have to wait out. The negotiation's own wait sleeps, so this costs no core. When
      // every rank waits and nothing moves (a stall), only an enqueue or the clock can help.
      // A rank shutting down always negotiates at once: the others' destructors, which ring only
      // their own engines, must find it there rather than wait out its cycle.
      bool leaving = false, idle = false;
      {
        std::lock_guard lock(mutex_);
        leaving = shutting_down_;
        idle = idle_;
      }
      const bool eager = (doorbell_->waiters.load() > 0 && !idle_wait_) || leaving;
      if (!eager) {
        // With nothing pending on any rank (a forward pass, say), sleep kIdleCycles cycles: an
        // enqueue rings for a round at once, and a peer's round waits for this rank's first
        // enqueue anyway, or for this longer period when this rank has nothing to enqueue.
        const auto until = idle ? next + options_.cycle_time * (kIdleCycles - 1) : next;
        std::unique_lock lock(doorbell_->mutex);
        doorbell_->cv.wait_until(lock, until, [&] { return doorbell_->rung; });
      }
      {
        std::lock_guard lock(doorbell_->mutex);
        doorbell_->rung = false;
      }
      next = Clock::now() + options_.cycle_time;
      if (!cycle()) return;
    }
  } catch (...) {
    fail_everything(std::current_exception());
  }
}

bool EngineCore::cycle() {
  Message mine;
  std::vector<std::shared_ptr<TensorState>> fresh;
  {
    std::lock_guard lock(mutex_);
    fresh.swap(inbox_);
    mine.shutting_down = shutting_down_;
    mine.aborting = aborting_;
    mine.joined = join_ != nullptr;
  }
  // A rank shutting down waits too: for the others to shut down.
  mine.waiting = doorbell_->waiters.load() > 0 || mine.shutting_down;
  // A device tensor is announced only once its stream has staged its input, so that every rank
  // agrees a name is ready only when every rank's input is in place. Until then it waits in
  // held_, looked at once a cycle (a flag load); the other tensors go on meanwhile.
  std::vector<std::shared_ptr<TensorState>> staged;
  for (auto* list : {&held_, &fresh})
    for (auto& t : *list)
      if (StreamStaging::staged(*t)) staged.push_back(std::move(t));
  std::erase(held_, nullptr);
  for (auto& t : fresh)
    if (t) held_.push_back(std::move(t));
  fresh.swap(staged);
  for (auto& t : fresh) {
    ledger_.enqueue(t->descriptor, table_, t->enqueued);
    announced_[t->descriptor.name] = t;
  }
  const auto now = Clock::now();
  if (rank_ == 0 && options_.stall_error.count() > 0) {
    for (const auto& w : table_.waiting())
      if (now - w.since >= options_.stall_error && expired_.insert(w.name).second) mine.expired.push_back(w.name);
  }
  // A tensor held on the cached path for half the stall warning (or limit) goes to the full
  // exchange, where the table sees which ranks have not enqueued it.
  auto stall = options_.stall_warning.count() > 0 ? options_.stall_warning : options_.stall_error;
  if (options_.stall_error.count() > 0) stall = std::min(stall, options_.stall_error);
  const auto stale = stall.count() > 0 ? now - stall / 2 : Clock::time_point::min();
  const bool full =
      ledger_.needs_exchange(stale) || mine.shutting_down || mine.aborting || mine.joined || !mine.expired.empty();

  const auto start = Clock::now();
  if (const auto tl = timeline()) tl->mark_cycle(start);
  // The round: one allreduce; the full exchange only where some rank asks for it.
  auto sums = ledger_.contribution(table_, full, mine.waiting);
  comm_.allreduce(sums.data(), sums.data(), sums.size(), DataType::u32, ReduceOp::sum);
  const Tally tally = table_.tally(sums);
  std::vector<Message> messages;
  std::vector<std::pair<std::string, Clock::time_point>> moved;
  if (tally.exchange > 0) {
    moved = ledger_.announce(tally, table_, mine);
    messages = exchange(mine);
  }
  const Decision decision = table_.apply(tally, messages, start);
  for (const auto& [name, since] : moved) table_.backdate(name, since);
  ledger_.settle(tally, !messages.empty(), static_cast<std::size_t>(size_));
  idle_wait_ = decision.all_waiting && !decision.progress;
  peer_waiting_.store(decision.waiting_ranks > (mine.waiting ? 1 : 0), std::memory_order_relaxed);
  const auto decided = Clock::now();
  {
    std::lock_guard lock(stats_mutex_);
    ++stats_.cycles;
    stats_.negotiation_seconds += seconds(decided - start);
  }
  {
    std::lock_guard lock(rounds_mutex_);
    ++rounds_.cycles;
    ++rounds_.allreduces;
    rounds_.allreduce_bytes = sums.size() * sizeof(std::uint32_t);
    rounds_.exchanges += messages.empty() ? 0 : 1;
  }
  for (const auto& name : mine.expired) expired_.erase(name);
  if (!decision.aborted_by.empty()) {
    fail_everything(std::make_exception_ptr(
        Error(ErrorCode::aborted, "engine: " + rank_list(decision.aborted_by) +
                                      " destroyed the engine while handling an error; every rank's engine stopped")));
    return false;
  }
  check_stalls(decided);
  execute(decision, decided);
  finish_join(decision);
  {
    std::lock_guard lock(mutex_);
    idle_ = table_.idle() && ledger_.empty() && inbox_.empty() && held_.empty();
  }
  if (decision.shutdown) {
    fail_everything(std::make_exception_ptr(Error(ErrorCode::aborted, "engine: the engine was destroyed")));
    return false;
  }
  return true;
}

std::vector<Message> EngineCore::exchange(const Message& mine) {
  const auto bytes = mine.encode(table_.cache_size());
  std::vector<std::byte> slot(kSlot);
  const auto length = static_cast<std::uint32_t>(bytes.size());
  std::memcpy(slot.data(), &length, sizeof length);
  std::memcpy(slot.data() + sizeof length, bytes.data(), std::min(bytes.size(), kSlotPayload));
  std::vector<std::byte> all(kSlot * static_cast<std::size_t>(size_));
  comm_.allgather(slot.data(), all.data(), kSlot, DataType::u8);
  {
    std::lock_guard lock(rounds_mutex_);
    ++rounds_.allgathers;
  }

  std::vector<std::size_t> lengths(static_cast<std::size_t>(size_)), rest(static_cast<std::size_t>(size_));
  std::size_t total_rest = 0;
  for (int r = 0; r < size_; ++r) {
    std::uint32_t n = 0;
    std::memcpy(&n, all.data() + kSlot * static_cast<std::size_t>(r), sizeof n);
    lengths[static_cast<std::size_t>(r)] = n;
    rest[static_cast<std::size_t>(r)] = n > kSlotPayload ? n - kSlotPayload : 0;
    total_rest += rest[static_cast<std::size_t>(r)];
  }
  std::vector<std::byte> tails(total_rest);
  if (total_rest > 0) {
    const std::size_t my_rest = rest[static_cast<std::size_t>(rank_)];
    comm_.allgatherv(bytes.data() + (my_rest ? kSlotPayload : 0), my_rest, tails.data(), rest, DataType::u8);
    std::lock_guard lock(rounds_mutex_);
    ++rounds_.allgathers;
  }
  std::vector<Message> messages;
  messages.reserve(static_cast<std::size_t>(size_));
  std::size_t tail_at = 0;
  for (int r = 0; r < size_; ++r) {
    const auto n = lengths[static_cast<std::size_t>(r)];
    std::vector<std::byte> whole(n);
    std::memcpy(whole.data(), all.data() + kSlot * static_cast<std::size_t>(r) + sizeof(std::uint32_t),
                std::min(n, kSlotPayload));
    if (n > kSlotPayload) {
      std::memcpy(whole.data() + kSlotPayload, tails.data() + tail_at, n - kSlotPayload);
      tail_at += n - kSlotPayload;
    }
    messages.push_back(Message::decode(whole, table_.cache_size()));
  }
  return messages;
}

void EngineCore::check_stalls(Clock::time_point now) {
  if (options_.stall_warning.count() <= 0) return;
  std::map<std::string, Clock::time_point> still;
  for (const auto& w : table_.waiting()) {
    if (!announced_.count(w.name)) continue;  // the ranks that enqueued it warn
    auto last = warned_.find(w.name);
    const auto since = last != warned_.end() ? last->second : w.since;
    if (now - since < options_.stall_warning) {
      if (last != warned_.end()) still.emplace(w.name, last->second);
      continue;
    }
    char waited[32];
    std::snprintf(waited, sizeof waited, "%.1f", seconds(now - w.since));
    const std::string message = "engine: stall: tensor '" + w.name + "' has waited " + waited + " s: enqueued by " +
                                rank_list(w.enqueued) + ", still missing on " + rank_list(w.missing) +
                                " (TUTTI_STALL_WARNING_S)";
    core::log(core::LogLevel::warn, rank_, message);
    if (options_.on_stall) options_.on_stall(message);
    still.emplace(w.name, now);
  }
  warned_.swap(still);
}

void EngineCore::finish_join(const Decision& decision) {
  if (!decision.joined) return;
  std::shared_ptr<TensorState> t;
  {
    std::lock_guard lock(mutex_);
    t.swap(join_);
  }
  last_joined_.store(decision.last_joined);
  if (t) t->finish(nullptr);
}

}  // namespace tutti::engine
