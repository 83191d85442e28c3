#include "core/env.hpp"

#include <cstdlib>

#include "tutti/types.hpp"

namespace tutti::core {

std::optional<std::string> env(const char* name) {
  const char* value = std::getenv(name);
  if (value == nullptr || *value == '\0') return std::nullopt;
  return std::string(value);
}

long long parse_count(const std::string& text, const char* what) {
  std::size_t used = 0;
  long long value = -1;
  try {
    value = std::stoll(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != text.size() || value < 0)
    throw Error(ErrorCode::invalid_argument,
                std::string(what) + ": expected a non-negative integer, got '" + text + "'");
  return value;
}

std::chrono::milliseconds default_timeout() {
  const auto text = env("TUTTI_TIMEOUT_MS");
  if (!text) return std::chrono::milliseconds(300000);
  // Deadlines are steady_clock::now() + timeout, in 64-bit nanoseconds: a larger value would
  // overflow them (about 31 years is more than any job needs).
  constexpr long long max_ms = 1'000'000'000'000;
  const long long ms = parse_count(*text, "TUTTI_TIMEOUT_MS");
  if (ms > max_ms)
    throw Error(ErrorCode::invalid_argument,
                "TUTTI_TIMEOUT_MS: at most " + std::to_string(max_ms) + " (about 31 years), got '" + *text + "'");
  return std::chrono::milliseconds(ms);
}

}  // namespace tutti::core
