// The engine's timeline: a Chrome-trace file (JSON array of trace events) that Perfetto and
// chrome://tracing open. One process per rank; one lane per tensor name with its phases
// (NEGOTIATE, QUEUE, MEMCPY_IN_FUSION_BUFFER, ALLREDUCE, MEMCPY_OUT_FUSION_BUFFER), and a lane
// "step" with the phases the framework reports (FORWARD, BACKWARD, OPTIMIZER). Events are
// appended as they happen and flushed as they accumulate, so a run that dies leaves a file
// the viewers still read (they accept an array without its closing bracket). With `mark_cycles`,
// each negotiation round is an instant event CYCLE_START (Horovod's cycle markers).
//
// The engine may replace or drop its timeline while it runs (Engine::start_timeline): close()
// completes the file at once, even while another thread still holds the object, and events
// recorded after it are dropped.
#pragma once

#include <chrono>
#include <cstdio>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>

namespace tutti::engine {

class Timeline {
 public:
  using Clock = std::chrono::steady_clock;

  /// Opens `path` for writing; throws Error(invalid_argument) naming the path when it cannot.
  Timeline(const std::string& path, int rank, bool mark_cycles = false);
  ~Timeline();
  Timeline(const Timeline&) = delete;
  Timeline& operator=(const Timeline&) = delete;

  /// A complete event on the lane of `lane` (a tensor name, or "step"). `args` is a JSON object
  /// body without braces (e.g. "\"bytes\": 64"), or empty.
  void event(std::string_view lane, std::string_view name, Clock::time_point start, Clock::time_point end,
             std::string_view args = {});
  /// A CYCLE_START instant event at `at`, when the timeline marks cycles; else nothing.
  void mark_cycle(Clock::time_point at);
  /// Writes the closing bracket and closes the file (a complete JSON array); later events are
  /// dropped. Idempotent; the destructor calls it.
  void close();
  const std::string& path() const { return path_; }
  bool marks_cycles() const { return mark_cycles_; }

 private:
  int lane_id(std::string_view lane);   // under mutex_
  void write(const std::string& text);  // under mutex_

  std::string path_;
  int rank_;
  bool mark_cycles_;
  std::FILE* file_ = nullptr;  // null once closed
  std::mutex mutex_;
  std::unordered_map<std::string, int> lanes_;
  bool first_ = true;
};

/// The file rank `rank` writes for the timeline setting `path` (EngineOptions::timeline_path):
/// with "{rank}" in it, the path with the rank substituted (every rank writes one); without,
/// `path` for rank 0 and "" (no file) for the others; "" for an empty path.
std::string timeline_file_for(const std::string& path, int rank);

/// `text` as a JSON string literal (with quotes).
std::string json_string(std::string_view text);

}  // namespace tutti::engine
