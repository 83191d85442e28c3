// libtorch glue: pipeline parallelism. A network split into stages on the ranks of a pipeline
// communicator (stage = rank); each step's batch is cut into micro-batches whose activations go
// forward and whose activation gradients go back by isend/irecv, so that a stage computes while
// its messages travel. Two schedules (pipeline_schedule): GPipe (every forward, then every
// backward) and 1F1B (after a warm-up of N - 1 - stage forwards, one forward then one backward:
// at most N - stage micro-batches' activations alive at once).
// Part of <tutti/torch.hpp>: header-only, CPU tensors only.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <torch/torch.h>

#include "tutti/torch_dtype.hpp"
#include "tutti/tutti.hpp"

namespace tutti::torch {

enum class PipelineSchedule { gpipe, one_f_one_b };

/// "gpipe" or "1f1b".
inline std::string_view to_string(PipelineSchedule schedule) {
  return schedule == PipelineSchedule::gpipe ? "gpipe" : "1f1b";
}

/// The schedule `name` spells ("gpipe" or "1f1b"); nullopt for anything else.
inline std::optional<PipelineSchedule> pipeline_schedule_from_name(std::string_view name) {
  if (name == "gpipe") return PipelineSchedule::gpipe;
  if (name == "1f1b") return PipelineSchedule::one_f_one_b;
  return std::nullopt;
}

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
inline std::vector<PipelineAction> pipeline_schedule(PipelineSchedule schedule, int stages, int stage,
                                                     int micro_batches) {
  if (stages < 1 || stage < 0 || stage >= stages || micro_batches < 1)
    throw Error(ErrorCode::invalid_argument, "pipeline_schedule: stage " + std::to_string(stage) + " of " +
                                                 std::to_string(stages) + " stages with " +
                                                 std::to_string(micro_batches) + " micro-batches");
  std::vector<PipelineAction> actions;
  const int warm_up = schedule == PipelineSchedule::gpipe ? micro_batches : std::min(stages - 1 - stage, micro_batches);
  int forwards = 0, backwards = 0;
  for (; forwards < warm_up; ++forwards) actions.push_back({true, forwards});
  while (forwards < micro_batches) {  // 1F1B's steady state
    actions.push_back({true, forwards++});
    actions.push_back({false, backwards++});
  }
  for (; backwards < micro_batches; ++backwards) actions.push_back({false, backwards});
  return actions;
}

/// The idle share of a step that equal stages leave in the pipeline: (N - 1) / (M + N - 1).
inline double pipeline_bubble_theory(int stages, int micro_batches) {
  return static_cast<double>(stages - 1) / static_cast<double>(micro_batches + stages - 1);
}

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
  using Forward = std::function<::torch::Tensor(const ::torch::Tensor&)>;
  /// The last stage's loss of micro-batch `micro_batch` from its output; what backward starts from.
  using Loss = std::function<::torch::Tensor(const ::torch::Tensor& output, int micro_batch)>;
  /// Called after each action with its kind and its compute interval (for a timeline).
  using OnAction = std::function<void(const PipelineAction&, std::chrono::steady_clock::time_point,
                                      std::chrono::steady_clock::time_point)>;
  /// Called after each run() with the step's interval, the one PipelineStats::step_seconds counts.
  using OnStep = std::function<void(std::chrono::steady_clock::time_point, std::chrono::steady_clock::time_point)>;

  PipelineStage(Communicator& comm, Forward forward, std::vector<std::int64_t> input_shape, PipelineSchedule schedule,
                int micro_batches)
      : comm_(comm),
        forward_(std::move(forward)),
        input_shape_(std::move(input_shape)),
        schedule_(schedule),
        micro_batches_(micro_batches),
        actions_(pipeline_schedule(schedule, comm.size(), comm.rank(), micro_batches)) {}

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
  double run(std::int64_t micro_batch_size, const std::vector<::torch::Tensor>& inputs, const Loss& loss) {
    if (first() && (static_cast<int>(inputs.size()) != micro_batches_ ||
                    std::any_of(inputs.begin(), inputs.end(),
                                [&](const ::torch::Tensor& t) { return t.size(0) != micro_batch_size; })))
      throw Error(ErrorCode::invalid_argument, "PipelineStage::run: stage 0 needs " + std::to_string(micro_batches_) +
                                                   " micro-batches of " + std::to_string(micro_batch_size) +
                                                   " samples");
    const auto step_start = Clock::now();
    slots_.assign(static_cast<std::size_t>(micro_batches_), {});
    sends_.clear();
    micro_batch_size_ = micro_batch_size;
    double loss_sum = 0;
    post_receive(0);
    for (const PipelineAction& action : actions_) {
      Slot& slot = slots_[static_cast<std::size_t>(action.micro_batch)];
      if (action.forward) {
        ::torch::Tensor x = first() ? inputs[static_cast<std::size_t>(action.micro_batch)] : take(true, action);
        const auto start = Clock::now();
        if (!first()) x.requires_grad_(true);
        slot.input = x;
        slot.output = forward_(x);
        if (last()) {
          slot.loss = loss(slot.output, action.micro_batch);
          loss_sum += slot.loss.item<double>();
        } else {
          send(slot.output.detach().contiguous(), stage() + 1, tag_of(true, action.micro_batch));
          // Its gradient's receive goes out now that its shape is known: it lands while we compute.
          slot.gradient.buffer = ::torch::empty(slot.output.sizes(), ::torch::kFloat32);
          slot.gradient.request =
              comm_.irecv(slot.gradient.buffer.data_ptr(), static_cast<std::size_t>(slot.gradient.buffer.numel()),
                          DataType::f32, stage() + 1, tag_of(false, action.micro_batch));
        }
        finish(action, start);
      } else {
        ::torch::Tensor grad = last() ? ::torch::Tensor() : take(false, action);
        const auto start = Clock::now();
        if (last())
          slot.loss.backward();
        else
          slot.output.backward(grad);
        if (!first()) send(slot.input.grad().contiguous(), stage() - 1, tag_of(false, action.micro_batch));
        slot = {};  // the micro-batch's activations go now: 1F1B's memory bound
        finish(action, start);
      }
    }
    for (auto& s : sends_) s.request.wait();
    sends_.clear();
    const auto step_end = Clock::now();
    stats_.step_seconds += seconds(step_end - step_start);
    ++stats_.steps;
    if (on_step_) on_step_(step_start, step_end);
    return loss_sum;
  }

  /// Collective over the pipeline, no gradients: the network's output for `input` (first stage;
  /// `batch` samples) on the last stage; an undefined tensor elsewhere. Blocking, for evaluation.
  ::torch::Tensor forward_only(std::int64_t batch, const ::torch::Tensor& input) {
    ::torch::NoGradGuard no_grad;
    ::torch::Tensor x = input;
    if (!first()) {
      x = ::torch::empty(shape_of(batch), ::torch::kFloat32);
      comm_.recv(x.data_ptr(), static_cast<std::size_t>(x.numel()), DataType::f32, stage() - 1, evaluation_tag);
    }
    ::torch::Tensor y = forward_(x).contiguous();
    if (last()) return y;
    comm_.send(y.data_ptr(), static_cast<std::size_t>(y.numel()), dtype_of(y), stage() + 1, evaluation_tag);
    return {};
  }

 private:
  using Clock = std::chrono::steady_clock;
  static constexpr int evaluation_tag = 0;
  struct Pending {
    ::torch::Tensor buffer;
    Request request;
  };
  struct Slot {
    ::torch::Tensor input, output, loss;
    Pending gradient;  // of output, from the next stage
  };

  static double seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }
  // Tags 1, 2, …: activations odd, their gradients even; 0 is evaluation's.
  static int tag_of(bool forward, int micro_batch) { return 1 + 2 * micro_batch + (forward ? 0 : 1); }

  std::vector<std::int64_t> shape_of(std::int64_t batch) const {
    std::vector<std::int64_t> shape{batch};
    shape.insert(shape.end(), input_shape_.begin(), input_shape_.end());
    return shape;
  }

  // Posts the receive of micro-batch `micro_batch`'s activation if this stage gets one: one is
  // always outstanding ahead of its use.
  void post_receive(int micro_batch) {
    if (micro_batch >= micro_batches_ || first()) return;
    forward_receive_.buffer = ::torch::empty(shape_of(micro_batch_size_), ::torch::kFloat32);
    forward_receive_.request =
        comm_.irecv(forward_receive_.buffer.data_ptr(), static_cast<std::size_t>(forward_receive_.buffer.numel()),
                    DataType::f32, stage() - 1, tag_of(true, micro_batch));
  }

  // The received activation or gradient `action` needs, waiting for it if it has not arrived.
  ::torch::Tensor take(bool forward, const PipelineAction& action) {
    const auto start = Clock::now();
    Pending& pending = forward ? forward_receive_ : slots_[static_cast<std::size_t>(action.micro_batch)].gradient;
    pending.request.wait();
    ::torch::Tensor got = std::move(pending.buffer);
    pending = {};
    if (forward) post_receive(action.micro_batch + 1);
    stats_.wait_seconds += seconds(Clock::now() - start);
    return got;
  }

  void send(::torch::Tensor data, int peer, int tag) {
    stats_.bytes_sent += data.nbytes();
    Request request = comm_.isend(data.data_ptr(), static_cast<std::size_t>(data.numel()), dtype_of(data), peer, tag);
    sends_.push_back({std::move(data), std::move(request)});
  }

  void finish(const PipelineAction& action, Clock::time_point start) {
    const auto end = Clock::now();
    stats_.compute_seconds += seconds(end - start);
    if (on_action_) on_action_(action, start, end);
  }

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

}  // namespace tutti::torch
