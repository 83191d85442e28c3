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
  return std::chrono::milliseconds(parse_count(*text, "TUTTI_TIMEOUT_MS"));
}

}  // namespace tutti::core
