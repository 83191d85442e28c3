#include "core/log.hpp"

#include <cstdio>
#include <string>

#include "core/env.hpp"

namespace tutti::core {

LogLevel log_level() {
  static const LogLevel level = [] {
    const auto text = env("TUTTI_DEBUG");
    if (!text || *text == "warn" || *text == "WARN") return LogLevel::warn;
    if (*text == "info" || *text == "INFO") return LogLevel::info;
    if (*text == "trace" || *text == "TRACE") return LogLevel::trace;
    std::fprintf(stderr, "tutti WARN: TUTTI_DEBUG='%s' is not warn, info or trace; using warn\n", text->c_str());
    return LogLevel::warn;
  }();
  return level;
}

void log(LogLevel level, int rank, std::string_view message) {
  static const char* names[] = {"WARN", "INFO", "TRACE"};
  std::string line = rank >= 0 ? "tutti[" + std::to_string(rank) + "] " : "tutti ";
  line += names[static_cast<int>(level)];
  line += ": ";
  line += message;
  line += '\n';
  std::fwrite(line.data(), 1, line.size(), stderr);  // one write: lines of ranks do not interleave
}

}  // namespace tutti::core
