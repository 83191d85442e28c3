// The strict mode of the emulated device (TUTTI_EMULATED_STRICT=1, or EmulatedDevice(true)): a
// model of what a CUDA context does where it bites, so that CI fails where CUDA fails.
// - One context per process and device ordinal, shared by every EmulatedDevice of that ordinal
//   (ranks that are threads share it, as they share one GPU's context on CUDA).
// - A fixed number of hardware queues (8, or CUDA_DEVICE_MAX_CONNECTIONS), one worker thread each;
//   streams are assigned to them round-robin in creation order, and a queue runs its streams'
//   work in submission order: a stream held at a wait holds every stream behind it in its queue.
// - Implicit waits: a call that CUDA makes wait for streams (wait_for_device, wait_for_stream)
//   waits as CUDA does, and if what it waits for sits behind a held wait for longer than the hold
//   limit (TUTTI_EMULATED_STRICT_HOLD_MS, default 2000; 0: at once) it raises, naming the call
//   that would hang and the held stream.
// - Freed memory is quarantined and poisoned, not returned to the allocator; stream work that
//   touches it faults.
// - A fault (an error in a stream's work) is sticky: every later call on the context raises it,
//   and the queued work is dropped, as a CUDA context's sticky error does.
// - Host functions (the CUDA device's copies to pageable memory end in one, and read pageable
//   memory at the call: emulated.cpp does the same here) run on one thread of the context, one at
//   a time, as CUDA may serialise them; a stream at a host function holds its queue until it ran.
// - A destroyed stream's work stays queued (CUDA's cudaStreamDestroy returns at once and the work
//   stays pending); held waits are reported, not released. Only the end of the context releases
//   them (so that its threads end), and it reports what it released.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "device/emulated_stream.hpp"
#include "tutti/types.hpp"

namespace tutti::device::detail {

/// The strict mode's settings, from the environment: TUTTI_EMULATED_STRICT (0 or 1),
/// CUDA_DEVICE_MAX_CONNECTIONS (queues, 1 to 32; default 8), TUTTI_EMULATED_STRICT_HOLD_MS,
/// TUTTI_EMULATED_STRICT_QUARANTINE_MB (default 256). Error(invalid_argument) naming a malformed one.
struct StrictSettings {
  int queues = 8;
  std::chrono::milliseconds hold_limit{2000};
  std::size_t quarantine_bytes = std::size_t{256} << 20;
  static StrictSettings from_env();
};
/// Whether TUTTI_EMULATED_STRICT asks for the strict mode.
bool strict_from_env();

class EmulatedContext;
struct HardwareQueue;

/// A stream of a strict context: its work runs on the hardware queue it was assigned.
class StrictStream final : public EmulatedStream, public std::enable_shared_from_this<StrictStream> {
 public:
  StrictStream(EmulatedContext& context, HardwareQueue& queue, int id);
  void enqueue(std::function<void()> task) override;
  void enqueue_wait_flag(const std::uint32_t* flag, std::uint32_t value) override;
  void enqueue_wait_event(std::shared_ptr<EventState> event, std::uint64_t target) override;
  /// Appends a host function (cudaLaunchHostFunc): when the stream gets there, `function` runs on
  /// the context's host-function thread, and the queue waits until it has run. `what` names it.
  void enqueue_host_function(std::function<void()> function, std::string what);
  bool synchronize(std::chrono::milliseconds timeout) override;
  /// Destroys the stream as CUDA does: returns at once, its work stays queued. See detach.
  void close() override { detach(); }
  /// As close, and returns "" or what is left pending: the wait_value it is held at, and queued
  /// wait_values whose flag is not there yet (they will hold its queue until someone writes them;
  /// the interface asks callers to release every flag before they destroy a stream).
  std::string detach();
  /// The waits left pending: the wait_value it is held at, and queued wait_values whose flag is
  /// not there yet; "" if none.
  std::string pending() const;

  int id() const { return id_; }
  /// "" or the held wait at the head of this stream's queue, which holds this stream's work.
  std::string blocked_by() const;
  /// "stream 3 (hardware queue 3 of 8)"
  std::string describe() const;

 private:
  friend class EmulatedContext;
  friend struct HardwareQueue;
  struct PendingWait {
    std::uint64_t position;  // the stream's task number
    bool flag;               // wait_value (else wait_event)
    std::string what;
    std::function<bool()> satisfied;
  };
  void submit(std::function<void()> task, std::optional<PendingWait> wait);

  EmulatedContext& context_;
  HardwareQueue& queue_;
  const int id_;
  // Guarded by the queue's mutex.
  std::uint64_t enqueued_ = 0, finished_ = 0;
  bool destroyed_ = false;
  std::deque<PendingWait> waits_;  // queued, not yet started
};

class EmulatedContext {
 public:
  /// The context of device `ordinal` in this process: the one that exists while some device holds
  /// it, else a new one with `settings` (default: from the environment).
  static std::shared_ptr<EmulatedContext> acquire(int ordinal, std::optional<StrictSettings> settings = std::nullopt);

  EmulatedContext(int ordinal, StrictSettings settings);
  /// Releases the waits still held (reporting them), ends the queues, frees the quarantine.
  ~EmulatedContext();
  EmulatedContext(const EmulatedContext&) = delete;
  EmulatedContext& operator=(const EmulatedContext&) = delete;

  const StrictSettings& settings() const { return settings_; }
  int ordinal() const { return ordinal_; }

  /// A new stream on the next hardware queue (round-robin).
  std::shared_ptr<StrictStream> create_stream();

  /// What a call that CUDA makes wait for every stream of the context does: waits until the work
  /// submitted before it is done. Error(aborted) naming `call` if it waits behind a held stream
  /// longer than the hold limit; Error(timeout) after 60 s of waiting.
  void wait_for_device(const std::string& call);

  /// Runs `function` on the context's one host-function thread, after the host functions posted
  /// before it, and returns once it ran (rethrowing what it raised); returns at once, without
  /// running it, if the context faults or ends first. Called on a queue's thread.
  void run_host_function(std::function<void()> function);

  /// Raises the context's sticky error, if a fault happened; `function` says which call.
  void raise_if_faulted(const char* function) const;
  bool faulted() const;
  /// Records the first fault (an error raised by a stream's work) as the sticky error.
  void fault(const StrictStream& stream, const std::exception_ptr& error);

  /// Keeps [p, p + bytes) out of use: `release` frees it once the quarantine holds more than its
  /// limit (oldest first) or the context ends. `poison`: fill it with 0xDB bytes first.
  void quarantine(void* p, std::size_t bytes, std::string what, bool poison, std::function<void()> release);
  /// Keeps memory that a destroyed device left allocated behind a held stream (live, not poisoned:
  /// the stream may still use it): `release` frees it when the context ends, after its queues.
  void keep(std::function<void()> release);
  /// Raises (a fault, on a queue's thread) if [p, p + bytes) touches quarantined memory.
  void check_live(const void* p, std::size_t bytes, const char* function, const char* what) const;

  /// Logs a strict-mode finding (warn) and keeps it for reports().
  void report(const std::string& what);
  std::vector<std::string> reports() const;

  bool releasing() const;

 private:
  friend class StrictStream;
  void wait_until(const std::function<bool()>& done, const std::function<const HardwareQueue*()>& blocker,
                  const std::string& call);

  const int ordinal_;
  const StrictSettings settings_;
  std::vector<std::unique_ptr<HardwareQueue>> queues_;
  std::atomic<bool> faulted_{false}, releasing_{false};
  mutable std::mutex mutex_;  // what follows
  int next_stream_ = 0;
  std::optional<std::pair<ErrorCode, std::string>> sticky_;
  struct Quarantined {
    std::size_t bytes;
    std::string what;
    std::function<void()> release;
  };
  std::map<std::uintptr_t, Quarantined> quarantine_;
  std::vector<std::function<void()>> kept_;  // keep()
  std::deque<std::uintptr_t> quarantine_order_;
  std::size_t quarantine_total_ = 0;
  std::vector<std::string> reports_;
  // The host-function thread and what was posted to it (guarded by host_mutex_).
  struct HostFunction;
  void run_host_functions();
  std::mutex host_mutex_;
  std::condition_variable host_work_, host_done_;
  std::deque<std::shared_ptr<HostFunction>> host_functions_;
  bool host_stopping_ = false;
  std::thread host_thread_;  // last: starts once the rest is built
};

}  // namespace tutti::device::detail
