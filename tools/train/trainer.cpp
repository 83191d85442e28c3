#include "trainer.hpp"

#include <algorithm>
#include <chrono>
#include <numeric>
#include <random>
#include <span>
#include <stdexcept>
#include <string>

#include "fashion_mnist.hpp"

namespace tutti::train {

namespace {

using Clock = std::chrono::steady_clock;

constexpr std::int64_t warm_up_steps = 5;  // left out of the step time: allocations, first negotiations
constexpr std::int64_t eval_batch = 1000;

double seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

// Pixels and labels of a split as tensors (copies: the ImageSet goes away).
std::pair<::torch::Tensor, ::torch::Tensor> tensors_of(const ImageSet& set) {
  const auto n = static_cast<std::int64_t>(set.count);
  auto bytes = ::torch::from_blob(const_cast<std::uint8_t*>(set.pixels.data()),
                                  {n, static_cast<std::int64_t>(set.rows), static_cast<std::int64_t>(set.cols)},
                                  ::torch::kUInt8);
  auto labels = ::torch::from_blob(const_cast<std::uint8_t*>(set.labels.data()), {n}, ::torch::kUInt8);
  return {normalize_images(bytes), labels.to(::torch::kInt64)};
}

}  // namespace

Data load_data(const Settings& s) {
  Data d;
  std::tie(d.train_images, d.train_labels) = tensors_of(read_fashion_mnist(s.data, "train", s.train_samples));
  std::tie(d.test_images, d.test_labels) = tensors_of(read_fashion_mnist(s.data, "t10k", s.test_samples));
  return d;
}

Trainer::Trainer(Communicator& comm, const Settings& s, const Data& data)
    : comm_(comm), s_(s), data_(data), timer_(stretch_of(s, comm.rank())) {
  const std::int64_t p = comm_.size();
  const std::int64_t per_rank = data_.train_images.size(0) / p;
  steps_per_epoch_ = per_rank / s_.batch_size / s_.backward_passes * s_.backward_passes;
  if (steps_per_epoch_ == 0)
    throw std::runtime_error(std::to_string(data_.train_images.size(0)) + " training samples are too few for " +
                             std::to_string(p) + " ranks x batch " + std::to_string(s_.batch_size) + " x " +
                             std::to_string(s_.backward_passes) + " backward passes");

  ::torch::manual_seed(s_.seed);
  model_ = Net();
  tutti::torch::broadcast_parameters(comm_, *model_, 0);  // identical anyway; the broadcast makes sure
  timer_.install(model_->named_parameters().pairs());     // before optimizer_'s hooks
  sgd_ =
      std::make_unique<TimedSGD>(timer_, model_->parameters(), ::torch::optim::SGDOptions(s_.lr).momentum(s_.momentum));
  tutti::torch::DistributedOptions options;
  options.overlap = s_.overlap;
  options.backward_passes_per_step = s_.backward_passes;
  if (!s_.timeline.empty()) options.engine.timeline_path = s_.timeline;
  if (s_.fusion_threshold) options.engine.fusion_threshold = *s_.fusion_threshold;
  options.compression = tutti::compress::Compression::parse(s_.compression);
  options.compression_seed = s_.seed;
  optimizer_ = std::make_unique<tutti::torch::DistributedOptimizer>(comm_, *sgd_, model_->named_parameters().pairs(),
                                                                    std::move(options));
  tutti::torch::broadcast_optimizer_state(comm_, *sgd_, 0);
}

std::vector<std::int64_t> Trainer::shard_of_epoch(int epoch) const {
  // Fisher-Yates over mt19937_64 rather than std::shuffle, whose algorithm the standard leaves
  // open: every rank must compute the same permutation.
  std::vector<std::int64_t> order(static_cast<std::size_t>(data_.train_images.size(0)));
  std::iota(order.begin(), order.end(), 0);
  std::mt19937_64 rng(s_.seed + static_cast<std::uint64_t>(epoch));
  for (std::size_t i = order.size(); i > 1; --i) std::swap(order[i - 1], order[rng() % i]);
  // Rank r takes r, r+p, r+2p…, order.size()/p of them: the tail is dropped, so that every rank
  // runs the same number of steps.
  const std::size_t p = static_cast<std::size_t>(comm_.size());
  std::vector<std::int64_t> shard(order.size() / p);
  for (std::size_t k = 0; k < shard.size(); ++k) shard[k] = order[static_cast<std::size_t>(comm_.rank()) + k * p];
  return shard;
}

std::vector<double> Trainer::evaluate_shard() {
  ::torch::NoGradGuard no_grad;
  model_->eval();
  const std::int64_t n = data_.test_images.size(0);
  const auto index = ::torch::arange(comm_.rank(), n, comm_.size(), ::torch::kInt64);
  double correct = 0, loss_sum = 0;
  for (std::int64_t begin = 0; begin < index.size(0); begin += eval_batch) {
    const auto batch = index.slice(0, begin, std::min(begin + eval_batch, index.size(0)));
    const auto labels = data_.test_labels.index_select(0, batch);
    const auto logits = model_->forward(data_.test_images.index_select(0, batch));
    loss_sum += loss_of(logits, labels, ::torch::kSum).item<double>();
    correct += static_cast<double>(logits.argmax(1).eq(labels).sum().item<std::int64_t>());
  }
  model_->train();
  return {correct, static_cast<double>(index.size(0)), loss_sum};
}

EpochResult Trainer::run_epoch(int epoch, std::int64_t first_step,
                               const std::function<void(std::int64_t)>& after_step) {
  const std::vector<std::int64_t> shard = shard_of_epoch(epoch);
  auto& engine = optimizer_->engine();
  optimizer_->reset_overlap_stats();
  double loss_sum = 0, timed_seconds = 0, all_seconds = 0;
  std::int64_t timed_steps = 0;
  // Per step: the time step() waited for the allreduces, and the time in allreduce calls.
  std::vector<double> waits, reduces;
  waits.reserve(static_cast<std::size_t>(steps_per_epoch_));
  reduces.reserve(static_cast<std::size_t>(steps_per_epoch_));
  const std::int64_t steps = steps_per_epoch_ - first_step;
  for (std::int64_t step = first_step; step < steps_per_epoch_; ++step, ++steps_run_) {
    const auto index = ::torch::from_blob(const_cast<std::int64_t*>(shard.data()) + step * s_.batch_size,
                                          {s_.batch_size}, ::torch::kInt64);
    const auto images = data_.train_images.index_select(0, index);
    const auto labels = data_.train_labels.index_select(0, index);
    const auto t0 = Clock::now();
    optimizer_->zero_grad();
    const auto forward_start = Clock::now();
    const auto loss = loss_of(model_->forward(images), labels);
    const auto t1 = timer_.forward_done(t0);  // the profile's forward holds zero_grad
    timer_.backward_started(t1);
    // Gradients are summed over the passes of a window: scale for their mean.
    (s_.backward_passes > 1 ? loss / s_.backward_passes : loss).backward();
    timer_.backward_done();
    const auto t2 = Clock::now();
    const auto before = optimizer_->overlap_stats();
    optimizer_->step();
    if (after_step) after_step(step);  // a checkpoint's copy (or blocking write) counts in the step
    const auto t3 = Clock::now();
    const auto after = optimizer_->overlap_stats();
    waits.push_back(after.wait_seconds - before.wait_seconds);
    reduces.push_back(after.allreduce_seconds - before.allreduce_seconds);
    engine.record_phase("FORWARD", forward_start, t1);
    engine.record_phase("BACKWARD", t1, t2);
    timer_.pass_done(steps_run_ >= warm_up_steps);
    loss_sum += loss.item<double>();
    all_seconds += seconds(t3 - t0);
    if (steps_run_ >= warm_up_steps) {
      timed_seconds += seconds(t3 - t0);
      ++timed_steps;
    }
  }
  // An epoch entirely within the warm-up is timed whole rather than not at all.
  const double step_seconds = timed_steps ? timed_seconds / timed_steps : all_seconds / steps;

  std::vector<double> sums = evaluate_shard();  // correct, total, test loss sum
  const auto overlap = optimizer_->overlap_stats();
  sums.insert(sums.end(), {loss_sum, overlap.hidden_seconds, overlap.allreduce_seconds});
  comm_.allreduce(std::span<double>(sums), ReduceOp::sum);

  EpochResult r;
  r.train_loss = sums[3] / static_cast<double>(steps * comm_.size());
  r.test_accuracy = sums[1] > 0 ? sums[0] / sums[1] : 0;
  r.test_loss = sums[1] > 0 ? sums[2] / sums[1] : 0;
  r.step_seconds = step_seconds;
  r.samples_per_second = static_cast<double>(comm_.size() * s_.batch_size) / step_seconds;
  r.overlap = overlap;
  r.overlapped_fraction = sums[5] > 0 ? sums[4] / sums[5] : 0;
  // The job's exposed communication: in each step, the wait of the rank that waited least (it
  // finished backward last; the others' extra wait is for it), against that rank's time in
  // allreduce calls in the step (the others' calls also include waiting for it). See EpochResult.
  const std::size_t n = waits.size();
  waits.insert(waits.end(), reduces.begin(), reduces.end());
  std::vector<double> all(waits.size() * static_cast<std::size_t>(comm_.size()));
  comm_.allgather(waits.data(), all.data(), waits.size(), DataType::f64);
  double exposed = 0, allreduce = 0;
  for (std::size_t k = 0; k < n; ++k) {
    std::size_t least = 0;  // the rank that waited least in step k
    for (std::size_t q = 1; q < static_cast<std::size_t>(comm_.size()); ++q)
      if (all[q * 2 * n + k] < all[least * 2 * n + k]) least = q;
    exposed += all[least * 2 * n + k];
    allreduce += all[least * 2 * n + n + k];
  }
  r.exposed_seconds = n ? exposed / static_cast<double>(n) : 0;
  r.hidden_fraction = allreduce > 0 ? std::clamp(1.0 - exposed / allreduce, 0.0, 1.0) : 0.0;
  return r;
}

std::uint64_t Trainer::parameter_checksum() const {
  std::uint64_t hash = tutti::torch::detail::fnv1a_offset;
  for (const auto& item : model_->named_parameters()) {
    const auto t = item.value().contiguous();
    hash = tutti::torch::detail::fnv1a(t.data_ptr(), t.nbytes(), hash);
  }
  return hash;
}

std::int64_t Trainer::parameter_count() const {
  std::int64_t n = 0;
  for (const auto& t : model_->parameters()) n += t.numel();
  return n;
}

}  // namespace tutti::train
