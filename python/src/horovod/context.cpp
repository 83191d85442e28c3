#include "horovod/context.hpp"

#include <pybind11/pybind11.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <vector>

#include "tutti/torch.hpp"

namespace tutti_python::horovod {

namespace {

/// The host a rank runs on, as the library's topology names it: TUTTI_HOST (an emulated cluster's
/// host), else the host name.
std::uint64_t host_id() {
  if (const char* host = std::getenv("TUTTI_HOST"); host && *host) return tutti::torch::detail::fnv1a(host);
  char name[256] = {};
  if (::gethostname(name, sizeof(name) - 1) != 0) return 0;
  return tutti::torch::detail::fnv1a(name);
}

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
  return options;
}

}  // namespace

Context::Context(const HorovodSettings& settings) : world_(tutti::init()) {
  const tutti::EngineOptions options = engine_options(settings);
  std::vector<std::uint64_t> hosts(static_cast<std::size_t>(world_.size()));
  const std::uint64_t mine = host_id();
  world_.allgather(&mine, hosts.data(), 1, tutti::DataType::u64);
  // As the library's topology: hosts numbered in order of their first rank, ranks within a host
  // in rank order.
  std::vector<std::uint64_t> seen;
  local_rank_ = 0;
  local_size_ = 0;
  for (int r = 0; r < world_.size(); ++r) {
    const std::uint64_t h = hosts[static_cast<std::size_t>(r)];
    if (std::find(seen.begin(), seen.end(), h) == seen.end()) seen.push_back(h);
    if (h != mine) continue;
    if (r < world_.rank()) ++local_rank_;
    ++local_size_;
  }
  cross_size_ = static_cast<int>(seen.size());
  cross_rank_ = static_cast<int>(std::find(seen.begin(), seen.end(), mine) - seen.begin());
  engine_ = std::make_unique<tutti::Engine>(world_, options);
}

Context::~Context() {
  ops_.clear();
  engine_.reset();
}

void Context::add(int handle, std::unique_ptr<PendingOp> op) { ops_[handle] = std::move(op); }

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

std::vector<::torch::Tensor> Context::synchronize(int handle) {
  PendingOp& op = find(handle);
  engine_->flush();  // negotiate now rather than at the next cycle: the caller is waiting
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
    ops_.erase(handle);
    throw;
  }
  std::vector<::torch::Tensor> results = op.results();
  ops_.erase(handle);
  return results;
}

}  // namespace tutti_python::horovod
