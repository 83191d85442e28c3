#include "common/progress.hpp"

#include <unistd.h>

#include <chrono>

namespace tutti::tools {

namespace {

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace

Progress::Progress(bool enabled, double total_work) : total_(total_work), start_(now_seconds()) {
  if (!enabled) return;
  if (::isatty(STDERR_FILENO)) {
    out_ = stderr;
  } else if ((out_ = std::fopen("/dev/tty", "w")) != nullptr) {
    owned_ = true;
  }
}

Progress::~Progress() {
  finish();
  if (owned_) std::fclose(out_);
}

void Progress::update(const std::string& what, double work_done) {
  if (out_ == nullptr) return;
  const double elapsed = now_seconds() - start_;
  if (elapsed < 3 || work_done <= 0) return;  // short runs stay quiet
  const double eta = elapsed * (total_ - work_done) / work_done;
  std::fprintf(out_, "\r\033[K%s  %3.0f%%  ETA %.0f s", what.c_str(), 100 * work_done / total_, eta);
  std::fflush(out_);
  shown_ = true;
}

void Progress::finish() {
  if (shown_) {
    std::fprintf(out_, "\r\033[K");
    std::fflush(out_);
  }
  shown_ = false;
}

}  // namespace tutti::tools
