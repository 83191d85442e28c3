// The engine's inside: the tensors' shared state, and the background thread that negotiates,
// fuses and runs the collectives. EngineCore is defined by purpose in engine_core.cpp (lifetime,
// enqueue, join), engine_cycle.cpp (the thread's loop and negotiation), engine_execute.cpp
// (fusion and the collectives), engine_recording.cpp (stats, timeline) and engine_stream.cpp.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "device/device.hpp"
#include "engine/negotiation.hpp"
#include "engine/stream_staging.hpp"
#include "engine/timeline.hpp"
#include "tutti/engine.hpp"

namespace tutti::engine {

using Clock = std::chrono::steady_clock;

inline double seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

/// Wakes the background thread early (a flush, or a waiting caller).
struct Doorbell {
  std::mutex mutex;
  std::condition_variable cv;
  bool rung = false;
  std::atomic<int> waiters{0};  // callers blocked in Handle::wait
  void ring() {
    {
      std::lock_guard lock(mutex);
      rung = true;
    }
    cv.notify_one();
  }
};

struct TensorState {
  Descriptor descriptor;
  const void* send = nullptr;
  void* recv = nullptr;
  Clock::time_point enqueued, ready;
  std::weak_ptr<Doorbell> doorbell;

  // A tensor enqueued on a stream (stream_staging.hpp): send and recv are its staging buffer.
  bool on_stream = false;
  std::uint32_t ticket = 0;
  const std::uint32_t* ready_flag = nullptr;
  std::uint32_t* done_flag = nullptr;

  std::mutex mutex;
  std::condition_variable cv;
  bool done = false;
  std::exception_ptr error;
  const std::uint32_t* copied_flag = nullptr;  // null for a host tensor, and once the copy back is seen
  std::vector<std::byte> scratch;  // a joined rank's part in another rank's allreduce: zeros, its send and recv

  /// Whether the result is in recv: at once for a host tensor; for a device tensor once its
  /// stream has copied it back. Call with `mutex` held.
  bool copied_back() {
    if (copied_flag == nullptr) return true;
    if (!device::Device::reached(device::Device::load_flag(copied_flag), ticket)) return false;
    copied_flag = nullptr;
    return true;
  }
  bool finished() {
    std::lock_guard lock(mutex);
    return done;
  }

  void finish(std::exception_ptr e) {
    {
      std::lock_guard lock(mutex);
      done = true;
      error = std::move(e);
    }
    cv.notify_all();
  }
};

class EngineCore {
 public:
  /// `device` (may be null) is the one device tensors are staged through.
  EngineCore(Communicator& comm, EngineOptions options, device::Device* device = nullptr);
  ~EngineCore();

  Handle enqueue(Descriptor d, const void* send, void* recv);
  /// A device tensor on `stream` (stream_staging.hpp): send and recv are device memory.
  Handle enqueue_on_stream(Descriptor d, const void* send, void* recv, device::Stream stream);
  /// Raises the engine's failure, or the first failure of a device tensor.
  void check();
  /// Engine::join: the handle completes once every rank has joined.
  Handle join();
  int last_joined() const { return last_joined_.load(); }
  void flush() { doorbell_->ring(); }
  void record_phase(std::string_view name, Clock::time_point start, Clock::time_point end);
  /// Engine::start_timeline and stop_timeline: any thread, any time.
  void start_timeline(const std::string& path, bool mark_cycles);
  void stop_timeline();
  EngineStats stats() const;
  std::vector<CollectiveRecord> take_allreduce_records();

  /// The negotiation's own collectives, counted since the engine started (for tests).
  struct Rounds {
    std::uint64_t cycles = 0;
    std::uint64_t allreduces = 0;     // one per cycle: the steady state
    std::uint64_t exchanges = 0;      // cycles with the full exchange
    std::uint64_t allgathers = 0;     // the full exchanges' allgathers and allgathervs
    std::size_t allreduce_bytes = 0;  // the last cycle's allreduce payload
  };
  Rounds rounds() const {
    std::lock_guard lock(rounds_mutex_);
    return rounds_;
  }

  int rank() const { return rank_; }
  int size() const { return size_; }
  const EngineOptions& options() const { return options_; }

 private:
  struct Job {  // one collective call: a fused bucket of allreduces, or one tensor
    std::vector<std::shared_ptr<TensorState>> tensors;
    std::size_t bytes = 0;
  };

  void run();
  bool cycle();
  std::vector<Message> exchange(const Message& mine);
  void check_stalls(Clock::time_point now);
  void execute(const Decision& decision, Clock::time_point decided);
  std::shared_ptr<TensorState> joined_part(const Descriptor& d, Clock::time_point decided);
  void finish_join(const Decision& decision);
  std::vector<Job> plan(const std::vector<std::shared_ptr<TensorState>>& ready);
  void run_job(Job& job);
  void complete(const std::shared_ptr<TensorState>& t, std::exception_ptr error);
  void fail_everything(std::exception_ptr error);
  void count(std::size_t tensors, std::size_t bytes, Clock::time_point start, Clock::time_point end, bool allreduce);

  /// Checks that hold for every enqueue (name, buffers, root, overlap).
  void check_arguments(const Descriptor& d, const void* send, const void* recv) const;
  /// The timeline being written, or null. A caller holds its copy for the length of what it
  /// records; a timeline stopped meanwhile is closed and drops the rest.
  std::shared_ptr<Timeline> timeline() const {
    std::lock_guard lock(timeline_mutex_);
    return timeline_;
  }

  Communicator comm_;  // the engine's own, split from the caller's
  EngineOptions options_;
  int rank_ = 0, size_ = 1;
  Table table_;
  Ledger ledger_;  // the background thread's
  mutable std::mutex rounds_mutex_;
  Rounds rounds_;
  mutable std::mutex timeline_mutex_;  // guards the pointer; the Timeline serializes its writes
  std::shared_ptr<Timeline> timeline_;
  std::shared_ptr<Doorbell> doorbell_ = std::make_shared<Doorbell>();

  // Shared with the callers' threads, under mutex_.
  std::mutex mutex_;
  std::vector<std::shared_ptr<TensorState>> inbox_;  // enqueued, not yet announced
  std::unordered_set<std::string> names_;            // this rank's tensors not yet complete
  bool shutting_down_ = false;
  bool aborting_ = false;
  bool idle_ = false;                  // the last cycle left nothing pending on any rank, nor in inbox_
  std::shared_ptr<TensorState> join_;  // while this rank has joined: the handle Engine::join returned
  std::exception_ptr failure_;         // set when the engine stopped on an error
  std::exception_ptr stream_failure_;  // the first device tensor that failed: later stream enqueues raise it

  // The background thread's own.
  std::vector<std::shared_ptr<TensorState>> held_;  // device tensors whose stream has not staged them yet
  std::unordered_map<std::string, std::shared_ptr<TensorState>> announced_;
  std::map<std::string, Clock::time_point> warned_;  // stall warnings given, by name
  std::set<std::string> expired_;                    // rank 0: names declared expired
  // The fusion buffer: shared memory (Communicator::allocate), so that on one host the fused
  // allreduce reads the peers' buffers in place (zero copy); plain memory where that fails.
  std::byte* fusion_buffer(std::size_t bytes);
  SharedBuffer fusion_;
  std::vector<std::byte> fusion_plain_;
  bool step_start_ = true;
  bool idle_wait_ = false;  // the last cycle: every rank waiting, and nothing moved
  // The last cycle: a caller on another rank was blocked waiting. That rank negotiates again at
  // once (see run()), so an enqueue here rings for a round now rather than at the next cycle.
  std::atomic<bool> peer_waiting_{false};
  std::atomic<int> last_joined_{-1};

  mutable std::mutex stats_mutex_;
  EngineStats stats_;
  std::vector<CollectiveRecord> records_;

  std::unique_ptr<StreamStaging> staging_;  // with a device only

  std::thread thread_;
};

}  // namespace tutti::engine
