#include "exec/operation.hpp"

#include <algorithm>
#include <cstring>
#include <map>
#include <new>

#include "core/copy.hpp"
#include "reduce/reduce.hpp"
#include "transport/matching.hpp"

namespace tutti::exec {

using schedule::Buffer;
using schedule::StepKind;
using transport::Completion;

void Operation::succeed() {
  if (finalize_) finalize_();
  finished_ = true;
}

void Operation::finish_with(const Error& error) {
  error_ = error;
  finished_ = true;
}

std::shared_ptr<Operation> Operation::collective(transport::Transport& transport, std::shared_ptr<const Plan> plan,
                                                 Buffers buffers, DataType type, ReduceOp op,
                                                 transport::Signature signature) {
  return std::make_shared<ScheduleOperation>(transport, std::move(plan), buffers, type, op, signature);
}

std::shared_ptr<Operation> Operation::collective(transport::Transport& transport, schedule::Schedule schedule,
                                                 Buffers buffers, DataType type, ReduceOp op,
                                                 transport::Signature signature) {
  return collective(transport, Plan::collective(transport, std::move(schedule), signature, size_of(type)), buffers,
                    type, op, signature);
}

std::string PointToPoint::describe() const {
  return std::string(is_send ? "send" : "recv") + "(count=" + std::to_string(count) + ", " +
         std::string(to_string(type)) + (is_send ? ", to rank " : ", from rank ") +
         (peer == any_peer ? std::string("any") : std::to_string(peer)) + ", tag " + std::to_string(tag) + ")";
}

std::shared_ptr<Operation> Operation::point_to_point(transport::Transport& transport, const PointToPoint& message,
                                                     transport::MessageKey key) {
  return std::make_shared<ScheduleOperation>(transport, message, key);
}

std::shared_ptr<Operation> Operation::native(transport::Signature signature,
                                             std::shared_ptr<transport::NativeCollective> run) {
  return std::make_shared<NativeOperation>(signature, std::move(run));
}

namespace {

constexpr std::uint32_t signature_index = ~std::uint32_t{0};  // reserved message index

// Whether the call's own messages do the signature ring's work: the transport checks the
// sender's signature on every message it delivers (and shared memory compares every pair of a
// host's ranks), and wherever the ranks divide into some that run this call and others that run
// another, some rank of this call sends to one of the others before it waits for them
// (schedule::messages_cross_every_cut, decided from the signature alone, so that no rank waits
// for a signature message another does not send). That message shows the difference on arrival,
// and its receiver aborts all, as the ring's message would.
bool messages_carry_signatures(const transport::Transport& transport, const transport::Signature& signature) {
  return transport.checks_message_signatures() &&
         schedule::messages_cross_every_cut(signature.algorithm, signature.collective, signature.count,
                                            transport.size());
}

}  // namespace

// These calls move their messages along a tree that spans every rank (a broadcast's or scatter's
// away from the root, a reduce's or gather's towards it): every non-root exchanges one message
// with its parent, which carries the sender's signature, and a rank waits only for messages
// from its children (towards the root) or its parent (away from it). So where ranks disagree,
// some edge of the tree joins a rank with one call to a rank with another: either a message
// crosses it (its receiver sees the other call on arrival), or the rank that waits on it never
// hears from the other and, after notice_after, names its own call to it (notify_signature,
// below), where it is compared. Without the ring no rank waits for a neighbour it has no edge
// to, so a broadcast's or scatter's root returns once it has sent, a reduce's or gather's leaf
// once it has sent. What bounds how far a rank runs ahead is the ring kept where the
// communicator's RunAheadWindow is full.
std::size_t Plan::run_ahead_weight(const transport::Transport& transport, const transport::Signature& signature,
                                   std::size_t elem_size) {
  return run_ahead_weight(transport.kind(), signature.collective, signature.algorithm, transport.size(),
                          signature.count, elem_size);
}

std::size_t Plan::run_ahead_weight(transport::Kind kind, Collective collective, Algorithm algorithm, int p,
                                   std::size_t count, std::size_t elem_size) {
  static_assert(max_notice_steps <= 64);
  if (!transport::checks_message_signatures(kind) || p < 2 || p > run_ahead_ranks || count == 0) return 0;
  // The largest message: a gather's or scatter's tree carries up to every block but the root's.
  std::size_t blocks = 1;
  switch (collective) {
    case Collective::broadcast:
    case Collective::reduce:  // (ring: the chain, a tree too)
      if (algorithm != Algorithm::binomial_tree && algorithm != Algorithm::ring) return 0;
      break;
    case Collective::gather:
    case Collective::scatter:
      if (algorithm != Algorithm::linear && algorithm != Algorithm::binomial_tree) return 0;
      blocks = static_cast<std::size_t>(p);
      break;
    default:
      return 0;
  }
  if (count > run_ahead_bytes / elem_size / blocks) return 0;
  return count * elem_size * blocks + run_ahead_bookkeeping;
}

std::shared_ptr<const Plan> Plan::collective(const transport::Transport& transport, schedule::Schedule schedule,
                                             const transport::Signature& signature, std::size_t elem_size,
                                             bool run_ahead) {
  auto plan = std::make_shared<Plan>();
  plan->schedule = std::move(schedule);
  // The k-th message between two ranks in list order is matched by index k on both sides.
  const auto& steps = plan->schedule.steps;
  plan->message_index.resize(steps.size());
  std::map<int, std::uint32_t> sends, recvs;
  for (std::size_t i = 0; i < steps.size(); ++i) {
    if (steps[i].kind == StepKind::copy) continue;
    auto& counter = steps[i].kind == StepKind::send ? sends[steps[i].peer] : recvs[steps[i].peer];
    plan->message_index[i] = counter++;
  }
  if (transport.detects_every_mismatch() || transport.size() == 1 || messages_carry_signatures(transport, signature)) {
    // no signature message
  } else if (run_ahead && steps.size() <= max_notice_steps) {
    plan->notices = true;
  } else {
    plan->add_signature_exchange(transport.rank(), transport.size(), elem_size);
  }
  plan->build_graph();
  return plan;
}

std::shared_ptr<const Plan> Plan::point_to_point(const PointToPoint& message, std::uint32_t index) {
  auto plan = std::make_shared<Plan>();
  const schedule::Region region{Buffer::output, 0, message.count};
  if (message.is_send)
    plan->schedule.send(message.peer, region);
  else
    plan->schedule.recv(message.peer, region);
  plan->message_index = {index};
  plan->build_graph();
  return plan;
}

// Sends this rank's signature to the next rank and receives the previous one's: if all ranks do
// not agree, some neighbours disagree, and the one that sees it aborts the communicator. The
// signature sent is the run's own (ScheduleOperation writes it into the scratch it sends).
void Plan::add_signature_exchange(int r, int p, std::size_t elem_size) {
  static_assert(sizeof(transport::WireSignature) % 8 == 0);
  const std::size_t elems = sizeof(transport::WireSignature) / elem_size;
  const std::size_t base = schedule.scratch_count;
  schedule.scratch_count += 2 * elems;
  schedule.send((r + 1) % p, schedule::Region{Buffer::scratch, base, elems});
  signature_recv = schedule.recv((r + p - 1) % p, schedule::Region{Buffer::scratch, base + elems, elems});
  message_index.push_back(signature_index);
  message_index.push_back(signature_index);
}

void Plan::build_graph() {
  const std::size_t n = schedule.steps.size();
  deps_count.assign(n, 0);
  dependents_begin.assign(n + 1, 0);
  for (const auto& step : schedule.steps)
    for (auto d : step.deps) ++dependents_begin[d + 1];
  for (std::size_t i = 0; i < n; ++i) dependents_begin[i + 1] += dependents_begin[i];
  dependents.resize(dependents_begin[n]);
  std::vector<std::uint32_t> fill(dependents_begin.begin(), dependents_begin.end() - 1);
  for (std::uint32_t i = 0; i < n; ++i) {
    deps_count[i] = static_cast<std::uint32_t>(schedule.steps[i].deps.size());
    for (auto d : schedule.steps[i].deps) dependents[fill[d]++] = i;
    if (deps_count[i] == 0) first_ready.push_back(i);
  }
  // Receives first: a peer's message that arrives while this rank is still posting its sends
  // (a large send may take a while to hand over) then lands in its buffer, not in a copy of it.
  std::stable_partition(first_ready.begin(), first_ready.end(),
                        [&](std::uint32_t i) { return schedule.steps[i].kind != StepKind::send; });
  std::reverse(first_ready.begin(), first_ready.end());  // pop_back() then starts them in that order
}

ScheduleOperation::ScheduleOperation(transport::Transport& transport, std::shared_ptr<const Plan> plan, Buffers buffers,
                                     DataType type, ReduceOp op, transport::Signature signature)
    : Operation(Kind::collective, signature),
      transport_(transport),
      plan_(std::move(plan)),
      type_(type),
      op_(op),
      elem_size_(size_of(type)),
      key_{transport::Channel::collective, signature.seq, 0} {
  input_ = static_cast<const std::byte*>(buffers.input);
  output_ = static_cast<std::byte*>(buffers.output);
  start_run();
  if (plan_->signature_recv != Plan::none) {
    const transport::WireSignature mine = transport::to_wire(signature_);
    std::memcpy(address(schedule().steps[plan_->signature_recv - 1].region), &mine, sizeof(mine));
  }
}

std::optional<Error> ScheduleOperation::check_signature() const {
  transport::WireSignature theirs;
  std::memcpy(&theirs, address(schedule().steps[plan_->signature_recv].region), sizeof(theirs));
  if (theirs == transport::to_wire(signature_)) return std::nullopt;
  const int p = transport_.size(), r = transport_.rank();
  return transport::collective_mismatch((r + p - 1) % p, transport::from_wire(theirs), r, signature_);
}

ScheduleOperation::ScheduleOperation(transport::Transport& transport, const PointToPoint& message,
                                     transport::MessageKey key)
    : Operation(Kind::point_to_point, transport::Signature{}),
      transport_(transport),
      plan_(Plan::point_to_point(message, key.index)),
      type_(message.type),
      op_(ReduceOp::sum),
      elem_size_(size_of(message.type)),
      key_(key),
      message_(message) {
  if (!message.is_send) on_success([this, peer = message.peer] { set_source(peer); });
  output_ = static_cast<std::byte*>(message.data);
  start_run();
}

// One allocation per operation, served from glibc's per-thread cache (requests of up to 1032
// bytes, here with make_shared's control block) rather than its arenas.
static_assert(sizeof(ScheduleOperation) + 16 <= 1032, "a ScheduleOperation outgrew the allocator's per-thread cache");

// The state of this run: what its steps still wait for, and their completions and scratch.
void ScheduleOperation::start_run() {
  const std::size_t n = schedule().steps.size();
  remaining_deps_.place(n);
  std::copy(plan_->deps_count.begin(), plan_->deps_count.end(), remaining_deps_.data());
  ready_.place(n);
  for (std::uint32_t index : plan_->first_ready) ready_.push_back(index);
  in_flight_.place(n);
  completions_.place(n);
  const std::size_t scratch_bytes = schedule().scratch_count * elem_size_;
  if (scratch_bytes > inline_scratch) {
    heap_scratch_ = std::make_unique_for_overwrite<std::byte[]>(scratch_bytes);
    scratch_ = heap_scratch_.get();
  } else if (scratch_bytes > 0) {
    scratch_ = inline_scratch_;
  }
}

std::byte* ScheduleOperation::address(const schedule::Region& region) const {
  std::byte* base = nullptr;
  switch (region.buffer) {
    case Buffer::input:
      base = const_cast<std::byte*>(input_);
      break;
    case Buffer::output:
      base = output_;
      break;
    case Buffer::scratch:
      base = scratch_;
      break;
  }
  return base == nullptr ? nullptr : base + region.offset * elem_size_;
}

void ScheduleOperation::start_step(std::uint32_t index) {
  const auto& step = schedule().steps[index];
  const std::size_t bytes = step.region.count * elem_size_;
  Completion* done = &completions_[index];
  const transport::MessageKey key{key_.channel, key_.seq, plan_->message_index[index], plan_->notices};
  switch (step.kind) {
    case StepKind::copy: {
      std::byte* dst = address(step.region);
      const std::byte* src = address(step.operand);
      if (dst != src && bytes > 0) core::move(dst, src, bytes);
      done->set(Completion::done);
      complete_step(index);
      return;
    }
    case StepKind::send:
      transport_.post_send(step.peer, key, address(step.region), bytes, done);
      break;
    case StepKind::recv:
      transport_.post_recv(step.peer, key, address(step.region), bytes, done);
      break;
    case StepKind::recv_reduce:
      if (!transport_.post_recv_reduce(step.peer, key, address(step.region), address(step.operand), step.region.count,
                                       type_, op_, done)) {
        try {
          if (staging_.empty()) staging_.resize(schedule().steps.size());
          staging_[index] = std::make_unique_for_overwrite<std::byte[]>(std::max<std::size_t>(bytes, 1));
        } catch (const std::bad_alloc&) {  // on the progress thread: the caller hears of it by name
          fail(Error(ErrorCode::system,
                     describe() + ": out of memory for a staging buffer of " + std::to_string(bytes) + " bytes"));
          return;
        }
        transport_.post_recv(step.peer, key, staging_[index].get(), bytes, done);
      }
      break;
  }
  // A receive of a call that runs ahead, still waiting: its sender is named this call once the
  // earliest such receive has waited notice_after (progress).
  if (plan_->notices && step.kind != StepKind::send && done->state() == Completion::posted && !notice_due_)
    notice_due_ = std::chrono::steady_clock::now() + Plan::notice_after;
  in_flight_.push_back(index);
}

void ScheduleOperation::complete_step(std::uint32_t index) {
  ++completed_;
  const Plan& plan = *plan_;
  for (std::uint32_t k = plan.dependents_begin[index]; k < plan.dependents_begin[index + 1]; ++k)
    if (--remaining_deps_[plan.dependents[k]] == 0) ready_.push_back(plan.dependents[k]);
}

void ScheduleOperation::start() {
  if (schedule().steps.empty()) return succeed();
  progress();
}

std::optional<std::chrono::microseconds> ScheduleOperation::poll_period() const {
  if (!notice_due_) return std::nullopt;
  return Plan::notice_after;
}

bool ScheduleOperation::progress() {
  if (finished()) return true;
  if (notice_due_ && std::chrono::steady_clock::now() >= *notice_due_) {  // (Plan::notices)
    notice_due_.reset();
    for (const std::uint32_t index : in_flight_) {
      const std::uint64_t bit = std::uint64_t{1} << index;  // (the plan has at most 64 steps)
      if (schedule().steps[index].kind == StepKind::send || completions_[index].state() != Completion::posted ||
          (noticed_ & bit) != 0)
        continue;
      noticed_ |= bit;
      transport_.notify_signature(schedule().steps[index].peer, key_.seq);
    }
  }
  for (bool changed = true; changed && !finished();) {
    changed = false;
    while (!ready_.empty()) {
      const std::uint32_t index = ready_.back();
      ready_.pop_back();
      start_step(index);
      changed = true;
    }
    for (std::size_t i = 0; i < in_flight_.size();) {
      const std::uint32_t index = in_flight_[i];
      const auto state = completions_[index].state();
      if (state == Completion::posted) {
        ++i;
        continue;
      }
      in_flight_[i] = in_flight_.back();
      in_flight_.pop_back();
      if (state == Completion::failed) {
        fail(Error(ErrorCode::mismatch, describe() + ": " + completions_[index].error));
        return true;
      }
      if (index == plan_->signature_recv) {
        if (auto mismatch = check_signature()) {
          fail(*mismatch);
          return true;
        }
      }
      if (!staging_.empty() && staging_[index]) {  // a staged recv_reduce: combine now
        const auto& step = schedule().steps[index];
        reduce::apply(op_, type_, address(step.region), address(step.operand), staging_[index].get(),
                      step.region.count);
        staging_[index].reset();
      }
      complete_step(index);
      changed = true;
    }
    if (completed_ == schedule().steps.size()) succeed();
  }
  return finished();
}

void ScheduleOperation::fail(const Error& error) {
  if (finished()) return;
  for (std::uint32_t index : in_flight_) transport_.cancel(&completions_[index]);
  in_flight_.clear();
  ready_.clear();
  finish_with(error);
}

std::vector<int> ScheduleOperation::waiting_for() const {
  std::vector<int> peers;
  for (std::uint32_t index : in_flight_) peers.push_back(schedule().steps[index].peer);
  std::sort(peers.begin(), peers.end());
  peers.erase(std::unique(peers.begin(), peers.end()), peers.end());
  return peers;
}

bool NativeOperation::progress() {
  if (finished()) return true;
  try {
    if (!run_->progress()) return false;
  } catch (const Error& error) {
    finish_with(error);
    return true;
  }
  succeed();
  return true;
}

void NativeOperation::fail(const Error& error) {
  if (!finished()) finish_with(error);
}

std::vector<int> NativeOperation::waiting_for() const { return finished() ? std::vector<int>{} : run_->waiting_for(); }

}  // namespace tutti::exec
