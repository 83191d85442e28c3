// The strict emulated device's hardware queue: one worker thread per queue that runs the work of
// the streams assigned to it in submission order (emulated_context.cpp, strict_stream.cpp).
#pragma once

#include <pthread.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "device/device.hpp"
#include "device/emulated_context.hpp"

namespace tutti::device::detail {

/// "0x7f..." for messages.
inline std::string hex(const void* p) {
  char text[32];
  std::snprintf(text, sizeof(text), "%p", p);
  return text;
}

// ---- a hardware queue: one worker thread that runs its streams' work in submission order ----

struct HardwareQueue {
  using Clock = std::chrono::steady_clock;

  struct Entry {
    std::shared_ptr<StrictStream> stream;
    std::function<void()> task;
    bool is_wait = false;
    std::uint64_t number = 0;  // the stream's task number (PendingWait::position)
  };

  HardwareQueue(EmulatedContext& c, int i) : context(c), index(i), thread([this] { run(); }) {}
  ~HardwareQueue() {
    {
      std::lock_guard lock(mutex);
      stopping = true;
    }
    work.notify_all();
    thread.join();
  }

  // The wait at the head of the queue, while it is held (called on the queue's thread). A wait
  // leaves the stream's queued waits only here, under the same lock, so that it is always either
  // queued or held to whoever looks (StrictStream::pending).
  void hold(StrictStream* stream, std::string what, const std::uint32_t* flag, bool queued_wait) {
    std::lock_guard lock(mutex);
    if (queued_wait && !stream->waits_.empty()) stream->waits_.pop_front();
    held_stream = stream;
    held_what = std::move(what);
    held_flag = flag;
    held_since = Clock::now();
  }
  void unhold() {
    std::lock_guard lock(mutex);
    held_stream = nullptr;
    held_flag = nullptr;
  }
  // "stream 3 (hardware queue 3 of 8) has been held for 12 ms at wait_value ..."; under `mutex`.
  std::string held_description(Clock::time_point now) const {
    const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(now - held_since).count();
    std::string text = held_stream->describe() + " has been held for " + std::to_string(ms) + " ms at " + held_what;
    if (held_flag != nullptr) text += " (it holds " + std::to_string(Device::load_flag(held_flag)) + ")";
    return text;
  }

  void run() {
    pthread_setname_np(pthread_self(), "tutti-hwqueue");
    std::unique_lock lock(mutex);
    for (;;) {
      work.wait(lock, [&] { return !fifo.empty() || stopping; });
      if (fifo.empty()) return;
      Entry entry = std::move(fifo.front());
      fifo.pop_front();
      lock.unlock();
      // A faulted context runs nothing more (a sticky error); an ending one drops what is left.
      if (!context.faulted() && !context.releasing()) {
        try {
          entry.task();
        } catch (...) {
          context.fault(*entry.stream, std::current_exception());
        }
      }
      entry.task = nullptr;
      lock.lock();
      // A wait that ended before it held (a fault, a dropped task) leaves the queued waits here.
      auto& waits = entry.stream->waits_;
      if (entry.is_wait && !waits.empty() && waits.front().position == entry.number) waits.pop_front();
      ++finished;
      ++entry.stream->finished_;
      done.notify_all();
    }
  }

  EmulatedContext& context;
  const int index;
  std::mutex mutex;
  std::condition_variable work, done;
  std::deque<Entry> fifo;
  std::uint64_t submitted = 0, finished = 0;
  bool stopping = false;
  const StrictStream* held_stream = nullptr;
  std::string held_what;
  const std::uint32_t* held_flag = nullptr;
  Clock::time_point held_since;
  std::thread thread;  // last: starts once the rest is built
};

}  // namespace tutti::device::detail
