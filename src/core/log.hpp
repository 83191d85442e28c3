// Logging to stderr, filtered by TUTTI_DEBUG (warn (default), info, trace), prefixed with the rank.
#pragma once

#include <string_view>

namespace tutti::core {

enum class LogLevel { warn = 0, info = 1, trace = 2 };

/// The level TUTTI_DEBUG selects (read once).
LogLevel log_level();
inline bool log_enabled(LogLevel level) { return static_cast<int>(level) <= static_cast<int>(log_level()); }

/// Writes "tutti[rank] LEVEL: message" to stderr as one line (rank < 0: no rank).
void log(LogLevel level, int rank, std::string_view message);

}  // namespace tutti::core
