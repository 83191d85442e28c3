#include "exec/progress.hpp"

#include <pthread.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <vector>

#include "exec/queue.hpp"

namespace tutti::exec {

namespace {

class Engine {
 public:
  // Named before the constructor returns (ps -L, gdb and tests see one per process).
  Engine() : thread_([this] { run(); }) { pthread_setname_np(thread_.native_handle(), "tutti-progress"); }
  ~Engine() {
    {
      std::lock_guard lock(mutex_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }

  void notify(const std::shared_ptr<OperationQueue>& queue) {
    {
      std::lock_guard lock(mutex_);
      for (auto& weak : queues_)
        if (weak.lock() == queue) {
          pending_ = true;
          cv_.notify_all();
          return;
        }
      queues_.push_back(queue);
      pending_ = true;
    }
    cv_.notify_all();
  }

 private:
  void run() {
    std::unique_lock lock(mutex_);
    while (!stop_) {
      cv_.wait(lock, [&] { return stop_ || pending_; });
      if (stop_) break;
      pending_ = false;
      std::vector<std::weak_ptr<OperationQueue>> queues = queues_;
      lock.unlock();
      const bool busy = sweep(queues);
      // A queue whose communicator is gone dies with the last of these references: they are
      // dropped only after the lock is, as its destructor fails its operations, takes its own
      // mutex (submit holds that one while it takes ours) and closes its transport, which can take
      // seconds (TCP's goodbye flush) that no other communicator's submit should wait out.
      std::vector<std::shared_ptr<OperationQueue>> held;
      lock.lock();
      std::erase_if(queues_, [&held](const auto& weak) {
        auto queue = weak.lock();
        const bool idle = !queue || !queue->has_work();
        if (queue) held.push_back(std::move(queue));
        return idle;
      });
      if (busy) pending_ = true;
      lock.unlock();
      held.clear();
      lock.lock();
    }
  }

  // Progresses every queue once; then, if one still has work, sleeps on its transport until
  // something completes (or briefly, when several communicators are busy). True while work remains.
  static bool sweep(const std::vector<std::weak_ptr<OperationQueue>>& queues) {
    std::shared_ptr<OperationQueue> busy;
    int busy_count = 0;
    std::uint64_t seen = 0;
    auto polled = std::chrono::microseconds::max();  // the shortest poll period a queue asks for
    for (const auto& weak : queues) {
      auto queue = weak.lock();
      if (!queue) continue;
      const std::uint64_t generation = queue->transport().generation();
      if (queue->progress_in_background()) {
        if (!busy) {
          busy = queue;
          seen = generation;
        }
        ++busy_count;
        if (const auto period = queue->poll_period()) polled = std::min(polled, *period);
      }
    }
    if (!busy) return false;
    const auto nap =
        std::min(polled, busy_count > 1 ? std::chrono::microseconds(200) : std::chrono::microseconds(50000));
    busy->transport().wait_in_background(seen, std::chrono::steady_clock::now() + nap);
    return true;
  }

  std::mutex mutex_;
  std::condition_variable cv_;
  std::vector<std::weak_ptr<OperationQueue>> queues_;
  bool pending_ = false;
  bool stop_ = false;
  std::thread thread_;
};

Engine& engine() {
  static Engine instance;
  return instance;
}

}  // namespace

void engine_notify(const std::shared_ptr<OperationQueue>& queue) { engine().notify(queue); }

}  // namespace tutti::exec
