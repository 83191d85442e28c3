#include "engine/timeline.hpp"

#include <cerrno>
#include <cstring>

#include "tutti/types.hpp"

namespace tutti::engine {

std::string json_string(std::string_view text) {
  std::string out = "\"";
  for (const char c : text) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(static_cast<unsigned char>(c)));
          out += buf;
        } else {
          out += c;
        }
    }
  }
  return out + "\"";
}

Timeline::Timeline(const std::string& path, int rank, bool mark_cycles)
    : path_(path), rank_(rank), mark_cycles_(mark_cycles) {
  file_ = std::fopen(path.c_str(), "w");
  if (file_ == nullptr)
    throw Error(ErrorCode::invalid_argument, "engine timeline: cannot write '" + path + "': " + std::strerror(errno));
  std::lock_guard lock(mutex_);
  write("[\n");
  write("{\"name\": \"process_name\", \"ph\": \"M\", \"pid\": " + std::to_string(rank_) +
        ", \"args\": {\"name\": \"rank " + std::to_string(rank_) + "\"}}");
  first_ = false;
  lane_id("step");
}

Timeline::~Timeline() { close(); }

void Timeline::close() {
  std::lock_guard lock(mutex_);
  if (file_ == nullptr) return;
  write("\n]\n");
  std::fclose(file_);
  file_ = nullptr;
}

void Timeline::write(const std::string& text) { std::fwrite(text.data(), 1, text.size(), file_); }

int Timeline::lane_id(std::string_view lane) {
  const auto it = lanes_.find(std::string(lane));
  if (it != lanes_.end()) return it->second;
  const int id = static_cast<int>(lanes_.size());
  lanes_.emplace(std::string(lane), id);
  write(",\n{\"name\": \"thread_name\", \"ph\": \"M\", \"pid\": " + std::to_string(rank_) +
        ", \"tid\": " + std::to_string(id) + ", \"args\": {\"name\": " + json_string(lane) + "}}");
  write(",\n{\"name\": \"thread_sort_index\", \"ph\": \"M\", \"pid\": " + std::to_string(rank_) +
        ", \"tid\": " + std::to_string(id) + ", \"args\": {\"sort_index\": " + std::to_string(id) + "}}");
  return id;
}

void Timeline::event(std::string_view lane, std::string_view name, Clock::time_point start, Clock::time_point end,
                     std::string_view args) {
  using std::chrono::duration;
  const double ts = duration<double, std::micro>(start.time_since_epoch()).count();
  const double dur = duration<double, std::micro>(end - start).count();
  char times[96];
  std::snprintf(times, sizeof times, "\"ts\": %.3f, \"dur\": %.3f", ts, dur < 0 ? 0.0 : dur);
  std::lock_guard lock(mutex_);
  if (file_ == nullptr) return;
  const int tid = lane_id(lane);
  write(",\n{\"name\": " + json_string(name) + ", \"ph\": \"X\", \"pid\": " + std::to_string(rank_) +
        ", \"tid\": " + std::to_string(tid) + ", " + times + ", \"args\": {" + std::string(args) + "}}");
}

void Timeline::mark_cycle(Clock::time_point at) {
  if (!mark_cycles_) return;
  char ts[48];
  std::snprintf(ts, sizeof ts, "%.3f", std::chrono::duration<double, std::micro>(at.time_since_epoch()).count());
  std::lock_guard lock(mutex_);
  if (file_ == nullptr) return;
  write(",\n{\"name\": \"CYCLE_START\", \"ph\": \"i\", \"s\": \"p\", \"pid\": " + std::to_string(rank_) +
        ", \"tid\": " + std::to_string(lane_id("step")) + ", \"ts\": " + ts + "}");
}

std::string timeline_file_for(const std::string& path, int rank) {
  const auto at = path.find("{rank}");
  if (at == std::string::npos) return rank == 0 ? path : std::string();
  std::string mine = path;
  return mine.replace(at, 6, std::to_string(rank));
}

}  // namespace tutti::engine
