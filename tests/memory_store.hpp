// An in-memory Store for tests whose ranks are threads of one process (the TCP transport's
// tests): set, get with a deadline, add, guarded by one mutex.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>

#include "bootstrap/store.hpp"
#include "tutti/types.hpp"

namespace tutti::testing {

class MemoryStore : public bootstrap::Store {
 public:
  void set(const std::string& key, const std::string& value) override {
    {
      std::lock_guard lock(mutex_);
      values_[key] = value;
    }
    cv_.notify_all();
  }
  std::string get(const std::string& key, std::chrono::milliseconds timeout) override {
    std::unique_lock lock(mutex_);
    if (!cv_.wait_for(lock, timeout, [&] { return values_.count(key) > 0; }))
      throw Error(ErrorCode::timeout,
                  "store: key '" + key + "' was not set within " + std::to_string(timeout.count()) + " ms");
    return values_[key];
  }
  std::int64_t add(const std::string& key, std::int64_t delta) override {
    std::lock_guard lock(mutex_);
    const std::int64_t value = (values_.count(key) ? std::stoll(values_[key]) : 0) + delta;
    values_[key] = std::to_string(value);
    return value;
  }

 private:
  std::mutex mutex_;
  std::condition_variable cv_;
  std::map<std::string, std::string> values_;
};

}  // namespace tutti::testing
