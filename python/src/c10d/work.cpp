#include "c10d/work.hpp"

#include <exception>
#include <set>
#include <string>
#include <thread>

#include <ATen/core/jit_type.h>

namespace tutti::c10d_backend {

const char* profiling_title(::c10d::OpType type) {
  using ::c10d::OpType;
  switch (type) {
    case OpType::BROADCAST:
      return "tutti:broadcast";
    case OpType::ALLREDUCE:
      return "tutti:all_reduce";
    case OpType::ALLREDUCE_COALESCED:
      return "tutti:all_reduce_coalesced";
    case OpType::REDUCE:
      return "tutti:reduce";
    case OpType::ALLGATHER:
      return "tutti:all_gather";
    case OpType::_ALLGATHER_BASE:
      return "tutti:all_gather_into_tensor";
    case OpType::ALLGATHER_COALESCED:
      return "tutti:all_gather_coalesced";
    case OpType::GATHER:
      return "tutti:gather";
    case OpType::SCATTER:
      return "tutti:scatter";
    case OpType::REDUCE_SCATTER:
      return "tutti:reduce_scatter";
    case OpType::_REDUCE_SCATTER_BASE:
      return "tutti:reduce_scatter_tensor";
    case OpType::ALLTOALL_BASE:
      return "tutti:all_to_all_single";
    case OpType::ALLTOALL:
      return "tutti:all_to_all";
    case OpType::SEND:
      return "tutti:send";
    case OpType::RECV:
      return "tutti:recv";
    case OpType::RECVANYSOURCE:
      return "tutti:recvAnySource";
    case OpType::BARRIER:
      return "tutti:barrier";
#if TORCH_VERSION_MAJOR >= 2
    case OpType::ALLGATHER_INTO_TENSOR_COALESCED:
      return "tutti:all_gather_into_tensor_coalesced";
    case OpType::REDUCE_SCATTER_TENSOR_COALESCED:
      return "tutti:reduce_scatter_tensor_coalesced";
#endif
    default:
      return "tutti:unknown";
  }
}

WorkTutti::WorkTutti(int rank, ::c10d::OpType type, tutti::Request request, std::vector<at::Tensor> outputs,
                     std::vector<at::Tensor> keep, std::function<void()> finalize, int source_rank)
    : ::c10d::Work(rank, type, profiling_title(type)),
      request_(std::move(request)),
      outputs_(std::move(outputs)),
      keep_(keep.begin(), keep.end()),
      finalize_(std::move(finalize)),
      source_rank_(source_rank),
      issued_(std::chrono::steady_clock::now()),
      future_(c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()))) {}

WorkTutti::WorkTutti(int rank, ::c10d::OpType type, Wait wait, std::vector<at::Tensor> outputs,
                     std::vector<at::Tensor> keep, std::function<void()> finalize)
    : WorkTutti(rank, type, tutti::Request(), std::move(outputs), std::move(keep), std::move(finalize)) {
  wait_ = std::move(wait);
}

namespace {

// "tutti: rank R: timeout in BARRIER: " before a timeout's message: the operation's name, and
// "timeout" as a word, which PyTorch's tests and users' log filters look for in any backend's
// timeouts (Gloo's " Timed out ", " timeout "). The error stays tutti.Timeout.
std::string timeout_prefix(int rank, ::c10d::OpType type) {
  return "tutti: rank " + std::to_string(rank) + ": timeout in " + ::c10d::opTypeToString(type) + ": ";
}

std::exception_ptr with_timeout_prefix(std::exception_ptr error, int rank, ::c10d::OpType type) {
  try {
    std::rethrow_exception(error);
  } catch (const tutti::Error& e) {
    if (e.code() == tutti::ErrorCode::timeout)
      return std::make_exception_ptr(tutti::Error(tutti::ErrorCode::timeout, timeout_prefix(rank, type) + e.what()));
  } catch (...) {
  }
  return error;
}

}  // namespace

void WorkTutti::complete(std::exception_ptr error) {
  if (error) error = with_timeout_prefix(error, rank_, opType_);
  int expected = 0;
  if (!state_.compare_exchange_strong(expected, 1)) {
    std::unique_lock lock(mutex_);
    cv_.wait(lock, [&] { return completed_; });
    return;
  }
  if (!error && finalize_) {
    try {
      finalize_();
    } catch (...) {
      error = std::current_exception();
    }
  }
  // The future first: whoever returns from wait() may read it at once.
  if (error)
    future_->setError(error);
  else
    future_->markCompleted(c10::IValue(outputs_));
  finalize_ = nullptr;
  keep_.clear();  // Tutti is done with the buffers: their storages may be resized or freed again
  state_ = 2;
  finish(error);
}

bool WorkTutti::settle(const std::function<bool()>& poll) {
  if (state_ == 2) return true;
  try {
    if (!poll()) return false;
  } catch (...) {
    complete(std::current_exception());
    return true;
  }
  complete(nullptr);
  return true;
}

bool WorkTutti::isCompleted() {
  return settle([&] { return wait_ ? wait_(std::chrono::milliseconds(0)) : request_.test(); });
}

bool WorkTutti::progress_for(std::chrono::milliseconds limit) {
  // The operation's own deadline counts from its issue, not from this slice.
  return settle([&] { return wait_ ? wait_(limit) : request_.wait_for(limit, issued_); });
}

bool WorkTutti::wait(std::chrono::milliseconds timeout) {
  if (state_ != 2) {
    if (timeout == kNoTimeout) {
      progress_for(std::chrono::hours(24 * 365));
    } else if (!progress_for(timeout)) {
      throw tutti::Error(tutti::ErrorCode::timeout, timeout_prefix(rank_, opType_) + "did not complete within " +
                                                        std::to_string(timeout.count()) + " ms (Work.wait)");
    }
  }
  std::unique_lock lock(mutex_);
  cv_.wait(lock, [&] { return completed_; });
  if (exception_) std::rethrow_exception(exception_);
  return true;
}

int WorkTutti::sourceRank() const {
  if (source_rank_ == source_of_request) {
    const int source = request_.source();
    TORCH_CHECK(source >= 0, "tutti: sourceRank() of a receive from any source that has not completed (wait first)");
    return source;
  }
  if (source_rank_ < 0) return ::c10d::Work::sourceRank();  // raises: not a receive
  return source_rank_;
}

namespace {

// Every live WorkProgress, for stop_all(); `stopped_all` once it ran.
struct Registry {
  std::mutex mutex;
  std::set<WorkProgress*> live;
  bool stopped_all = false;
};

Registry& registry() {
  static auto* const instance = new Registry;  // never destroyed: groups may outlive static destruction
  return *instance;
}

}  // namespace

WorkProgress::WorkProgress() {
  Registry& r = registry();
  std::lock_guard lock(r.mutex);
  if (r.stopped_all) {
    stop_ = true;
  } else {
    thread_ = std::thread([this] { run(); });
  }
  r.live.insert(this);
}

WorkProgress::~WorkProgress() {
  {
    Registry& r = registry();
    std::lock_guard lock(r.mutex);
    r.live.erase(this);
  }
  stop();
}

void WorkProgress::stop() {
  {
    std::lock_guard lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void WorkProgress::stop_all() {
  Registry& r = registry();
  std::lock_guard lock(r.mutex);
  r.stopped_all = true;
  for (WorkProgress* progress : r.live) progress->stop();
}

void WorkProgress::add(c10::intrusive_ptr<WorkTutti> work) {
  {
    std::lock_guard lock(mutex_);
    if (stop_) return;
    pending_.push_back(std::move(work));
  }
  wake_.notify_one();
}

void WorkProgress::run() {
  // A short slice: a later work (a receive) may complete before the oldest one, and its future
  // must not wait long for the sweep.
  constexpr std::chrono::milliseconds slice(2);
  std::unique_lock lock(mutex_);
  for (;;) {
    wake_.wait(lock, [&] { return stop_ || !pending_.empty(); });
    if (stop_) return;
    c10::intrusive_ptr<WorkTutti> oldest = pending_.front();
    lock.unlock();
    oldest->progress_for(slice);
    oldest.reset();
    lock.lock();
    // Sweep without the lock held: completing a work runs its future's callbacks, which may
    // issue more work (add() takes the lock).
    std::deque<c10::intrusive_ptr<WorkTutti>> sweep;
    sweep.swap(pending_);
    lock.unlock();
    std::deque<c10::intrusive_ptr<WorkTutti>> still;
    for (auto& work : sweep)
      if (!work->isCompleted()) still.push_back(std::move(work));
    // The completed works go here, without the lock: the last reference to a work may be this
    // one, and dropping its tensors may take the GIL, which a caller of add() holds while it
    // waits for the lock (a collective issued from a Python-side ProcessGroup).
    sweep.clear();
    lock.lock();
    // Keep issue order: what was added during the sweep goes after what was there before.
    for (auto& work : pending_) still.push_back(std::move(work));
    pending_.swap(still);  // `still` keeps only moved-from (empty) pointers: nothing to drop under the lock
  }
}

}  // namespace tutti::c10d_backend
