// libtorch glue: pipeline parallelism. A network split into stages on the ranks of a pipeline
// communicator (stage = rank); each step's batch is cut into micro-batches whose activations go
// forward and whose activation gradients go back by isend/irecv, so that a stage computes while
// its messages travel. Two schedules (pipeline_schedule): GPipe (every forward, then every
// backward) and 1F1B (after a warm-up of N - 1 - stage forwards, one forward then one backward:
// at most N - stage micro-batches' activations alive at once).
// Part of <tutti/torch.hpp>, CPU tensors only; implemented in src/libtorch/pipeline.cpp
// (Tutti::torch).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <string_view>
#include <utility>
#include <vector>

#include <torch/torch.h>

#include "tutti/tutti.hpp"

namespace tutti::libtorch {

enum class PipelineSchedule { gpipe, one_f_one_b };

/// "gpipe" or "1f1b".
std::string_view to_string(PipelineSchedule schedule);

/// The schedule `name` spells ("gpipe" or "1f1b"); nullopt for anything else.
std::optional<PipelineSchedule> pipeline_schedule_from_name(std::string_view name);

/// One unit of a stage's work in a step: the forward or the backward of one micro-batch.
struct PipelineAction {
  bool forward = true;
  int micro_batch = 0;
  friend bool operator==(const PipelineAction&, const PipelineAction&) = default;
};

/// What stage `stage` of `stages` does in one step of `micro_batches`, in order. Every stage runs
/// forwards and backwards in micro-batch order 0, 1, …; GPipe runs all forwards first, 1F1B
/// (PipeDream-flush) min(stages - 1 - stage, micro_batches) forwards, then alternates one forward
/// and one backward, then the remaining backwards. Error(invalid_argument) for stages < 1, a
/// stage outside [0, stages) or micro_batches < 1.
std::vector<PipelineAction> pipeline_schedule(PipelineSchedule schedule, int stages, int stage, int micro_batches);

/// The idle share of a step that equal stages leave in the pipeline: (N - 1) / (M + N - 1).
double pipeline_bubble_theory(int stages, int micro_batches);

/// Where a stage's step went (seconds, summed over the steps run).
struct PipelineStats {
  double step_seconds = 0;     ///< whole steps
  double compute_seconds = 0;  ///< inside forward and backward of micro-batches
  double wait_seconds = 0;     ///< waiting for a neighbour's activation or gradient
  std::uint64_t steps = 0;
  std::uint64_t bytes_sent = 0;
  /// The share of the steps this stage was not computing: its bubble (plus its sends' cost).
  double idle_fraction() const { return step_seconds > 0 ? 1.0 - compute_seconds / step_seconds : 0; }
};

/// One stage of a pipeline. `comm` is the pipeline communicator: its rank is the stage, its size
/// the number of stages, and every stage runs the same schedule and micro-batch count. `forward`
/// is the stage's part of the network; `input_shape` the shape of one sample of its input (what
/// the previous stage's forward returns per sample; unused on the first stage). Calls on one
/// PipelineStage come from one thread; the communicator carries nothing else during run(). After
/// run() raised, the stage (like its communicator) is not used again: receives may be outstanding
/// into its buffers, which it keeps until it is destroyed.
class PipelineStage {
 public:
  using Forward = std::function<torch::Tensor(const torch::Tensor&)>;
  /// The last stage's loss of micro-batch `micro_batch` from its output; what backward starts from.
  using Loss = std::function<torch::Tensor(const torch::Tensor& output, int micro_batch)>;
  /// Called after each action with its kind and its compute interval (for a timeline).
  using OnAction = std::function<void(const PipelineAction&, std::chrono::steady_clock::time_point,
                                      std::chrono::steady_clock::time_point)>;
  /// Called after each run() with the step's interval, the one PipelineStats::step_seconds counts.
  using OnStep = std::function<void(std::chrono::steady_clock::time_point, std::chrono::steady_clock::time_point)>;

  PipelineStage(Communicator& comm, Forward forward, std::vector<std::int64_t> input_shape, PipelineSchedule schedule,
                int micro_batches);

  int stage() const { return comm_.rank(); }
  int stages() const { return comm_.size(); }
  bool first() const { return stage() == 0; }
  bool last() const { return stage() == stages() - 1; }
  int micro_batches() const { return micro_batches_; }
  PipelineSchedule schedule() const { return schedule_; }
  const PipelineStats& stats() const { return stats_; }
  void reset_stats() { stats_ = {}; }
  void on_action(OnAction callback) { on_action_ = std::move(callback); }
  void on_step(OnStep callback) { on_step_ = std::move(callback); }

  /// Collective over the pipeline: one step's forwards and backwards of `micro_batches` of
  /// `micro_batch_size` samples each. `inputs` (first stage only) are the micro-batches' inputs;
  /// `loss` (last stage only) makes each micro-batch's loss. Gradients accumulate into the stage's
  /// parameters (scale the loss for the mean you want). Returns the sum of the micro-batches'
  /// losses on the last stage, 0 elsewhere. Error(invalid_argument) if the first stage's inputs
  /// are not micro_batches tensors of micro_batch_size samples; a peer's failure or timeout
  /// raises as the communicator's calls do.
  double run(std::int64_t micro_batch_size, const std::vector<torch::Tensor>& inputs, const Loss& loss);

  /// Collective over the pipeline, no gradients: the network's output for `input` (first stage;
  /// `batch` samples) on the last stage; an undefined tensor elsewhere. Blocking, for evaluation.
  torch::Tensor forward_only(std::int64_t batch, const torch::Tensor& input);

 private:
  using Clock = std::chrono::steady_clock;
  struct Pending {
    torch::Tensor buffer;
    Request request;
  };
  struct Slot {
    torch::Tensor input, output, loss;
    Pending gradient;  // of output, from the next stage
  };

  std::vector<std::int64_t> shape_of(std::int64_t batch) const;
  // Posts the receive of micro-batch `micro_batch`'s activation if this stage gets one: one is
  // always outstanding ahead of its use.
  void post_receive(int micro_batch);
  // The received activation or gradient `action` needs, waiting for it if it has not arrived.
  torch::Tensor take(bool forward, const PipelineAction& action);
  void send(torch::Tensor data, int peer, int tag);
  void finish(const PipelineAction& action, Clock::time_point start);

  Communicator& comm_;
  Forward forward_;
  std::vector<std::int64_t> input_shape_;
  PipelineSchedule schedule_;
  int micro_batches_;
  std::vector<PipelineAction> actions_;
  std::vector<Slot> slots_;
  std::vector<Pending> sends_;
  Pending forward_receive_;
  std::int64_t micro_batch_size_ = 0;
  PipelineStats stats_;
  OnAction on_action_;
  OnStep on_step_;
};

}  // namespace tutti::libtorch
