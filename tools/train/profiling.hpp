// tutti-train's compute timing: --profile (the model profile of the run, <tutti/sim.hpp>) and
// --straggler (one rank's compute stretched by a factor).
//
// A step's compute is cut into segments: forward, each gradient's backward segment (from the
// previous gradient's readiness, or backward's start, to this gradient's), and the optimizer.
// Gradient readiness is seen by a hook on each parameter's gradient accumulator, installed before
// DistributedOptimizer's own hooks so that it runs first: a stretched segment then delays the
// gradient's hand-off to the engine exactly as slower compute would.
#pragma once

#include <torch/torch.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "settings.hpp"
#include "tutti/sim.hpp"
#include "tutti/torch_optimizer.hpp"
#include "tutti/tutti.hpp"

namespace tutti::train {

// A duration in seconds, for the tables and the timeline.
inline double seconds(std::chrono::steady_clock::duration d) { return std::chrono::duration<double>(d).count(); }

class ComputeTimer {
 public:
  using Clock = std::chrono::steady_clock;

  /// `stretch` >= 1: each segment is followed by a wait of (stretch - 1) times its duration.
  explicit ComputeTimer(double stretch);
  ~ComputeTimer();
  ComputeTimer(const ComputeTimer&) = delete;
  ComputeTimer& operator=(const ComputeTimer&) = delete;

  /// Hooks the gradient accumulator of every parameter that requires grad. Call once, before a
  /// DistributedOptimizer is built over the same parameters (hooks run in the order installed).
  void install(const std::vector<std::pair<std::string, torch::Tensor>>& named_parameters);

  /// Forward ran from `start` until now: stretches it; returns when the (stretched) forward ends.
  Clock::time_point forward_done(Clock::time_point start);
  /// Backward starts at `start`: the first gradient's segment is measured from there.
  void backward_started(Clock::time_point start);
  /// Backward returned: the time since its last gradient is its tail (stretched too).
  void backward_done();
  /// The optimizer ran from `start` until now: stretches it (called by TimedSGD).
  void optimizer_done(Clock::time_point start);
  /// Ends a backward pass (a loop iteration of the trainer); its segments count towards the
  /// profile's means if `timed` (after the warm-up).
  void pass_done(bool timed);

  /// The means over the timed passes (over all passes if none was timed), without the waits
  /// that stretch them; `model`, `batch_size` and `notes` as given.
  sim::ModelProfile profile(const std::string& model, std::int64_t batch_size, std::vector<std::string> notes) const;

 private:
  struct Sums {
    double forward = 0, optimizer = 0, tail = 0;
    double compute = 0, compute_squares = 0;  // of each pass's whole compute, for the jitter
    std::vector<double> gradients;            // by parameter index
    std::int64_t passes = 0, optimizer_steps = 0;
  };
  struct Param {
    std::string name;
    std::size_t count = 0;
    DataType type = DataType::f32;
    tutti::libtorch::detail::GradAccumulatorPtr accumulator;  // kept alive: the hook lives on it
    std::uintptr_t hook_key = 0;
  };

  void gradient_ready(std::size_t i);  // in the thread that runs backward
  void stretch(Clock::duration measured) const;
  static void add(Sums& into, const Sums& pass);

  double stretch_;
  std::vector<Param> params_;
  std::vector<std::size_t> order_;  // parameter indices in the order backward made them ready
  bool order_known_ = false;
  std::vector<std::size_t> pass_order_;
  Clock::time_point segment_start_;
  Sums pass_, all_, timed_;
};

/// torch's SGD whose step() is timed (and stretched) by a ComputeTimer, so that the stretch
/// falls inside the OPTIMIZER phase that DistributedOptimizer::step records.
class TimedSGD final : public torch::optim::SGD {
 public:
  TimedSGD(ComputeTimer& timer, std::vector<torch::Tensor> params, torch::optim::SGDOptions options)
      : torch::optim::SGD(std::move(params), options), timer_(timer) {}
  torch::Tensor step(LossClosure closure = nullptr) override;

 private:
  ComputeTimer& timer_;
};

/// The stretch of this rank's compute under s.straggler: its factor on the straggling rank, else 1.
double stretch_of(const Settings& s, int rank);

/// The file this rank writes its profile to: s.profile with "{rank}" replaced by `rank`; without
/// "{rank}", s.profile on rank 0 and empty on the others (they write none).
std::string profile_path(const Settings& s, int rank);
/// Why this rank could not write its profile (its directory is not writable), or empty: checked
/// before training, so that a long run does not fail at its end.
std::string profile_path_problem(const Settings& s, int rank);

/// Writes the profile of the run to s.profile: by rank 0, or by every rank when the path holds
/// "{rank}" (replaced by the rank). Throws Error(system) when the file cannot be written.
void save_profile(const Settings& s, const Communicator& comm, const ComputeTimer& timer, std::size_t fusion_threshold);

}  // namespace tutti::train
