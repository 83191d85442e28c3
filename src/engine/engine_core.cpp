#include "engine/engine_core.hpp"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <system_error>
#include <utility>

#include "comm/comm_impl.hpp"
#include "core/copy.hpp"
#include "core/log.hpp"

namespace tutti::engine_detail {

namespace {

double seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

std::string phase_name(Collective kind) {
  switch (kind) {
    case Collective::allreduce:
      return "ALLREDUCE";
    case Collective::allgather:
      return "ALLGATHER";
    case Collective::broadcast:
      return "BROADCAST";
    default:
      return "?";
  }
}

}  // namespace

EngineCore::EngineCore(Communicator& comm, EngineOptions options, device::Device* device)
    : comm_(comm.split(0, comm.rank())),
      options_(std::move(options)),
      rank_(comm_.rank()),
      size_(comm_.size()),
      table_(size_),
      staging_(device != nullptr ? std::make_unique<StreamStaging>(*device) : nullptr) {
  if (comm_.impl()->progressed_by_caller_only())
    throw Error(ErrorCode::unsupported,
                "engine: its thread calls the communicator, but MPI was initialized below MPI_THREAD_SERIALIZED "
                "(plain MPI_Init); use MPI_Init_thread with MPI_THREAD_MULTIPLE");
  start_timeline(options_.timeline_path, false);
  thread_ = std::thread([this] { run(); });
}

EngineCore::~EngineCore() {
  {
    std::lock_guard lock(mutex_);
    shutting_down_ = true;
    aborting_ = std::uncaught_exceptions() > 0;
  }
  flush();
  thread_.join();
  // Anything enqueued after the thread's last cycle.
  std::vector<std::shared_ptr<TensorState>> left;
  {
    std::lock_guard lock(mutex_);
    left.swap(inbox_);
  }
  for (auto& t : left)
    complete(t, std::make_exception_ptr(Error(ErrorCode::aborted, "engine: tensor '" + t->descriptor.name +
                                                                      "' was pending when the engine was destroyed")));
  // Every device tensor is complete, so every stream waiting on this engine is released.
  staging_.reset();
}

void EngineCore::check_arguments(const Descriptor& d, const void* send, const void* recv) const {
  if (d.name.empty()) throw Error(ErrorCode::invalid_argument, "engine: enqueue: the tensor name is empty");
  if (d.count > 0 && (recv == nullptr || (d.kind != Collective::broadcast && send == nullptr)))
    throw Error(ErrorCode::invalid_argument,
                "engine: enqueue '" + d.name + "': null buffer with count " + std::to_string(d.count));
  if (d.kind == Collective::broadcast && (d.root < 0 || d.root >= size_))
    throw Error(ErrorCode::invalid_argument, "engine: enqueue_broadcast '" + d.name + "': root " +
                                                 std::to_string(d.root) + " is not a rank of " + std::to_string(size_));
  if (d.kind == Collective::allgather && d.count > 0 && send != recv) {
    const auto bytes = d.count * size_of(d.type);
    const auto* s = static_cast<const std::byte*>(send);
    const auto* r = static_cast<const std::byte*>(recv);
    if (s < r + bytes * static_cast<std::size_t>(size_) && r < s + bytes && s != r + bytes * rank_)
      throw Error(ErrorCode::invalid_argument, "engine: enqueue_allgather '" + d.name +
                                                   "': send overlaps recv other than at block " +
                                                   std::to_string(rank_));
  }
}

Handle EngineCore::enqueue(Descriptor d, const void* send, void* recv) {
  check_arguments(d, send, recv);
  auto t = std::make_shared<TensorState>();
  t->send = send;
  t->recv = recv;
  t->enqueued = Clock::now();
  t->doorbell = doorbell_;
  bool ring = false;
  {
    std::lock_guard lock(mutex_);
    if (failure_) std::rethrow_exception(failure_);
    if (shutting_down_)
      throw Error(ErrorCode::aborted, "engine: enqueue '" + d.name + "': the engine is shutting down");
    if (!names_.insert(d.name).second)
      throw Error(ErrorCode::invalid_argument, "engine: tensor '" + d.name + "' is already enqueued on rank " +
                                                   std::to_string(rank_) + " and has not completed");
    t->descriptor = std::move(d);
    inbox_.push_back(t);
    ring = idle_;
    idle_ = false;
  }
  if (ring || peer_waiting_.load(std::memory_order_relaxed)) doorbell_->ring();
  return Handle(t);
}

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
    if (const auto slot = table_.cached_slot(t->descriptor))
      mine.cached.push_back(*slot);
    else
      mine.described.push_back(t->descriptor);
    announced_[t->descriptor.name] = t;
  }
  if (rank_ == 0 && options_.stall_error.count() > 0) {
    const auto now = Clock::now();
    for (const auto& w : table_.waiting())
      if (now - w.since >= options_.stall_error && expired_.insert(w.name).second) mine.expired.push_back(w.name);
  }

  const auto start = Clock::now();
  if (const auto tl = timeline()) tl->mark_cycle(start);
  const auto messages = exchange(mine);
  const Decision decision = table_.apply(messages, start);
  idle_wait_ = decision.all_waiting && !decision.progress;
  peer_waiting_.store(decision.waiting_ranks > (mine.waiting ? 1 : 0), std::memory_order_relaxed);
  const auto decided = Clock::now();
  {
    std::lock_guard lock(stats_mutex_);
    ++stats_.cycles;
    stats_.negotiation_seconds += seconds(decided - start);
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
    idle_ = table_.idle() && inbox_.empty() && held_.empty();
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

std::shared_ptr<TensorState> EngineCore::joined_part(const Descriptor& d, Clock::time_point decided) {
  auto t = std::make_shared<TensorState>();
  t->descriptor = d;
  t->scratch.assign(d.count * size_of(d.type), std::byte{0});
  t->send = t->scratch.data();
  t->recv = t->scratch.data();
  t->enqueued = decided;
  return t;
}

Handle EngineCore::join() {
  auto t = std::make_shared<TensorState>();
  t->doorbell = doorbell_;
  {
    std::lock_guard lock(mutex_);
    if (failure_) std::rethrow_exception(failure_);
    if (shutting_down_) throw Error(ErrorCode::aborted, "engine: join: the engine is shutting down");
    if (join_) throw Error(ErrorCode::invalid_argument, "engine: join: this rank has joined already");
    if (!names_.empty())
      throw Error(ErrorCode::invalid_argument, "engine: join: this rank has " + std::to_string(names_.size()) +
                                                   " tensor(s) pending; wait for them first");
    join_ = t;
    idle_ = false;
  }
  doorbell_->ring();
  return Handle(t);
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

void EngineCore::execute(const Decision& decision, Clock::time_point decided) {
  for (const auto& failure : decision.failed) {
    auto it = announced_.find(failure.name);
    if (it == announced_.end()) continue;
    auto t = it->second;
    announced_.erase(it);
    complete(t, std::make_exception_ptr(Error(failure.code, failure.message)));
  }
  std::vector<std::shared_ptr<TensorState>> ready;
  ready.reserve(decision.ready.size());
  bool joined = false;
  {
    std::lock_guard lock(mutex_);
    joined = join_ != nullptr;
  }
  const auto tl = timeline();
  for (const auto& d : decision.ready) {
    auto it = announced_.find(d.name);
    std::shared_ptr<TensorState> t;
    if (it != announced_.end()) {
      t = it->second;
      announced_.erase(it);
    } else if (joined && d.kind == Collective::allreduce) {
      t = joined_part(d, decided);  // this rank joined: it reduces zeros with the others
    } else {
      // Every rank announced it, this one included (a joined rank answers allreduces only).
      throw Error(ErrorCode::system, "engine: tensor '" + d.name + "' is ready but unknown on this rank");
    }
    t->ready = decided;
    if (tl) tl->event(d.name, "NEGOTIATE", t->enqueued, decided);
    ready.push_back(std::move(t));
  }
  if (ready.empty()) {
    if (table_.idle()) step_start_ = true;
    return;
  }
  auto jobs = plan(ready);
  step_start_ = false;
  for (std::size_t i = 0; i < jobs.size(); ++i) {
    try {
      run_job(jobs[i]);
    } catch (...) {
      // The engine stops (run() fails what it still holds); these are no longer held anywhere.
      const auto error = std::current_exception();
      for (std::size_t j = i; j < jobs.size(); ++j)
        for (const auto& t : jobs[j].tensors)
          if (!t->finished()) complete(t, error);
      throw;
    }
  }
}

std::vector<EngineCore::Job> EngineCore::plan(const std::vector<std::shared_ptr<TensorState>>& ready) {
  std::vector<Descriptor> described;
  described.reserve(ready.size());
  for (const auto& t : ready) described.push_back(t->descriptor);
  std::vector<Job> jobs;
  for (const auto& members :
       plan_fusion(described, options_.fusion_threshold, options_.first_bucket_bytes, step_start_)) {
    Job job;
    for (std::size_t i : members) {
      job.tensors.push_back(ready[i]);
      job.bytes += described[i].count * size_of(described[i].type);
    }
    jobs.push_back(std::move(job));
  }
  return jobs;
}

void EngineCore::run_job(Job& job) {
  const auto start = Clock::now();
  const auto& d0 = job.tensors.front()->descriptor;
  const std::string phase = phase_name(d0.kind);
  std::string args = "\"bytes\": " + std::to_string(job.bytes) + ", \"tensors\": " + std::to_string(job.tensors.size());
  const auto tl = timeline();
  if (tl)
    for (const auto& t : job.tensors) tl->event(t->descriptor.name, "QUEUE", t->ready, start);

  if (job.tensors.size() == 1) {
    auto& t = job.tensors.front();
    if (d0.count > 0) {
      switch (d0.kind) {
        case Collective::allreduce:
          comm_.allreduce(t->send, t->recv, d0.count, d0.type, d0.op);
          break;
        case Collective::allgather:
          comm_.allgather(t->send, t->recv, d0.count, d0.type);
          break;
        case Collective::broadcast:
          comm_.broadcast(t->recv, d0.count, d0.type, d0.root);
          break;
        default:  // Descriptor::kind is one of the three (checked where it is made or decoded)
          break;
      }
    }
    const auto end = Clock::now();
    if (tl) tl->event(d0.name, phase, start, end, args);
    count(1, job.bytes, start, end, d0.kind == Collective::allreduce);
    complete(t, nullptr);
    return;
  }

  // A fused bucket of allreduces of one type and op.
  std::byte* fusion = fusion_buffer(job.bytes);
  std::size_t at = 0;
  for (const auto& t : job.tensors) {
    const auto t0 = Clock::now();
    const std::size_t n = t->descriptor.count * size_of(t->descriptor.type);
    if (n) core::copy(fusion + at, t->send, n);
    at += n;
    if (tl) tl->event(t->descriptor.name, "MEMCPY_IN_FUSION_BUFFER", t0, Clock::now());
  }
  const auto reduce_start = Clock::now();
  const std::size_t elements = job.bytes / size_of(d0.type);
  if (elements) comm_.allreduce(fusion, fusion, elements, d0.type, d0.op);
  const auto reduce_end = Clock::now();
  if (tl)
    for (const auto& t : job.tensors) tl->event(t->descriptor.name, phase, reduce_start, reduce_end, args);
  count(job.tensors.size(), job.bytes, reduce_start, reduce_end, true);
  at = 0;
  for (const auto& t : job.tensors) {
    const auto t0 = Clock::now();
    const std::size_t n = t->descriptor.count * size_of(t->descriptor.type);
    if (n) core::copy(t->recv, fusion + at, n);
    at += n;
    if (tl) tl->event(t->descriptor.name, "MEMCPY_OUT_FUSION_BUFFER", t0, Clock::now());
    complete(t, nullptr);
  }
}

void EngineCore::count(std::size_t tensors, std::size_t bytes, Clock::time_point start, Clock::time_point end,
                       bool allreduce) {
  std::lock_guard lock(stats_mutex_);
  stats_.tensors += tensors;
  stats_.collectives += 1;
  stats_.bytes += bytes;
  stats_.collective_seconds += seconds(end - start);
  if (!allreduce) return;
  if (records_.size() >= (1u << 16))
    records_.erase(records_.begin(), records_.begin() + (1u << 15));  // nobody takes them
  records_.push_back(CollectiveRecord{start, end, bytes, tensors});
}

void EngineCore::complete(const std::shared_ptr<TensorState>& t, std::exception_ptr error) {
  {
    std::lock_guard lock(mutex_);
    names_.erase(t->descriptor.name);
    if (t->on_stream && error && !stream_failure_) stream_failure_ = error;
  }
  // A device tensor's stream copies the staging back once released: with the result, or after
  // an error (the contents are then undefined). Nothing may leave it waiting.
  if (t->on_stream) staging_->release(*t);
  t->finish(std::move(error));
}

void EngineCore::fail_everything(std::exception_ptr error) {
  std::vector<std::shared_ptr<TensorState>> left;
  {
    std::lock_guard lock(mutex_);
    if (!failure_) failure_ = error;
    left.swap(inbox_);
  }
  for (auto& [name, t] : announced_) left.push_back(t);
  announced_.clear();
  left.insert(left.end(), held_.begin(), held_.end());
  held_.clear();
  {
    std::lock_guard lock(mutex_);
    if (join_) left.push_back(std::move(join_));
    join_.reset();
  }
  for (auto& t : left) complete(t, error);
}

void EngineCore::record_phase(std::string_view name, Clock::time_point start, Clock::time_point end) {
  if (const auto tl = timeline()) tl->event("step", name, start, end);
}

void EngineCore::start_timeline(const std::string& path, bool mark_cycles) {
  const int rank = options_.timeline_rank >= 0 ? options_.timeline_rank : rank_;
  const std::string file = timeline_file_for(path, rank);
  if (const auto running = timeline(); running && !file.empty()) {
    std::error_code ignored;  // the same file again: opening it truncates it under the running one
    if (std::filesystem::equivalent(running->path(), file, ignored)) stop_timeline();
  }
  // Opened before the running one is touched: a path that cannot be written leaves it running.
  auto next = file.empty() ? nullptr : std::make_shared<Timeline>(file, rank, mark_cycles);
  std::shared_ptr<Timeline> previous;
  {
    std::lock_guard lock(timeline_mutex_);
    previous = std::exchange(timeline_, std::move(next));
  }
  if (previous) previous->close();  // complete now, whoever still holds it
}

void EngineCore::stop_timeline() {
  std::shared_ptr<Timeline> previous;
  {
    std::lock_guard lock(timeline_mutex_);
    previous.swap(timeline_);
  }
  if (previous) previous->close();
}

EngineStats EngineCore::stats() const {
  std::lock_guard lock(stats_mutex_);
  return stats_;
}

std::vector<CollectiveRecord> EngineCore::take_allreduce_records() {
  std::lock_guard lock(stats_mutex_);
  std::vector<CollectiveRecord> out;
  out.swap(records_);
  return out;
}

std::byte* EngineCore::fusion_buffer(std::size_t bytes) {
  if (fusion_.size() >= bytes) return fusion_.data();
  if (fusion_plain_.size() >= bytes) return fusion_plain_.data();
  const std::size_t grown = std::max(bytes, 2 * std::max(fusion_.size(), fusion_plain_.size()));
  fusion_ = SharedBuffer();  // the old buffer goes first
  try {
    fusion_ = comm_.allocate(grown);
    fusion_plain_ = {};
    return fusion_.data();
  } catch (const Error&) {
    fusion_plain_.resize(grown);
    return fusion_plain_.data();
  }
}

}  // namespace tutti::engine_detail
