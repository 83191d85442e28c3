// The strict emulated device's streams: their work queued on the hardware queue each was
// assigned, waits recorded while queued and while held (emulated_context.hpp).
#include <chrono>
#include <string>

#include "device/device.hpp"
#include "device/emulated_context.hpp"
#include "device/emulated_queue.hpp"

namespace tutti::device::detail {
namespace {

using Clock = std::chrono::steady_clock;

}  // namespace

StrictStream::StrictStream(EmulatedContext& context, HardwareQueue& queue, int id)
    : context_(context), queue_(queue), id_(id) {}

std::string StrictStream::describe() const {
  return "stream " + std::to_string(id_) + " (hardware queue " + std::to_string(queue_.index) + " of " +
         std::to_string(context_.settings().queues) + ")";
}

void StrictStream::submit(std::function<void()> task, std::optional<PendingWait> wait) {
  {
    std::lock_guard lock(queue_.mutex);
    if (destroyed_) throw Error(ErrorCode::invalid_argument, "tutti::device: the stream was destroyed");
    const bool is_wait = wait.has_value();
    if (wait) {
      wait->position = enqueued_;
      waits_.push_back(std::move(*wait));
    }
    queue_.fifo.push_back({shared_from_this(), std::move(task), is_wait, enqueued_});
    ++enqueued_;
    ++queue_.submitted;
  }
  queue_.work.notify_one();
}

void StrictStream::enqueue(std::function<void()> task) { submit(std::move(task), std::nullopt); }

void StrictStream::enqueue_wait_flag(const std::uint32_t* flag, std::uint32_t value) {
  const std::string what = "wait_value on flag " + hex(flag) + " until >= " + std::to_string(value);
  auto satisfied = [flag, value] { return Device::reached(Device::load_flag(flag), value); };
  submit(
      [this, flag, value, what] {
        context_.check_live(flag, sizeof(*flag), "wait_value", "the flag");
        queue_.hold(this, what, flag, true);
        const bool reached = sleep_on_flag(flag, value, [this] { return context_.releasing() || context_.faulted(); });
        queue_.unhold();
        if (!reached && context_.releasing())
          context_.report("the context ended with " + describe() + " held at " + what + ": released");
      },
      PendingWait{0, true, what, satisfied});
}

void StrictStream::enqueue_wait_event(std::shared_ptr<EventState> event, std::uint64_t target) {
  const std::string what = "wait_event on event " + hex(event.get()) + " (record " + std::to_string(target) + ")";
  auto satisfied = [event, target] {
    std::lock_guard lock(event->mutex);
    return event->completed >= target;
  };
  submit(
      [this, event, target, what] {
        queue_.hold(this, what, nullptr, true);
        const bool completed =
            sleep_on_event(*event, target, [this] { return context_.releasing() || context_.faulted(); });
        queue_.unhold();
        if (!completed && context_.releasing())
          context_.report("the context ended with " + describe() + " held at " + what + ": released");
      },
      PendingWait{0, false, what, satisfied});
}

void StrictStream::enqueue_host_function(std::function<void()> function, std::string what) {
  submit(
      [this, function = std::move(function), what = std::move(what)]() mutable {
        queue_.hold(this, what, nullptr, false);
        struct Unhold {
          HardwareQueue& queue;
          ~Unhold() { queue.unhold(); }
        } unhold{queue_};
        context_.run_host_function(std::move(function));
      },
      std::nullopt);
}

bool StrictStream::synchronize(std::chrono::milliseconds timeout) {
  std::unique_lock lock(queue_.mutex);
  const std::uint64_t target = enqueued_;
  const bool done = queue_.done.wait_for(lock, timeout, [&] { return finished_ >= target; });
  lock.unlock();
  context_.raise_if_faulted("synchronize");
  return done;
}

std::string StrictStream::blocked_by() const {
  std::lock_guard lock(queue_.mutex);
  if (queue_.held_stream == nullptr || finished_ >= enqueued_) return "";
  return queue_.held_description(Clock::now()) +
         (queue_.held_stream == this ? "" : ", ahead of it in its hardware queue");
}

std::string StrictStream::detach() {
  {
    std::lock_guard lock(queue_.mutex);
    if (destroyed_) return "";
    destroyed_ = true;
  }
  const std::string waits = pending();
  if (waits.empty()) return "";
  return describe() + " was destroyed with waits pending (" + waits +
         "): CUDA keeps its work pending, and everything behind it on hardware queue " + std::to_string(queue_.index) +
         " waits with it until they are satisfied";
}

std::string StrictStream::pending() const {
  std::lock_guard lock(queue_.mutex);
  std::string pending;
  // Flags only: a wait_event's record may still be queued on another stream, and completes.
  if (queue_.held_stream == this && queue_.held_flag != nullptr) pending = queue_.held_description(Clock::now());
  for (const PendingWait& wait : waits_)
    if (wait.flag && !wait.satisfied()) pending += (pending.empty() ? "" : "; ") + std::string("queued: ") + wait.what;
  return pending;
}

}  // namespace tutti::device::detail
