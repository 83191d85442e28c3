#include "device/emulated_stream.hpp"

#include <linux/futex.h>
#include <pthread.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <ctime>
#include <utility>

#include "device/device.hpp"
#include "tutti/types.hpp"

namespace tutti::device::detail {
namespace {

// A waiting task sleeps at most this long between checks: a write that comes without a wake-up
// (another process's store without a futex wake) or a close that raced with going to sleep is
// seen within it. Slices start short (an answer usually comes soon) and double up to the limit.
constexpr std::chrono::microseconds first_slice{50};
constexpr std::chrono::microseconds last_slice{1000};

std::chrono::microseconds next_slice(std::chrono::microseconds slice) { return std::min(2 * slice, last_slice); }

std::uint32_t load(const std::uint32_t* flag) {
  return std::atomic_ref<std::uint32_t>(*const_cast<std::uint32_t*>(flag)).load(std::memory_order_acquire);
}

// Not FUTEX_PRIVATE: a flag may be in memory shared with other processes.
void futex_wait(const std::uint32_t* flag, std::uint32_t seen, std::chrono::microseconds slice) {
  timespec timeout{};
  timeout.tv_sec = static_cast<time_t>(slice.count() / 1000000);
  timeout.tv_nsec = static_cast<long>(slice.count() % 1000000) * 1000;
  syscall(SYS_futex, flag, FUTEX_WAIT, seen, &timeout, nullptr, 0);
}

}  // namespace

void wake_flag(const std::uint32_t* flag) { syscall(SYS_futex, flag, FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0); }

StreamWorker::StreamWorker() : thread_([this] { run(); }) {}

StreamWorker::~StreamWorker() { close(); }

void StreamWorker::enqueue(std::function<void()> task) {
  {
    std::lock_guard lock(mutex_);
    if (closing_) throw Error(ErrorCode::invalid_argument, "tutti::device: the stream was destroyed");
    queue_.push_back(std::move(task));
    ++enqueued_;
  }
  work_.notify_one();
}

bool StreamWorker::synchronize(std::chrono::milliseconds timeout) {
  std::unique_lock lock(mutex_);
  const std::uint64_t target = enqueued_;
  if (!idle_.wait_for(lock, timeout, [&] { return finished_ >= target; })) return false;
  if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
  return true;
}

void StreamWorker::close() {
  {
    std::lock_guard lock(mutex_);
    if (closing_ && !thread_.joinable()) return;
    closing_ = true;
  }
  releasing_.store(true, std::memory_order_release);
  work_.notify_one();
  if (const std::uint32_t* flag = waiting_on_.load(std::memory_order_acquire)) wake_flag(flag);
  if (thread_.joinable() && thread_.get_id() != std::this_thread::get_id()) thread_.join();
}

void StreamWorker::run() {
  pthread_setname_np(pthread_self(), "tutti-stream");
  std::unique_lock lock(mutex_);
  for (;;) {
    work_.wait(lock, [&] { return !queue_.empty() || closing_; });
    if (queue_.empty()) return;  // closing, and drained
    std::function<void()> task = std::move(queue_.front());
    queue_.pop_front();
    lock.unlock();
    std::exception_ptr error;
    try {
      task();
    } catch (...) {
      error = std::current_exception();
    }
    task = nullptr;  // what it holds is released before the stream counts it done
    lock.lock();
    if (error && !error_) error_ = error;
    ++finished_;
    idle_.notify_all();
  }
}

bool sleep_on_flag(const std::uint32_t* flag, std::uint32_t value, const std::function<bool()>& give_up) {
  for (auto slice = first_slice;; slice = next_slice(slice)) {
    const std::uint32_t seen = load(flag);
    if (Device::reached(seen, value)) return true;
    if (give_up()) return false;
    futex_wait(flag, seen, slice);
  }
}

bool sleep_on_event(EventState& event, std::uint64_t target, const std::function<bool()>& give_up) {
  std::unique_lock lock(event.mutex);
  for (auto slice = first_slice; event.completed < target; slice = next_slice(slice)) {
    if (give_up()) return false;
    event.changed.wait_for(lock, slice);
  }
  return true;
}

void StreamWorker::enqueue_wait_flag(const std::uint32_t* flag, std::uint32_t value) {
  enqueue([this, flag, value] { wait_flag(flag, value); });
}

void StreamWorker::enqueue_wait_event(std::shared_ptr<EventState> event, std::uint64_t target) {
  enqueue([this, event = std::move(event), target] { wait_event(*event, target); });
}

void StreamWorker::wait_flag(const std::uint32_t* flag, std::uint32_t value) {
  waiting_on_.store(flag, std::memory_order_release);
  sleep_on_flag(flag, value, [this] { return releasing(); });
  waiting_on_.store(nullptr, std::memory_order_release);
}

void StreamWorker::wait_event(EventState& event, std::uint64_t target) {
  sleep_on_event(event, target, [this] { return releasing(); });
}

}  // namespace tutti::device::detail
