#include "trainer.hpp"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <numeric>
#include <random>
#include <span>
#include <sstream>
#include <stdexcept>
#include <string>

#include <sys/resource.h>

#include "fashion_mnist.hpp"

namespace tutti::train {

namespace {

using Clock = std::chrono::steady_clock;

constexpr std::int64_t warm_up_steps = 5;  // left out of the step time: allocations, first negotiations
constexpr std::int64_t eval_batch = 1000;

// Pixels and labels of a split as tensors (copies: the ImageSet goes away).
std::pair<torch::Tensor, torch::Tensor> tensors_of(const ImageSet& set) {
  const auto n = static_cast<std::int64_t>(set.count);
  auto bytes =
      torch::from_blob(const_cast<std::uint8_t*>(set.pixels.data()),
                       {n, static_cast<std::int64_t>(set.rows), static_cast<std::int64_t>(set.cols)}, torch::kUInt8);
  auto labels = torch::from_blob(const_cast<std::uint8_t*>(set.labels.data()), {n}, torch::kUInt8);
  return {normalize_images(bytes), labels.to(torch::kInt64)};
}

}  // namespace

Data load_data(const Settings& s) {
  Data d;
  std::tie(d.train_images, d.train_labels) = tensors_of(read_fashion_mnist(s.data, "train", s.train_samples));
  std::tie(d.test_images, d.test_labels) = tensors_of(read_fashion_mnist(s.data, "t10k", s.test_samples));
  return d;
}

Trainer::Trainer(Communicator& comm, const Settings& s, const Data& data)
    : comm_(comm),
      s_(s),
      data_(data),
      layout_(Layout::of(s, comm.rank(), comm.size())),
      timer_(stretch_of(s, comm.rank())) {
  const std::int64_t per_rank = data_.train_images.size(0) / layout_.data;
  steps_per_epoch_ = per_rank / s_.batch_size / s_.backward_passes * s_.backward_passes;
  if (steps_per_epoch_ == 0)
    throw std::runtime_error(std::to_string(data_.train_images.size(0)) + " training samples are too few for " +
                             std::to_string(layout_.data) + " data-parallel ranks x batch " +
                             std::to_string(s_.batch_size) + " x " + std::to_string(s_.backward_passes) +
                             " backward passes");
  groups_ = std::make_unique<Groups>(comm_, layout_);
  part_ = std::make_unique<ModelPart>(s_, layout_, groups_->tensor);
  // Before anything records the parameters' addresses: it moves them into the device pool.
  if (s_.device_memory > 0) out_of_core_ = std::make_unique<OutOfCore>(*part_->net(), s_.device_memory, s_.swap);
  auto named = part_->named_parameters();
  // Identical anyway (every rank seeds alike); the broadcast makes sure.
  for (auto& [name, t] : named)
    if (t.nbytes() > 0) groups_->data.broadcast(t.data_ptr(), t.nbytes(), DataType::u8, 0);
  std::vector<torch::Tensor> parameters;
  for (auto& item : named) parameters.push_back(item.second);
  if (s_.zero > 0) {
    tutti::libtorch::ShardedOptions options;
    options.stage = s_.zero;
    options.lr = s_.lr;
    options.momentum = s_.momentum;
    // Stage 2 reduces buckets during backward; its overlap takes one backward per step (no pipeline).
    options.overlap = s_.overlap && s_.zero == 2 && layout_.pipeline == 1;
    zero_ = std::make_unique<tutti::libtorch::ShardedOptimizer>(groups_->data, named, options);
  } else {
    if (layout_.pipeline == 1) timer_.install(named);  // before optimizer_'s hooks
    const auto sgd_options = torch::optim::SGDOptions(s_.lr).momentum(s_.momentum);
    if (out_of_core_)
      sgd_ = out_of_core_->make_sgd(sgd_options);
    else
      sgd_ = std::make_unique<TimedSGD>(timer_, parameters, sgd_options);
    tutti::libtorch::DistributedOptions options;
    options.overlap = s_.overlap;
    // A pipeline's micro-batches each run one backward pass per step.
    options.backward_passes_per_step = s_.backward_passes * s_.micro_batches;
    if (!s_.timeline.empty()) options.engine.timeline_path = s_.timeline;
    options.engine.timeline_rank = comm_.rank();  // the engine runs on the data group
    if (s_.fusion_threshold) options.engine.fusion_threshold = *s_.fusion_threshold;
    options.compression = tutti::compress::Compression::parse(s_.compression);
    options.compression_seed = s_.seed;
    for (const auto& item : part_->net()->named_buffers()) options.buffers.emplace_back(item.key(), item.value());
    optimizer_ =
        std::make_unique<tutti::libtorch::DistributedOptimizer>(groups_->data, *sgd_, named, std::move(options));
    tutti::libtorch::broadcast_optimizer_state(groups_->data, *sgd_, 0);
  }
  if (layout_.pipeline > 1) {
    stage_ = std::make_unique<tutti::libtorch::PipelineStage>(
        groups_->pipeline, [this](const torch::Tensor& x) { return part_->forward(x); }, part_->input_shape(),
        *tutti::libtorch::pipeline_schedule_from_name(s_.schedule), s_.micro_batches);
    // The timeline shows each micro-batch's forward (F3) and backward (B3) and each step's
    // pipeline (PIPELINE): tools/analyze_timeline.py --pipeline measures the bubble from them.
    if (optimizer_) {
      stage_->on_action(
          [this](const tutti::libtorch::PipelineAction& a, Clock::time_point start, Clock::time_point end) {
            optimizer_->engine().record_phase((a.forward ? "F" : "B") + std::to_string(a.micro_batch), start, end);
          });
      stage_->on_step([this](Clock::time_point start, Clock::time_point end) {
        optimizer_->engine().record_phase("PIPELINE", start, end);
      });
    }
  }
  if (!s_.loss_log.empty() && comm_.rank() == 0) {
    loss_log_ = std::fopen(s_.loss_log.c_str(), "w");
    if (!loss_log_) throw std::runtime_error("--loss-log: cannot write " + s_.loss_log);
    std::fputs("# epoch step loss (mean over the global batch)\n", loss_log_);
  }
}

Trainer::~Trainer() {
  if (loss_log_) std::fclose(loss_log_);
}

std::vector<std::int64_t> Trainer::shard_of_epoch(int epoch, std::int64_t from_sample) const {
  // Fisher-Yates over mt19937_64 rather than std::shuffle, whose algorithm the standard leaves
  // open: every rank must compute the same permutation.
  std::vector<std::int64_t> order(static_cast<std::size_t>(data_.train_images.size(0)));
  std::iota(order.begin(), order.end(), 0);
  std::mt19937_64 rng(s_.seed + static_cast<std::uint64_t>(epoch));
  for (std::size_t i = order.size(); i > 1; --i) std::swap(order[i - 1], order[rng() % i]);
  // Rank r takes r, r+p, r+2p…, order.size()/p of them: the tail is dropped, so that every rank
  // runs the same number of steps.
  const std::size_t p = static_cast<std::size_t>(layout_.data);
  const std::size_t from = std::min(order.size(), static_cast<std::size_t>(from_sample));
  std::vector<std::int64_t> shard((order.size() - from) / p);
  for (std::size_t k = 0; k < shard.size(); ++k) shard[k] = order[from + static_cast<std::size_t>(layout_.d) + k * p];
  return shard;
}

std::vector<double> Trainer::evaluate_shard() {
  torch::NoGradGuard no_grad;
  part_->net()->eval();
  const std::int64_t n = data_.test_images.size(0);
  const auto index = torch::arange(layout_.d, n, layout_.data, torch::kInt64);
  double correct = 0, loss_sum = 0, total = 0;
  for (std::int64_t begin = 0; begin < index.size(0); begin += eval_batch) {
    const auto batch = index.slice(0, begin, std::min(begin + eval_batch, index.size(0)));
    const auto images = data_.test_images.index_select(0, batch);
    const auto logits = stage_ ? stage_->forward_only(batch.size(0), images) : part_->forward(images);
    if (!layout_.last_stage()) continue;
    const auto labels = data_.test_labels.index_select(0, batch);
    loss_sum += loss_of(logits, labels, torch::kSum).item<double>();
    correct += static_cast<double>(logits.argmax(1).eq(labels).sum().item<std::int64_t>());
    total += static_cast<double>(batch.size(0));
  }
  part_->net()->train();
  return {correct, total, loss_sum};
}

double Trainer::forward_backward(const torch::Tensor& images, const torch::Tensor& labels,
                                 Clock::time_point step_start) {
  if (stage_) {
    const auto micro_images = images.chunk(s_.micro_batches);
    const auto micro_labels = labels.chunk(s_.micro_batches);
    // Each micro-batch's mean loss over M: the gradients the stages accumulate are the batch's mean.
    return stage_->run(s_.batch_size / s_.micro_batches, micro_images, [&](const torch::Tensor& output, int k) {
      return loss_of(output, micro_labels[static_cast<std::size_t>(k)]) / s_.micro_batches;
    });
  }
  const auto loss = out_of_core_ ? out_of_core_->forward(images, labels) : loss_of(part_->forward(images), labels);
  const auto t1 = timer_.forward_done(step_start);  // the profile's forward holds zero_grad
  timer_.backward_started(t1);
  // Gradients are summed over the passes of a window: scale for their mean.
  (s_.backward_passes > 1 ? loss / s_.backward_passes : loss).backward();
  timer_.backward_done();
  if (optimizer_) {
    optimizer_->engine().record_phase("FORWARD", step_start, t1);
    optimizer_->engine().record_phase("BACKWARD", t1, Clock::now());
  }
  return loss.item<double>();
}

void Trainer::zero_grad() {
  if (zero_)
    zero_->zero_grad();
  else
    optimizer_->zero_grad();
}

void Trainer::optimizer_step() {
  if (zero_) return zero_->step();
  // DistributedOptimizer::step counts backward passes: a pipeline step ran one per micro-batch.
  for (int pass = 0; pass < s_.micro_batches; ++pass) optimizer_->step();
}

void Trainer::log_loss(int epoch, std::int64_t step, double loss) {
  if (s_.loss_log.empty()) return;
  // The last stage's first tensor rank of each data rank holds its shard's loss.
  double mine = layout_.last_stage() && layout_.t == 0 ? loss / layout_.data : 0.0;
  comm_.allreduce(&mine, &mine, 1, DataType::f64, ReduceOp::sum);
  if (loss_log_) std::fprintf(loss_log_, "%d %lld %.9e\n", epoch, static_cast<long long>(step), mine);
}

EpochResult Trainer::run_epoch(int epoch, std::int64_t first_step,
                               const std::function<void(std::int64_t step, double loss)>& after_step,
                               std::int64_t from_sample) {
  const std::vector<std::int64_t> shard = shard_of_epoch(epoch, from_sample);
  const std::int64_t epoch_steps =
      from_sample == 0 ? steps_per_epoch_ : static_cast<std::int64_t>(shard.size()) / s_.batch_size;
  if (optimizer_) optimizer_->reset_overlap_stats();
  double loss_sum = 0, timed_seconds = 0, all_seconds = 0;
  std::int64_t timed_steps = 0;
  // Per step: the time step() waited for the allreduces, and the time in allreduce calls.
  std::vector<double> waits, reduces;
  waits.reserve(static_cast<std::size_t>(epoch_steps));
  reduces.reserve(static_cast<std::size_t>(epoch_steps));
  const std::int64_t steps = std::max<std::int64_t>(1, epoch_steps - first_step);
  for (std::int64_t step = first_step; step < epoch_steps; ++step, ++steps_run_) {
    const auto index = torch::from_blob(const_cast<std::int64_t*>(shard.data()) + step * s_.batch_size, {s_.batch_size},
                                        torch::kInt64);
    const auto images = data_.train_images.index_select(0, index);
    const auto labels = data_.train_labels.index_select(0, index);
    const auto t0 = Clock::now();
    zero_grad();
    const double loss = forward_backward(images, labels, t0);
    const auto before = overlap_stats();
    optimizer_step();
    if (after_step) after_step(step, loss);  // a checkpoint's copy (or blocking write) counts in the step
    const auto t3 = Clock::now();
    const auto after = overlap_stats();
    waits.push_back(after.wait_seconds - before.wait_seconds);
    reduces.push_back(after.allreduce_seconds - before.allreduce_seconds);
    if (!stage_) timer_.pass_done(steps_run_ >= warm_up_steps);
    if (stage_ && steps_run_ + 1 == warm_up_steps) stage_->reset_stats();  // the bubble after warm-up
    log_loss(epoch, step, loss);
    loss_sum += loss;
    all_seconds += seconds(t3 - t0);
    if (steps_run_ >= warm_up_steps) {
      timed_seconds += seconds(t3 - t0);
      ++timed_steps;
    }
  }
  // An epoch entirely within the warm-up is timed whole rather than not at all.
  const double step_seconds = timed_steps ? timed_seconds / timed_steps : all_seconds / steps;

  std::vector<double> sums = evaluate_shard();  // correct, total, test loss sum
  const auto overlap = overlap_stats();
  sums.insert(sums.end(), {loss_sum, overlap.hidden_seconds, overlap.allreduce_seconds});
  comm_.allreduce(std::span<double>(sums), ReduceOp::sum);

  EpochResult r;
  // Every data rank's last pipeline stage holds its loss, once per tensor rank.
  r.train_loss = sums[3] / static_cast<double>(steps * layout_.data * layout_.tensor);
  r.test_accuracy = sums[1] > 0 ? sums[0] / sums[1] : 0;
  r.test_loss = sums[1] > 0 ? sums[2] / sums[1] : 0;
  r.step_seconds = step_seconds;
  r.samples_per_second = static_cast<double>(layout_.data * s_.batch_size) / step_seconds;
  if (stage_) {
    const auto& st = stage_->stats();
    r.idle_fraction = st.idle_fraction();
    const double steps_timed = std::max<double>(1, static_cast<double>(st.steps));
    r.stage_compute_seconds = st.compute_seconds / steps_timed;
    r.stage_step_seconds = st.step_seconds / steps_timed;
  }
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

tutti::libtorch::OverlapStats Trainer::overlap_stats() const {
  return optimizer_ ? optimizer_->overlap_stats() : tutti::libtorch::OverlapStats{};
}

std::uint64_t Trainer::parameter_checksum() const {
  std::uint64_t hash = tutti::libtorch::detail::fnv1a_offset;
  for (const auto& item : part_->named_parameters()) {
    const auto t = item.second.contiguous();
    hash = tutti::libtorch::detail::fnv1a(t.data_ptr(), t.nbytes(), hash);
  }
  return hash;
}

std::int64_t Trainer::parameter_count() const {
  std::int64_t n = 0;
  for (const auto& t : part_->net()->parameters()) n += t.numel();
  return n;
}

MemoryUse Trainer::memory_use() const {
  MemoryUse m;
  for (const auto& item : part_->named_parameters()) m.parameters += item.second.nbytes();
  if (zero_) {
    m.optimizer_state = zero_->optimizer_state_bytes();
    m.gradients = zero_->gradient_bytes_held();
  } else {
    for (const auto& group : sgd_->param_groups())
      for (const auto& p : group.params())
        if (p.grad().defined()) m.gradients += p.grad().nbytes();
    if (out_of_core_)  // the momentum buffers, in the device pool (or swapped out): one per parameter
      m.optimizer_state = s_.momentum != 0 ? m.parameters : 0;
    else
      for (const auto& item : sgd_->state()) {
        const auto& buffer = static_cast<const torch::optim::SGDParamState&>(*item.second).momentum_buffer();
        if (buffer.defined()) m.optimizer_state += buffer.nbytes();
      }
  }
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  m.max_rss = static_cast<std::uint64_t>(usage.ru_maxrss) * 1024;  // Linux reports KiB
  return m;
}

std::vector<std::byte> Trainer::save_state() const {
  std::vector<std::byte> bytes;
  auto put = [&](const torch::Tensor& t) {
    const torch::Tensor c = t.detach().contiguous();
    const auto* p = static_cast<const std::byte*>(c.data_ptr());
    bytes.insert(bytes.end(), p, p + c.nbytes());
  };
  for (const auto& [name, t] : part_->named_parameters()) put(t);
  for (const auto& t : part_->net()->buffers()) put(t);
  // The optimizer's state (momentum) in libtorch's own format, which maps it to the parameters by
  // their order rather than by address.
  torch::serialize::OutputArchive archive;
  sgd_->save(archive);
  std::ostringstream text;
  archive.save_to(text);
  const std::string optimizer = text.str();
  auto put_bytes = [&](const void* data, std::uint64_t length) {
    const auto* l = reinterpret_cast<const std::byte*>(&length);
    bytes.insert(bytes.end(), l, l + sizeof length);
    const auto* d = static_cast<const std::byte*>(data);
    bytes.insert(bytes.end(), d, d + length);
  };
  put_bytes(optimizer.data(), optimizer.size());
  const torch::Tensor rng = tutti::libtorch::cpu_generator_state();
  put_bytes(rng.data_ptr(), rng.nbytes());
  return bytes;
}

tutti::compress::CompressorState Trainer::compressor_state() const {
  const auto* compressor = optimizer_ ? optimizer_->compressor() : nullptr;
  return compressor ? compressor->save_state() : tutti::compress::CompressorState{};
}

void Trainer::load_compressor_state(std::span<const std::byte> shared, std::span<const std::byte> local) {
  if (shared.empty()) return;
  auto* compressor = optimizer_ ? optimizer_->compressor() : nullptr;
  if (!compressor)
    throw Error(ErrorCode::invalid_argument,
                "tutti-train: a compressor's state, and --compression " + s_.compression + " keeps none");
  compressor->load_state(shared, local);
}

void Trainer::load_state(std::span<const std::byte> bytes) {
  torch::NoGradGuard no_grad;
  std::size_t at = 0;
  auto take = [&](torch::Tensor t) {
    const std::size_t n = t.nbytes();
    if (at + n > bytes.size())
      throw Error(ErrorCode::invalid_argument,
                  "tutti-train: a state of " + std::to_string(bytes.size()) + " bytes does not hold this model");
    std::memcpy(t.data_ptr(), bytes.data() + at, n);
    at += n;
  };
  for (auto& [name, t] : part_->named_parameters()) take(t.detach());
  for (auto& t : part_->net()->buffers()) take(t.detach());
  std::uint64_t length = 0;
  if (at + sizeof length <= bytes.size()) std::memcpy(&length, bytes.data() + at, sizeof length);
  at += sizeof length;
  if (at > bytes.size() || length > bytes.size() - at)
    throw Error(ErrorCode::invalid_argument, "tutti-train: a state of " + std::to_string(bytes.size()) +
                                                 " bytes does not hold this model's optimizer");
  std::istringstream text(std::string(reinterpret_cast<const char*>(bytes.data() + at), length));
  at += length;
  torch::serialize::InputArchive archive;
  archive.load_from(text);
  sgd_->load(archive);
  torch::Tensor rng = tutti::libtorch::cpu_generator_state();
  if (at + sizeof length <= bytes.size()) std::memcpy(&length, bytes.data() + at, sizeof length);
  at += sizeof length;
  if (at > bytes.size() || length != rng.nbytes() || length > bytes.size() - at)
    throw Error(ErrorCode::invalid_argument, "tutti-train: a state of " + std::to_string(bytes.size()) +
                                                 " bytes holds no generator state of " + std::to_string(rng.nbytes()) +
                                                 " bytes");
  std::memcpy(rng.data_ptr(), bytes.data() + at, length);
  at += length;
  tutti::libtorch::set_cpu_generator_state(rng);
  if (at != bytes.size())
    throw Error(ErrorCode::invalid_argument, "tutti-train: a state of " + std::to_string(bytes.size()) +
                                                 " bytes does not hold this model (" + std::to_string(at) + ")");
}

}  // namespace tutti::train
