// What the engine records of itself: the counters and allreduce records (stats), and the
// timeline, started, switched and stopped while the engine runs.
#include <filesystem>
#include <system_error>
#include <utility>

#include "engine/engine_core.hpp"

namespace tutti::engine {

void EngineCore::count(std::size_t tensors, std::size_t bytes, Clock::time_point start, Clock::time_point end,
                       bool allreduce) {
  std::lock_guard lock(stats_mutex_);
  stats_.tensors += tensors;
  stats_.collectives += 1;
  stats_.bytes += bytes;
  stats_.collective_seconds += seconds(end - start);
  if (!allreduce) return;
  if (records_.size() >= (1u << 16))
    records_.erase(records_.begin(), records_.begin() + (1u << 15));  // nobody takes them
  records_.push_back(CollectiveRecord{start, end, bytes, tensors});
}

EngineStats EngineCore::stats() const {
  std::lock_guard lock(stats_mutex_);
  return stats_;
}

std::vector<CollectiveRecord> EngineCore::take_allreduce_records() {
  std::lock_guard lock(stats_mutex_);
  std::vector<CollectiveRecord> out;
  out.swap(records_);
  return out;
}

void EngineCore::record_phase(std::string_view name, Clock::time_point start, Clock::time_point end) {
  if (const auto tl = timeline()) tl->event("step", name, start, end);
}

void EngineCore::start_timeline(const std::string& path, bool mark_cycles) {
  const int rank = options_.timeline_rank >= 0 ? options_.timeline_rank : rank_;
  const std::string file = timeline_file_for(path, rank);
  if (const auto running = timeline(); running && !file.empty()) {
    std::error_code ignored;  // the same file again: opening it truncates it under the running one
    if (std::filesystem::equivalent(running->path(), file, ignored)) stop_timeline();
  }
  // Opened before the running one is touched: a path that cannot be written leaves it running.
  auto next = file.empty() ? nullptr : std::make_shared<Timeline>(file, rank, mark_cycles);
  std::shared_ptr<Timeline> previous;
  {
    std::lock_guard lock(timeline_mutex_);
    previous = std::exchange(timeline_, std::move(next));
  }
  if (previous) previous->close();  // complete now, whoever still holds it
}

void EngineCore::stop_timeline() {
  std::shared_ptr<Timeline> previous;
  {
    std::lock_guard lock(timeline_mutex_);
    previous.swap(timeline_);
  }
  if (previous) previous->close();
}

}  // namespace tutti::engine
