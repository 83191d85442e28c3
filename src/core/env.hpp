// Environment settings (TUTTI_*), read once and parsed strictly: a malformed value is an
// Error(invalid_argument) naming the variable, never silently ignored.
#pragma once

#include <chrono>
#include <optional>
#include <string>

namespace tutti::core {

/// The variable's value, or nullopt when unset or empty.
std::optional<std::string> env(const char* name);

/// TUTTI_TIMEOUT_MS, default 300 000 ms, at most 10^12 ms (so that now() + timeout cannot overflow).
std::chrono::milliseconds default_timeout();

/// Parses a non-negative integer; throws Error(invalid_argument) naming `what` otherwise.
long long parse_count(const std::string& text, const char* what);

}  // namespace tutti::core
