// What is left of a deadline, as a timeout for a call that takes one (a store's get, a wait).
#pragma once

#include <algorithm>
#include <chrono>

namespace tutti::core {

/// The milliseconds left until `deadline` (steady clock), rounded up, and at least 1: a timeout
/// of 0 means "the default" to some callees, and a deadline just passed should still time out.
inline std::chrono::milliseconds left_until(std::chrono::steady_clock::time_point deadline) {
  return std::max(std::chrono::milliseconds(1),
                  std::chrono::ceil<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now()));
}

}  // namespace tutti::core
