// The progress line of the tools' long runs (tutti-bench's sweeps, tutti-train's epochs): one line
// on the terminal ("epoch 1/2  step 120/468  26%  ETA 14 s"), rewritten in place, shown only on a
// terminal and once the work has run for a few seconds, cleared when it ends. Under a launcher
// (tutti-run tags every line) stderr is a pipe, so the line goes to the controlling terminal
// instead, when there is one.
#pragma once

#include <cstdio>
#include <string>

namespace tutti::tools {

class Progress {
 public:
  /// `enabled`: false shows nothing (another rank, --no-progress). `total_work`: the units that
  /// update's `work_done` counts.
  Progress(bool enabled, double total_work);
  ~Progress();
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;
  /// "what  pct%  ETA s", the ETA from the rate so far.
  void update(const std::string& what, double work_done);
  /// Clears the line (before other output, and at the end).
  void finish();

 private:
  std::FILE* out_ = nullptr;  // the terminal, or null (no progress line)
  bool owned_ = false;        // out_ is /dev/tty, opened here
  double total_;
  double start_;
  bool shown_ = false;
};

}  // namespace tutti::tools
