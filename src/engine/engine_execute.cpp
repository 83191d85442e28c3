// Running what a cycle decided: the ready tensors planned into fusion buckets, and each bucket
// or lone tensor run as one collective through the fusion buffer.
#include <algorithm>

#include "core/copy.hpp"
#include "engine/engine_core.hpp"

namespace tutti::engine {

namespace {

std::string phase_name(Collective kind) {
  switch (kind) {
    case Collective::allreduce:
      return "ALLREDUCE";
    case Collective::allgather:
      return "ALLGATHER";
    case Collective::broadcast:
      return "BROADCAST";
    default:
      return "?";
  }
}

}  // namespace

void EngineCore::execute(const Decision& decision, Clock::time_point decided) {
  for (const auto& failure : decision.failed) {
    auto it = announced_.find(failure.name);
    if (it == announced_.end()) continue;
    auto t = it->second;
    announced_.erase(it);
    complete(t, std::make_exception_ptr(Error(failure.code, failure.message)));
  }
  std::vector<std::shared_ptr<TensorState>> ready;
  ready.reserve(decision.ready.size());
  bool joined = false;
  {
    std::lock_guard lock(mutex_);
    joined = join_ != nullptr;
  }
  const auto tl = timeline();
  for (const auto& d : decision.ready) {
    auto it = announced_.find(d.name);
    std::shared_ptr<TensorState> t;
    if (it != announced_.end()) {
      t = it->second;
      announced_.erase(it);
    } else if (joined && d.kind == Collective::allreduce) {
      t = joined_part(d, decided);  // this rank joined: it reduces zeros with the others
    } else {
      // Every rank announced it, this one included (a joined rank answers allreduces only).
      throw Error(ErrorCode::system, "engine: tensor '" + d.name + "' is ready but unknown on this rank");
    }
    t->ready = decided;
    if (tl) tl->event(d.name, "NEGOTIATE", t->enqueued, decided);
    ready.push_back(std::move(t));
  }
  if (ready.empty()) {
    if (table_.idle()) step_start_ = true;
    return;
  }
  auto jobs = plan(ready);
  step_start_ = false;
  for (std::size_t i = 0; i < jobs.size(); ++i) {
    try {
      run_job(jobs[i]);
    } catch (...) {
      // The engine stops (run() fails what it still holds); these are no longer held anywhere.
      const auto error = std::current_exception();
      for (std::size_t j = i; j < jobs.size(); ++j)
        for (const auto& t : jobs[j].tensors)
          if (!t->finished()) complete(t, error);
      throw;
    }
  }
}

std::shared_ptr<TensorState> EngineCore::joined_part(const Descriptor& d, Clock::time_point decided) {
  auto t = std::make_shared<TensorState>();
  t->descriptor = d;
  t->scratch.assign(d.count * size_of(d.type), std::byte{0});
  t->send = t->scratch.data();
  t->recv = t->scratch.data();
  t->enqueued = decided;
  return t;
}

std::vector<EngineCore::Job> EngineCore::plan(const std::vector<std::shared_ptr<TensorState>>& ready) {
  std::vector<Descriptor> described;
  described.reserve(ready.size());
  for (const auto& t : ready) described.push_back(t->descriptor);
  std::vector<Job> jobs;
  for (const auto& members :
       plan_fusion(described, options_.fusion_threshold, options_.first_bucket_bytes, step_start_)) {
    Job job;
    for (std::size_t i : members) {
      job.tensors.push_back(ready[i]);
      job.bytes += described[i].count * size_of(described[i].type);
    }
    jobs.push_back(std::move(job));
  }
  return jobs;
}

void EngineCore::run_job(Job& job) {
  const auto start = Clock::now();
  const auto& d0 = job.tensors.front()->descriptor;
  const std::string phase = phase_name(d0.kind);
  std::string args = "\"bytes\": " + std::to_string(job.bytes) + ", \"tensors\": " + std::to_string(job.tensors.size());
  const auto tl = timeline();
  if (tl)
    for (const auto& t : job.tensors) tl->event(t->descriptor.name, "QUEUE", t->ready, start);

  if (job.tensors.size() == 1) {
    auto& t = job.tensors.front();
    if (d0.count > 0) {
      switch (d0.kind) {
        case Collective::allreduce:
          comm_.allreduce(t->send, t->recv, d0.count, d0.type, d0.op);
          break;
        case Collective::allgather:
          comm_.allgather(t->send, t->recv, d0.count, d0.type);
          break;
        case Collective::broadcast:
          comm_.broadcast(t->recv, d0.count, d0.type, d0.root);
          break;
        default:  // Descriptor::kind is one of the three (checked where it is made or decoded)
          break;
      }
    }
    const auto end = Clock::now();
    if (tl) tl->event(d0.name, phase, start, end, args);
    count(1, job.bytes, start, end, d0.kind == Collective::allreduce);
    complete(t, nullptr);
    return;
  }

  // A fused bucket of allreduces of one type and op.
  std::byte* fusion = fusion_buffer(job.bytes);
  std::size_t at = 0;
  for (const auto& t : job.tensors) {
    const auto t0 = Clock::now();
    const std::size_t n = t->descriptor.count * size_of(t->descriptor.type);
    if (n) core::copy(fusion + at, t->send, n);
    at += n;
    if (tl) tl->event(t->descriptor.name, "MEMCPY_IN_FUSION_BUFFER", t0, Clock::now());
  }
  const auto reduce_start = Clock::now();
  const std::size_t elements = job.bytes / size_of(d0.type);
  if (elements) comm_.allreduce(fusion, fusion, elements, d0.type, d0.op);
  const auto reduce_end = Clock::now();
  if (tl)
    for (const auto& t : job.tensors) tl->event(t->descriptor.name, phase, reduce_start, reduce_end, args);
  count(job.tensors.size(), job.bytes, reduce_start, reduce_end, true);
  at = 0;
  for (const auto& t : job.tensors) {
    const auto t0 = Clock::now();
    const std::size_t n = t->descriptor.count * size_of(t->descriptor.type);
    if (n) core::copy(t->recv, fusion + at, n);
    at += n;
    if (tl) tl->event(t->descriptor.name, "MEMCPY_OUT_FUSION_BUFFER", t0, Clock::now());
    complete(t, nullptr);
  }
}

std::byte* EngineCore::fusion_buffer(std::size_t bytes) {
  if (fusion_.size() >= bytes) return fusion_.data();
  if (fusion_plain_.size() >= bytes) return fusion_plain_.data();
  const std::size_t grown = std::max(bytes, 2 * std::max(fusion_.size(), fusion_plain_.size()));
  fusion_ = SharedBuffer();  // the old buffer goes first
  try {
    fusion_ = comm_.allocate(grown);
    fusion_plain_ = {};
    return fusion_.data();
  } catch (const Error&) {
    fusion_plain_.resize(grown);
    return fusion_plain_.data();
  }
}

}  // namespace tutti::engine
