#include "device/emulated_context.hpp"

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <utility>

#include "core/env.hpp"
#include "core/log.hpp"
#include "device/device.hpp"
#include "device/emulated_queue.hpp"

namespace tutti::device::detail {
namespace {

using Clock = std::chrono::steady_clock;
constexpr auto implicit_wait_limit = std::chrono::seconds(60);  // only a hang reaches it
constexpr unsigned char poison_byte = 0xDB;

long long env_count(const char* name, long long fallback) {
  const auto text = core::env(name);
  return text ? core::parse_count(*text, name) : fallback;
}

std::string what_of(const std::exception_ptr& error, ErrorCode& code) {
  code = ErrorCode::system;
  try {
    std::rethrow_exception(error);
  } catch (const Error& e) {
    code = e.code();
    return e.what();
  } catch (const std::exception& e) {
    return e.what();
  } catch (...) {
    return "an unknown exception";
  }
}

}  // namespace

StrictSettings StrictSettings::from_env() {
  StrictSettings s;
  const long long queues = env_count("CUDA_DEVICE_MAX_CONNECTIONS", 8);
  if (queues < 1 || queues > 32)
    throw Error(ErrorCode::invalid_argument,
                "CUDA_DEVICE_MAX_CONNECTIONS: expected 1 to 32, got " + std::to_string(queues));
  s.queues = static_cast<int>(queues);
  s.hold_limit = std::chrono::milliseconds(env_count("TUTTI_EMULATED_STRICT_HOLD_MS", s.hold_limit.count()));
  s.quarantine_bytes = static_cast<std::size_t>(env_count("TUTTI_EMULATED_STRICT_QUARANTINE_MB", 256)) << 20;
  return s;
}

bool strict_from_env() {
  const auto text = core::env("TUTTI_EMULATED_STRICT");
  if (!text || *text == "0") return false;
  if (*text == "1") return true;
  throw Error(ErrorCode::invalid_argument, "TUTTI_EMULATED_STRICT: expected 0 or 1, got '" + *text + "'");
}

// ---- the context ----

std::shared_ptr<EmulatedContext> EmulatedContext::acquire(int ordinal, std::optional<StrictSettings> settings) {
  static std::mutex mutex;
  static std::map<int, std::weak_ptr<EmulatedContext>> contexts;
  std::lock_guard lock(mutex);
  std::weak_ptr<EmulatedContext>& known = contexts[ordinal];
  if (auto context = known.lock()) return context;
  auto context = std::make_shared<EmulatedContext>(ordinal, settings ? *settings : StrictSettings::from_env());
  known = context;
  return context;
}

EmulatedContext::EmulatedContext(int ordinal, StrictSettings settings) : ordinal_(ordinal), settings_(settings) {
  for (int q = 0; q < settings_.queues; ++q) queues_.push_back(std::make_unique<HardwareQueue>(*this, q));
  host_thread_ = std::thread([this] { run_host_functions(); });
}

EmulatedContext::~EmulatedContext() {
  releasing_.store(true, std::memory_order_release);
  for (auto& queue : queues_) {
    std::lock_guard lock(queue->mutex);
    if (queue->held_flag != nullptr) wake_flag(queue->held_flag);
  }
  {
    std::lock_guard lock(host_mutex_);
    host_stopping_ = true;  // drops what was not run; a queue waiting for it returns
  }
  host_work_.notify_all();
  host_done_.notify_all();
  queues_.clear();  // each ends its thread once its held wait gave up and the rest was dropped
  host_thread_.join();
  for (auto& [first, quarantined] : quarantine_) quarantined.release();
  for (auto& release : kept_) release();
}

void EmulatedContext::keep(std::function<void()> release) {
  std::lock_guard lock(mutex_);
  kept_.push_back(std::move(release));
}

// ---- host functions: one thread, one at a time ----

struct EmulatedContext::HostFunction {
  std::function<void()> function;
  std::exception_ptr error;
  bool done = false;
};

void EmulatedContext::run_host_function(std::function<void()> function) {
  auto posted = std::make_shared<HostFunction>();
  posted->function = std::move(function);
  std::unique_lock lock(host_mutex_);
  if (host_stopping_ || faulted()) return;
  host_functions_.push_back(posted);
  host_work_.notify_one();
  host_done_.wait(lock, [&] { return posted->done || host_stopping_; });
  if (posted->done && posted->error) std::rethrow_exception(posted->error);
}

void EmulatedContext::run_host_functions() {
  pthread_setname_np(pthread_self(), "tutti-hostfn");
  std::unique_lock lock(host_mutex_);
  for (;;) {
    host_work_.wait(lock, [&] { return !host_functions_.empty() || host_stopping_; });
    if (host_stopping_) return;
    std::shared_ptr<HostFunction> next = std::move(host_functions_.front());
    host_functions_.pop_front();
    lock.unlock();
    // After a fault (sticky) nothing more runs, as on the queues.
    if (!faulted()) {
      try {
        next->function();
      } catch (...) {
        next->error = std::current_exception();
      }
    }
    next->function = nullptr;
    lock.lock();
    next->done = true;
    host_done_.notify_all();
  }
}

std::shared_ptr<StrictStream> EmulatedContext::create_stream() {
  std::lock_guard lock(mutex_);
  const int id = next_stream_++;
  return std::make_shared<StrictStream>(*this, *queues_[static_cast<std::size_t>(id % settings_.queues)], id);
}

void EmulatedContext::wait_until(const std::function<bool()>& done,
                                 const std::function<const HardwareQueue*()>& blocker, const std::string& call) {
  const auto start = Clock::now();
  for (;;) {
    if (done()) return;
    raise_if_faulted(call.c_str());
    if (HardwareQueue* queue = const_cast<HardwareQueue*>(blocker())) {
      std::string hang;
      {
        std::lock_guard lock(queue->mutex);
        const auto now = Clock::now();
        if (queue->held_stream != nullptr && now - std::max(queue->held_since, start) >= settings_.hold_limit)
          hang = "tutti::device::" + call + " (emulated, strict) would hang: " + queue->held_description(now) +
                 ", and on CUDA this call waits until that wait is satisfied";
      }
      if (!hang.empty()) {
        report(hang);  // logged too: raised in a destructor it ends the process, its text maybe lost
        throw Error(ErrorCode::timeout, hang);
      }
    }
    if (Clock::now() - start > implicit_wait_limit)
      throw Error(ErrorCode::timeout,
                  "tutti::device::" + call + " (emulated, strict): the work it waits for was not done after 60 s");
    std::this_thread::sleep_for(std::chrono::microseconds(500));
  }
}

void EmulatedContext::wait_for_device(const std::string& call) {
  std::vector<std::uint64_t> targets;
  for (auto& queue : queues_) {
    std::lock_guard lock(queue->mutex);
    targets.push_back(queue->submitted);
  }
  auto behind = [&](std::size_t q) {
    std::lock_guard lock(queues_[q]->mutex);
    return queues_[q]->finished < targets[q];
  };
  wait_until(
      [&] {
        for (std::size_t q = 0; q < queues_.size(); ++q)
          if (behind(q)) return false;
        return true;
      },
      [&]() -> const HardwareQueue* {
        for (std::size_t q = 0; q < queues_.size(); ++q) {
          if (!behind(q)) continue;
          std::lock_guard lock(queues_[q]->mutex);
          if (queues_[q]->held_stream != nullptr) return queues_[q].get();
        }
        return nullptr;
      },
      call);
}

bool EmulatedContext::faulted() const { return faulted_.load(std::memory_order_acquire); }
bool EmulatedContext::releasing() const { return releasing_.load(std::memory_order_acquire); }

void EmulatedContext::raise_if_faulted(const char* function) const {
  if (!faulted()) return;
  std::lock_guard lock(mutex_);
  throw Error(sticky_->first, std::string("tutti::device::") + function + ": " + sticky_->second);
}

void EmulatedContext::fault(const StrictStream& stream, const std::exception_ptr& error) {
  ErrorCode code = ErrorCode::system;
  const std::string what = what_of(error, code);
  std::string message;
  {
    std::lock_guard lock(mutex_);
    if (sticky_) return;
    message = "(emulated, strict) a fault in the work of " + stream.describe() + ": " + what +
              "; the context's error is sticky, as CUDA's: every later call raises it";
    sticky_.emplace(code, message);
    faulted_.store(true, std::memory_order_release);
  }
  report(message);
}

namespace {

// Fills [p, p + bytes) with poison_byte: the 4-byte-aligned words by relaxed atomic stores (flags
// are such words), the unaligned ends byte by byte.
void poison_range(void* p, std::size_t bytes) {
  auto* byte = static_cast<unsigned char*>(p);
  unsigned char* const end = byte + bytes;
  std::uint32_t word = 0;
  std::memset(&word, poison_byte, sizeof word);
  for (; byte < end && reinterpret_cast<std::uintptr_t>(byte) % alignof(std::uint32_t) != 0; ++byte)
    std::atomic_ref<unsigned char>(*byte).store(poison_byte, std::memory_order_relaxed);
  for (; end - byte >= static_cast<std::ptrdiff_t>(sizeof word); byte += sizeof word)
    std::atomic_ref<std::uint32_t>(*reinterpret_cast<std::uint32_t*>(byte)).store(word, std::memory_order_relaxed);
  for (; byte < end; ++byte) std::atomic_ref<unsigned char>(*byte).store(poison_byte, std::memory_order_relaxed);
}

}  // namespace

void EmulatedContext::quarantine(void* p, std::size_t bytes, std::string what, bool poison,
                                 std::function<void()> release) {
  // Poisoned by atomic stores where words are whole: a wait that CUDA keeps pending may still be
  // reading a flag in this range on its queue's thread (a device destroyed with a held stream),
  // and a plain memset beside that atomic load is a data race.
  if (poison) poison_range(p, bytes);
  std::vector<std::function<void()>> evicted;
  {
    std::lock_guard lock(mutex_);
    const auto first = reinterpret_cast<std::uintptr_t>(p);
    quarantine_.insert_or_assign(first, Quarantined{bytes, std::move(what), std::move(release)});
    quarantine_order_.push_back(first);
    quarantine_total_ += bytes;
    while (quarantine_total_ > settings_.quarantine_bytes && quarantine_order_.size() > 1) {
      const auto it = quarantine_.find(quarantine_order_.front());
      quarantine_order_.pop_front();
      if (it == quarantine_.end()) continue;
      quarantine_total_ -= it->second.bytes;
      evicted.push_back(std::move(it->second.release));
      quarantine_.erase(it);
    }
  }
  for (auto& release_now : evicted) release_now();
}

void EmulatedContext::check_live(const void* p, std::size_t bytes, const char* function, const char* what) const {
  if (bytes == 0) return;
  const auto first = reinterpret_cast<std::uintptr_t>(p);
  std::lock_guard lock(mutex_);
  auto it = quarantine_.upper_bound(first + bytes - 1);  // the first range starting after ours
  if (it == quarantine_.begin()) return;
  --it;
  if (it->first + it->second.bytes <= first) return;
  throw Error(ErrorCode::system, std::string("tutti::device::") + function + " (emulated, strict): " + what + " (" +
                                     std::to_string(bytes) + " bytes at " + hex(p) + ") touches memory freed by " +
                                     it->second.what + " (" + std::to_string(it->second.bytes) + " bytes at " +
                                     hex(reinterpret_cast<void*>(it->first)) +
                                     "), kept poisoned in quarantine: a stream used it after it was freed");
}

void EmulatedContext::report(const std::string& what) {
  core::log(core::LogLevel::warn, -1, "tutti::device (emulated, strict): " + what);
  std::lock_guard lock(mutex_);
  reports_.push_back(what);
}

std::vector<std::string> EmulatedContext::reports() const {
  std::lock_guard lock(mutex_);
  return reports_;
}

}  // namespace tutti::device::detail
