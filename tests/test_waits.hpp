// Small checks shared by the test suites: waiting for a condition with a deadline, and the code
// of the tutti::Error a call raises.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <thread>

#include "tutti/types.hpp"

namespace tutti::testing {

/// Polls `done` every 5 ms until it holds or `limit` passes; the result of the last check.
template <class F>
bool eventually(F done, std::chrono::milliseconds limit = std::chrono::seconds(5)) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (!done()) {
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return true;
}

/// The code of the tutti::Error that `f` raises (its text in *message); a test failure, and
/// ErrorCode::aborted, when it raises none.
template <class F>
ErrorCode error_code_of(F f, std::string* message = nullptr) {
  try {
    f();
  } catch (const Error& e) {
    if (message != nullptr) *message = e.what();
    return e.code();
  }
  ADD_FAILURE() << "no tutti::Error thrown";
  return ErrorCode::aborted;
}

}  // namespace tutti::testing
