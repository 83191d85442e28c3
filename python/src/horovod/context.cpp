#include "horovod/context.hpp"

#include <pybind11/pybind11.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <numeric>
#include <vector>

#include "tutti/topology.hpp"

namespace tutti_python::horovod {

namespace {

tutti::EngineOptions engine_options(const HorovodSettings& settings) {
  tutti::EngineOptions options = tutti::EngineOptions::from_environment();
  if (settings.fusion_threshold) options.fusion_threshold = *settings.fusion_threshold;
  if (settings.cycle_time_ms) {
    const double ms = *settings.cycle_time_ms;
    if (!std::isfinite(ms) || ms < 0 || ms > 60'000)
      throw tutti::Error(tutti::ErrorCode::invalid_argument,
                         "HOROVOD_CYCLE_TIME: expected milliseconds from 0 to 60000, got " + std::to_string(ms));
    options.cycle_time = std::chrono::microseconds(static_cast<std::int64_t>(std::llround(ms * 1000)));
  }
  if (settings.timeline) options.timeline_path = *settings.timeline;
  const auto seconds = [](double s, const char* what) {
    if (!std::isfinite(s) || s < 0 || s > 1e9)
      throw tutti::Error(tutti::ErrorCode::invalid_argument,
                         std::string(what) + ": expected seconds from 0 to 1e9, got " + std::to_string(s));
    return std::chrono::milliseconds(static_cast<std::int64_t>(std::llround(s * 1000)));
  };
  if (settings.stall_warning_s)
    options.stall_warning = seconds(*settings.stall_warning_s, "HOROVOD_STALL_CHECK_TIME_SECONDS");
  if (settings.stall_shutdown_s)
    options.stall_error = seconds(*settings.stall_shutdown_s, "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS");
  return options;
}

}  // namespace

Context::Context(const HorovodSettings& settings, tutti::Communicator world) : world_(std::move(world)) {
  const tutti::EngineOptions options = engine_options(settings);
  const tutti::HostLayout layout = tutti::host_layout(world_);
  local_rank_ = layout.local_rank;
  local_size_ = layout.local_size;
  cross_rank_ = layout.host;
  cross_size_ = layout.host_count;
  options_ = options;
  ProcessSet global;
  global.ranks.resize(static_cast<std::size_t>(world_.size()));
  std::iota(global.ranks.begin(), global.ranks.end(), 0);
  global.engine = std::make_unique<tutti::Engine>(world_, options);
  global.comm = world_;
  sets_.emplace(0, std::move(global));
}

Context::~Context() {
  ops_.clear();
  // Collective over each set, in the same order on every rank; the global set's last.
  for (auto it = sets_.rbegin(); it != sets_.rend(); ++it) it->second.engine.reset();
  sets_.clear();
}

namespace {

std::string rank_text(const std::vector<int>& ranks) {
  std::string s = "[";
  for (std::size_t i = 0; i < ranks.size(); ++i) s += (i ? ", " : "") + std::to_string(ranks[i]);
  return s + "]";
}

}  // namespace

ProcessSet& Context::process_set(int id) {
  auto it = sets_.find(id);
  if (it == sets_.end())
    throw tutti::Error(tutti::ErrorCode::invalid_argument, "tutti.horovod: process set " + std::to_string(id) +
                                                               " does not exist (removed, or never added)");
  if (!it->second.member())
    throw tutti::Error(tutti::ErrorCode::invalid_argument, "tutti.horovod: rank " + std::to_string(rank()) +
                                                               " is not a member of process set " + std::to_string(id) +
                                                               " " + rank_text(it->second.ranks));
  return it->second;
}

const std::vector<int>& Context::process_set_ranks(int id) const {
  auto it = sets_.find(id);
  if (it == sets_.end())
    throw tutti::Error(tutti::ErrorCode::invalid_argument, "tutti.horovod: process set " + std::to_string(id) +
                                                               " does not exist (removed, or never added)");
  return it->second.ranks;
}

int Context::add_process_set(std::vector<int> ranks) {
  std::sort(ranks.begin(), ranks.end());
  ranks.erase(std::unique(ranks.begin(), ranks.end()), ranks.end());
  // Every rank must pass the same list: a hash of it, compared before anything is split.
  std::string text = rank_text(ranks);
  const std::size_t hash = std::hash<std::string>{}(text);
  const auto mine = static_cast<std::int64_t>(hash >> 1);
  std::vector<std::int64_t> all(static_cast<std::size_t>(size()));
  world_.allgather(&mine, all.data(), 1, tutti::DataType::i64);
  for (int r = 0; r < size(); ++r)
    if (all[static_cast<std::size_t>(r)] != mine)
      throw tutti::Error(tutti::ErrorCode::mismatch, "tutti.horovod add_process_set (rank " + std::to_string(rank()) +
                                                         "): rank " + std::to_string(r) +
                                                         " passed other ranks than this rank's " + text);
  if (ranks.empty() || ranks.front() < 0 || ranks.back() >= size())
    throw tutti::Error(tutti::ErrorCode::invalid_argument, "tutti.horovod add_process_set: ranks " + text +
                                                               " must be non-empty and each in [0, " +
                                                               std::to_string(size()) + ")");
  for (const auto& [id, set] : sets_)
    if (set.ranks == ranks) return -1;
  const bool member = std::binary_search(ranks.begin(), ranks.end(), rank());
  ProcessSet set;
  set.ranks = ranks;
  {
    pybind11::gil_scoped_release release;  // collective: waits for the other ranks
    tutti::Communicator comm = world_.split(member ? 0 : -1, rank());
    if (member) {
      tutti::EngineOptions options = options_;
      options.timeline_path.clear();  // the global set's engine writes the timeline
      set.engine = std::make_unique<tutti::Engine>(comm, options);
      set.comm = std::move(comm);
    }
  }
  const int id = next_set_++;
  sets_.emplace(id, std::move(set));
  return id;
}

bool Context::remove_process_set(int id) {
  auto it = sets_.find(id);
  if (id == 0 || it == sets_.end()) return false;
  for (const auto& [handle, op] : op_sets_)
    if (op.first == id)
      throw tutti::Error(tutti::ErrorCode::invalid_argument,
                         "tutti.horovod remove_process_set: process set " + std::to_string(id) + " has operation " +
                             std::to_string(handle) + " in flight; synchronize it first");
  ProcessSet doomed = std::move(it->second);
  sets_.erase(it);
  pybind11::gil_scoped_release release;  // collective over the set's members
  doomed.engine.reset();
  return true;
}

void Context::add(int handle, int set, std::unique_ptr<PendingOp> op, const std::string& key) {
  ops_[handle] = std::move(op);
  op_sets_[handle] = {set, key};
}

void Context::check_not_in_flight(int set, const std::string& kind, const std::string& name) const {
  const std::string key = kind + " " + name;
  for (const auto& [handle, op] : op_sets_)
    if (op.first == set && op.second == key)
      throw tutti::Error(tutti::ErrorCode::invalid_argument,
                         "tutti.horovod: an " + kind + " named '" + name + "' is already in flight on rank " +
                             std::to_string(rank()) + " (handle " + std::to_string(handle) +
                             ", not synchronized yet); names must be unique among the operations in flight");
}

void Context::forget(int handle) {
  ops_.erase(handle);
  op_sets_.erase(handle);
}

PendingOp& Context::find(int handle) {
  auto it = ops_.find(handle);
  if (it == ops_.end())
    throw tutti::Error(tutti::ErrorCode::invalid_argument,
                       "tutti.horovod: handle " + std::to_string(handle) +
                           " is not in flight (never returned, or already synchronized)");
  return *it->second;
}

void Context::advance_others(int handle) {
  for (auto& [h, op] : ops_) {
    if (h == handle) continue;
    try {
      op->test();
    } catch (const tutti::Error&) {
      // Kept for the caller that synchronizes that handle: test() raises it again.
    }
  }
}

bool Context::poll(int handle) {
  PendingOp& op = find(handle);
  advance_others(handle);
  try {
    return op.test();
  } catch (const tutti::Error&) {
    return true;  // finished, as Horovod's poll says of a failed operation: synchronize raises the error
  }
}

std::vector<torch::Tensor> Context::synchronize(int handle) {
  PendingOp& op = find(handle);
  for (auto& [id, set] : sets_)  // negotiate now rather than at the next cycle: the caller is waiting
    if (set.engine) set.engine->flush();
  try {
    while (!op.test()) {
      advance_others(handle);
      {
        // Other Python threads run meanwhile; the handles' table is only touched with the GIL held.
        pybind11::gil_scoped_release release;
        op.wait_for(std::chrono::milliseconds(1));
      }
      if (PyErr_CheckSignals() != 0) throw pybind11::error_already_set();  // Ctrl-C interrupts a wait
    }
  } catch (...) {
    forget(handle);
    throw;
  }
  std::vector<torch::Tensor> results = op.results();
  forget(handle);
  return results;
}

}  // namespace tutti_python::horovod
