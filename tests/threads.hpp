// One thread per rank: the runner every in-process multi-rank test uses.
#pragma once

#include <exception>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace tutti::testing {

/// Runs fn(r) for every rank r in [0, p), each on a thread of its own, and joins them all.
/// Returns "" or every rank's failure, one line each ("rank r: what"), in the order they came.
inline std::string on_threads(int p, const std::function<void(int)>& fn) {
  std::mutex mutex;
  std::string failures;
  std::vector<std::thread> threads;
  for (int r = 0; r < p; ++r)
    threads.emplace_back([&, r] {
      try {
        fn(r);
      } catch (const std::exception& e) {
        std::lock_guard lock(mutex);
        failures += "rank " + std::to_string(r) + ": " + e.what() + "\n";
      }
    });
  for (auto& t : threads) t.join();
  return failures;
}

}  // namespace tutti::testing
