// One stream of the emulated device. EmulatedStream is what the device enqueues on; StreamWorker,
// the default, is an in-order worker thread of its own per stream (the strict mode's streams share
// hardware queues instead: emulated_context.hpp).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>

namespace tutti::device::detail {

/// An event's completion, shared by the streams that record it and wait for it (records are
/// numbered; `completed` is the highest number a stream has passed).
struct EventState {
  std::mutex mutex;
  std::condition_variable changed;
  std::uint64_t recorded = 0;
  std::uint64_t completed = 0;
};

/// An in-order stream of tasks, as the emulated device enqueues them.
class EmulatedStream {
 public:
  virtual ~EmulatedStream() = default;
  /// Appends a task; returns at once. Error(invalid_argument) once the stream is closing.
  virtual void enqueue(std::function<void()> task) = 0;
  /// Appends a task that holds the stream until (std::int32_t)(*flag - value) >= 0.
  virtual void enqueue_wait_flag(const std::uint32_t* flag, std::uint32_t value) = 0;
  /// Appends a task that holds the stream until event->completed >= target.
  virtual void enqueue_wait_event(std::shared_ptr<EventState> event, std::uint64_t target) = 0;
  /// Waits until every task enqueued so far has run; false if `timeout` passed first. Rethrows
  /// (once) an exception a task raised.
  virtual bool synchronize(std::chrono::milliseconds timeout) = 0;
  /// Ends the stream (destroy_stream); what it does with the work still queued is the
  /// implementation's. Called by the stream's owner, once or more, never concurrently.
  virtual void close() = 0;
};

/// Sleeps (a futex, bounded slices, never spinning) until `flag` reaches `value` or `give_up()`.
/// Returns whether the flag reached the value.
bool sleep_on_flag(const std::uint32_t* flag, std::uint32_t value, const std::function<bool()>& give_up);
/// Sleeps (bounded slices) until event.completed >= target or `give_up()`; whether it completed.
bool sleep_on_event(EventState& event, std::uint64_t target, const std::function<bool()>& give_up);

/// Runs tasks one at a time, in the order they were enqueued, on its own thread. The tasks that
/// wait (on a flag or an event) sleep in bounded slices, never spinning, and give up when the
/// stream is closed, so that closing never hangs.
class StreamWorker final : public EmulatedStream {
 public:
  StreamWorker();
  /// Closes the stream (see close).
  ~StreamWorker() override;
  StreamWorker(const StreamWorker&) = delete;
  StreamWorker& operator=(const StreamWorker&) = delete;

  void enqueue(std::function<void()> task) override;
  void enqueue_wait_flag(const std::uint32_t* flag, std::uint32_t value) override;
  void enqueue_wait_event(std::shared_ptr<EventState> event, std::uint64_t target) override;
  bool synchronize(std::chrono::milliseconds timeout) override;
  /// Runs the tasks still queued, with every wait released (it returns at once), then ends the
  /// thread.
  void close() override;

 private:
  // The waits, called by tasks on the worker thread.
  /// Returns once (std::int32_t)(*flag - value) >= 0, or the stream is closing.
  void wait_flag(const std::uint32_t* flag, std::uint32_t value);
  /// Returns once event->completed >= target, or the stream is closing.
  void wait_event(EventState& event, std::uint64_t target);

  void run();
  bool releasing() const { return releasing_.load(std::memory_order_acquire); }

  std::mutex mutex_;
  std::condition_variable work_;  // a task was queued, or close began
  std::condition_variable idle_;  // a task finished
  std::deque<std::function<void()>> queue_;
  std::uint64_t enqueued_ = 0, finished_ = 0;
  bool closing_ = false;
  std::exception_ptr error_;
  std::atomic<bool> releasing_{false};
  std::atomic<const std::uint32_t*> waiting_on_{nullptr};  // the flag a task sleeps on, for close to wake
  std::thread thread_;
};

/// Wakes every thread sleeping on `flag` (of any process, where the flag is in shared memory).
void wake_flag(const std::uint32_t* flag);

}  // namespace tutti::device::detail
