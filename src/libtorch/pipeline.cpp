// PipelineStage and the pipeline schedules (tutti/torch_pipeline.hpp).
#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <torch/torch.h>

#include "tutti/torch_dtype.hpp"
#include "tutti/torch_pipeline.hpp"
#include "tutti/tutti.hpp"

namespace tutti::libtorch {
namespace {

constexpr int evaluation_tag = 0;

double seconds(std::chrono::steady_clock::duration d) { return std::chrono::duration<double>(d).count(); }

// Tags 1, 2, …: activations odd, their gradients even; 0 is evaluation's.
int tag_of(bool forward, int micro_batch) { return 1 + 2 * micro_batch + (forward ? 0 : 1); }

}  // namespace

std::string_view to_string(PipelineSchedule schedule) { return schedule == PipelineSchedule::gpipe ? "gpipe" : "1f1b"; }

std::optional<PipelineSchedule> pipeline_schedule_from_name(std::string_view name) {
  if (name == "gpipe") return PipelineSchedule::gpipe;
  if (name == "1f1b") return PipelineSchedule::one_f_one_b;
  return std::nullopt;
}

std::vector<PipelineAction> pipeline_schedule(PipelineSchedule schedule, int stages, int stage, int micro_batches) {
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

double pipeline_bubble_theory(int stages, int micro_batches) {
  return static_cast<double>(stages - 1) / static_cast<double>(micro_batches + stages - 1);
}

PipelineStage::PipelineStage(Communicator& comm, Forward forward, std::vector<std::int64_t> input_shape,
                             PipelineSchedule schedule, int micro_batches)
    : comm_(comm),
      forward_(std::move(forward)),
      input_shape_(std::move(input_shape)),
      schedule_(schedule),
      micro_batches_(micro_batches),
      actions_(pipeline_schedule(schedule, comm.size(), comm.rank(), micro_batches)) {}

double PipelineStage::run(std::int64_t micro_batch_size, const std::vector<torch::Tensor>& inputs, const Loss& loss) {
  if (first() && (static_cast<int>(inputs.size()) != micro_batches_ ||
                  std::any_of(inputs.begin(), inputs.end(),
                              [&](const torch::Tensor& t) { return t.size(0) != micro_batch_size; })))
    throw Error(ErrorCode::invalid_argument, "PipelineStage::run: stage 0 needs " + std::to_string(micro_batches_) +
                                                 " micro-batches of " + std::to_string(micro_batch_size) + " samples");
  const auto step_start = Clock::now();
  slots_.assign(static_cast<std::size_t>(micro_batches_), {});
  sends_.clear();
  micro_batch_size_ = micro_batch_size;
  double loss_sum = 0;
  post_receive(0);
  for (const PipelineAction& action : actions_) {
    Slot& slot = slots_[static_cast<std::size_t>(action.micro_batch)];
    if (action.forward) {
      torch::Tensor x = first() ? inputs[static_cast<std::size_t>(action.micro_batch)] : take(true, action);
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
        slot.gradient.buffer = torch::empty(slot.output.sizes(), torch::kFloat32);
        slot.gradient.request =
            comm_.irecv(slot.gradient.buffer.data_ptr(), static_cast<std::size_t>(slot.gradient.buffer.numel()),
                        DataType::f32, stage() + 1, tag_of(false, action.micro_batch));
      }
      finish(action, start);
    } else {
      torch::Tensor grad = last() ? torch::Tensor() : take(false, action);
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

torch::Tensor PipelineStage::forward_only(std::int64_t batch, const torch::Tensor& input) {
  torch::NoGradGuard no_grad;
  torch::Tensor x = input;
  if (!first()) {
    x = torch::empty(shape_of(batch), torch::kFloat32);
    comm_.recv(x.data_ptr(), static_cast<std::size_t>(x.numel()), DataType::f32, stage() - 1, evaluation_tag);
  }
  torch::Tensor y = forward_(x).contiguous();
  if (last()) return y;
  comm_.send(y.data_ptr(), static_cast<std::size_t>(y.numel()), dtype_of(y), stage() + 1, evaluation_tag);
  return {};
}

std::vector<std::int64_t> PipelineStage::shape_of(std::int64_t batch) const {
  std::vector<std::int64_t> shape{batch};
  shape.insert(shape.end(), input_shape_.begin(), input_shape_.end());
  return shape;
}

void PipelineStage::post_receive(int micro_batch) {
  if (micro_batch >= micro_batches_ || first()) return;
  forward_receive_.buffer = torch::empty(shape_of(micro_batch_size_), torch::kFloat32);
  forward_receive_.request =
      comm_.irecv(forward_receive_.buffer.data_ptr(), static_cast<std::size_t>(forward_receive_.buffer.numel()),
                  DataType::f32, stage() - 1, tag_of(true, micro_batch));
}

torch::Tensor PipelineStage::take(bool forward, const PipelineAction& action) {
  const auto start = Clock::now();
  Pending& pending = forward ? forward_receive_ : slots_[static_cast<std::size_t>(action.micro_batch)].gradient;
  pending.request.wait();
  torch::Tensor got = std::move(pending.buffer);
  pending = {};
  if (forward) post_receive(action.micro_batch + 1);
  stats_.wait_seconds += seconds(Clock::now() - start);
  return got;
}

void PipelineStage::send(torch::Tensor data, int peer, int tag) {
  stats_.bytes_sent += data.nbytes();
  Request request = comm_.isend(data.data_ptr(), static_cast<std::size_t>(data.numel()), dtype_of(data), peer, tag);
  sends_.push_back({std::move(data), std::move(request)});
}

void PipelineStage::finish(const PipelineAction& action, Clock::time_point start) {
  const auto end = Clock::now();
  stats_.compute_seconds += seconds(end - start);
  if (on_action_) on_action_(action, start, end);
}

}  // namespace tutti::libtorch
