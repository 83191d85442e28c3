#include "horovod/context.hpp"

#include <pybind11/pybind11.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <vector>

#include "tutti/topology.hpp"
#include "tutti/torch.hpp"

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
