#include "profiling.hpp"

#include <sys/prctl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <thread>

#include "tutti/torch.hpp"

namespace tutti::train {

ComputeTimer::ComputeTimer(double stretch) : stretch_(stretch) {
  // The stretch sleeps (see stretch()); a timer slack of 1 ns instead of Linux's default 50 us
  // keeps the short segments of small layers from being stretched far more than asked.
  if (stretch_ > 1) prctl(PR_SET_TIMERSLACK, 1UL, 0UL, 0UL, 0UL);
}

ComputeTimer::~ComputeTimer() {
  for (auto& p : params_)
    if (p.accumulator && p.hook_key) p.accumulator->del_post_hook(p.hook_key);
}

void ComputeTimer::install(const std::vector<std::pair<std::string, torch::Tensor>>& named_parameters) {
  for (const auto& [name, tensor] : named_parameters) {
    if (!tensor.requires_grad() || !tensor.is_leaf()) continue;
    Param p;
    p.name = name;
    p.count = static_cast<std::size_t>(tensor.numel());
    p.type = tutti::libtorch::dtype_of(tensor);
    p.accumulator = torch::autograd::impl::grad_accumulator(tensor);
    if (!p.accumulator) continue;
    const std::size_t i = params_.size();
    p.hook_key = p.accumulator->add_post_hook(
        std::make_unique<tutti::libtorch::detail::GradReadyHook>([this, i] { gradient_ready(i); }));
    params_.push_back(std::move(p));
  }
  for (Sums* s : {&pass_, &all_, &timed_}) s->gradients.assign(params_.size(), 0.0);
}

void ComputeTimer::stretch(Clock::duration measured) const {
  if (stretch_ <= 1) return;
  // Sleep, not spin: every rank of a job on this machine shares its 2 cores, and a straggler
  // that spun would slow the others' compute and the engine threads too; a slow rank of a real
  // cluster is slow on cores of its own.
  const auto wait = std::chrono::duration_cast<Clock::duration>(measured * (stretch_ - 1));
  std::this_thread::sleep_until(Clock::now() + wait);
}

ComputeTimer::Clock::time_point ComputeTimer::forward_done(Clock::time_point start) {
  const auto end = Clock::now();
  pass_.forward += seconds(end - start);
  stretch(end - start);
  return Clock::now();
}

void ComputeTimer::backward_started(Clock::time_point start) {
  segment_start_ = start;
  pass_order_.clear();
}

void ComputeTimer::gradient_ready(std::size_t i) {
  const auto now = Clock::now();
  pass_.gradients[i] += seconds(now - segment_start_);
  pass_order_.push_back(i);
  stretch(now - segment_start_);
  segment_start_ = Clock::now();  // the next segment leaves the wait out
}

void ComputeTimer::backward_done() {
  const auto now = Clock::now();
  pass_.tail += seconds(now - segment_start_);
  stretch(now - segment_start_);
}

void ComputeTimer::optimizer_done(Clock::time_point start) {
  const auto end = Clock::now();
  pass_.optimizer += seconds(end - start);
  pass_.optimizer_steps += 1;
  stretch(end - start);
}

void ComputeTimer::add(Sums& into, const Sums& pass) {
  double compute = pass.forward + pass.tail + pass.optimizer;
  for (double g : pass.gradients) compute += g;
  into.compute += compute;
  into.compute_squares += compute * compute;
  into.forward += pass.forward;
  into.optimizer += pass.optimizer;
  into.tail += pass.tail;
  for (std::size_t i = 0; i < pass.gradients.size(); ++i) into.gradients[i] += pass.gradients[i];
  into.passes += 1;
  into.optimizer_steps += pass.optimizer_steps;
}

void ComputeTimer::pass_done(bool timed) {
  // The order of the first pass that made every gradient ready: backward's order does not change
  // from pass to pass for a given model.
  if (!order_known_ && pass_order_.size() == params_.size()) {
    order_ = pass_order_;
    order_known_ = true;
  }
  add(all_, pass_);
  if (timed) add(timed_, pass_);
  pass_ = Sums{};
  pass_.gradients.assign(params_.size(), 0.0);
}

sim::ModelProfile ComputeTimer::profile(const std::string& model, std::int64_t batch_size,
                                        std::vector<std::string> notes) const {
  const Sums& s = timed_.passes > 0 ? timed_ : all_;
  const auto per_pass = [&](double total) { return s.passes > 0 ? total / static_cast<double>(s.passes) : 0.0; };
  sim::ModelProfile p;
  p.model = model;
  p.batch_size = batch_size;
  p.forward_seconds = per_pass(s.forward);
  p.optimizer_seconds = s.optimizer_steps > 0 ? s.optimizer / static_cast<double>(s.optimizer_steps) : 0.0;
  p.backward_tail_seconds = per_pass(s.tail);
  if (s.passes > 1 && s.compute > 0) {  // the passes' compute: standard deviation over mean
    const double n = static_cast<double>(s.passes), mean = s.compute / n;
    p.jitter = std::sqrt(std::max(0.0, s.compute_squares / n - mean * mean)) / mean;
  }
  p.notes = std::move(notes);
  std::vector<std::size_t> order = order_;
  for (std::size_t i = 0; i < params_.size(); ++i)  // never ready (unused): last, with no time
    if (std::find(order.begin(), order.end(), i) == order.end()) order.push_back(i);
  for (std::size_t i : order)
    p.gradients.push_back({params_[i].name, params_[i].count, params_[i].type, per_pass(s.gradients[i])});
  return p;
}

torch::Tensor TimedSGD::step(LossClosure closure) {
  const auto start = ComputeTimer::Clock::now();
  auto loss = torch::optim::SGD::step(std::move(closure));
  timer_.optimizer_done(start);
  return loss;
}

double stretch_of(const Settings& s, int rank) {
  return s.straggler && s.straggler->rank == rank ? s.straggler->factor : 1.0;
}

std::string profile_path(const Settings& s, int rank) {
  std::string path = s.profile;
  const auto at = path.find("{rank}");
  if (at != std::string::npos) return path.replace(at, 6, std::to_string(rank));
  return rank == 0 ? path : std::string();
}

std::string profile_path_problem(const Settings& s, int rank) {
  const std::string path = profile_path(s, rank);
  if (path.empty()) return {};
  const auto slash = path.rfind('/');
  const std::string dir = slash == std::string::npos ? "." : slash == 0 ? "/" : path.substr(0, slash);
  if (::access(dir.c_str(), W_OK) != 0)
    return "rank " + std::to_string(rank) + " cannot write to '" + dir + "': " + std::strerror(errno);
  return {};
}

void save_profile(const Settings& s, const Communicator& comm, const ComputeTimer& timer,
                  std::size_t fusion_threshold) {
  const std::string path = profile_path(s, comm.rank());
  if (path.empty()) return;
  std::vector<std::string> notes{
      "measured by tutti-train on rank " + std::to_string(comm.rank()) + " of " + std::to_string(comm.size()) +
          ": threads " + std::to_string(s.threads) + ", overlap " + (s.overlap ? "on" : "off") + ", compression " +
          s.compression + ", fusion threshold " + std::to_string(fusion_threshold) +
          " bytes, backward passes per step " + std::to_string(s.backward_passes),
      "means per backward pass (forward, grads) and per optimizer step, warm-up steps left out",
      "forward holds zero_grad; backward_tail is backward's time after its last gradient; jitter is the "
      "standard deviation over the mean of a pass's whole compute",
      "compute measured while communication runs beside it (overlap, the engine's thread) includes its "
      "interference"};
  if (s.straggler) {
    char factor[32];
    std::snprintf(factor, sizeof factor, "%g", s.straggler->factor);
    notes.push_back("--straggler " + std::to_string(s.straggler->rank) + ":" + factor +
                    " (the times leave out the injected waits)");
  }
  sim::write_profile_file(path, timer.profile("fashion-mnist-cnn", s.batch_size, std::move(notes)));
}

}  // namespace tutti::train
