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

std::unique_ptr<Operation> Operation::collective(transport::Transport& transport, schedule::Schedule schedule,
                                                 Buffers buffers, DataType type, ReduceOp op,
                                                 transport::Signature signature) {
  return std::make_unique<ScheduleOperation>(transport, std::move(schedule), buffers, type, op, signature);
}

std::string PointToPoint::describe() const {
  return std::string(is_send ? "send" : "recv") + "(count=" + std::to_string(count) + ", " +
         std::string(to_string(type)) + (is_send ? ", to rank " : ", from rank ") +
         (peer == any_peer ? std::string("any") : std::to_string(peer)) + ", tag " + std::to_string(tag) + ")";
}

std::unique_ptr<Operation> Operation::point_to_point(transport::Transport& transport, const PointToPoint& message,
                                                     transport::MessageKey key) {
  return std::make_unique<ScheduleOperation>(transport, message, key);
}

std::unique_ptr<Operation> Operation::native(transport::Signature signature,
                                             std::shared_ptr<transport::NativeCollective> run) {
  return std::make_unique<NativeOperation>(signature, std::move(run));
}

ScheduleOperation::ScheduleOperation(transport::Transport& transport, schedule::Schedule schedule, Buffers buffers,
                                     DataType type, ReduceOp op, transport::Signature signature)
    : Operation(Kind::collective, signature),
      transport_(transport),
      schedule_(std::move(schedule)),
      type_(type),
      op_(op),
      elem_size_(size_of(type)) {
  input_ = static_cast<const std::byte*>(buffers.input);
  output_ = static_cast<std::byte*>(buffers.output);
  // The k-th message between two ranks in list order is matched by index k on both sides.
  keys_.resize(schedule_.steps.size());
  std::map<int, std::uint32_t> sends, recvs;
  for (std::size_t i = 0; i < schedule_.steps.size(); ++i) {
    const auto& step = schedule_.steps[i];
    if (step.kind == StepKind::copy) continue;
    auto& counter = step.kind == StepKind::send ? sends[step.peer] : recvs[step.peer];
    keys_[i] = transport::MessageKey{transport::Channel::collective, signature_.seq, counter++};
  }
  if (!transport_.detects_every_mismatch() && transport_.size() > 1 && !messages_carry_signatures())
    add_signature_exchange();
  build_graph();
  if (signature_recv_ != ~std::uint32_t{0}) {
    const transport::WireSignature mine = transport::to_wire(signature_);
    std::memcpy(address(schedule_.steps[signature_recv_ - 1].region), &mine, sizeof(mine));
  }
}

namespace {
constexpr std::uint32_t signature_index = ~std::uint32_t{0};  // reserved message index
}

// Sends this rank's signature to the next rank and receives the previous one's: if all ranks do
// not agree, some neighbours disagree, and the one that sees it aborts the communicator.
void ScheduleOperation::add_signature_exchange() {
  static_assert(sizeof(transport::WireSignature) % 8 == 0);
  const std::size_t elems = sizeof(transport::WireSignature) / elem_size_;
  const std::size_t base = schedule_.scratch_count;
  schedule_.scratch_count += 2 * elems;
  const int p = transport_.size(), r = transport_.rank();
  schedule_.send((r + 1) % p, schedule::Region{Buffer::scratch, base, elems});
  signature_recv_ = schedule_.recv((r + p - 1) % p, schedule::Region{Buffer::scratch, base + elems, elems});
  const transport::MessageKey key{transport::Channel::collective, signature_.seq, signature_index};
  keys_.push_back(key);
  keys_.push_back(key);
}

// Whether the call's own messages do the signature ring's work: the transport checks the
// sender's signature on every message it delivers, and every rank's schedule of this call sends to
// rank + 1 and receives from rank - 1 with nothing before (schedule::opens_with_ring_exchange,
// decided from the signature alone, so that no rank waits for a signature message another does
// not send). Where two ranks disagree, each one's first message still carries its signature to
// the next rank, which aborts all on the difference, as the ring's message would.
bool ScheduleOperation::messages_carry_signatures() const {
  return transport_.checks_message_signatures() &&
         schedule::opens_with_ring_exchange(signature_.algorithm, signature_.collective, signature_.count,
                                            transport_.size());
}

std::optional<Error> ScheduleOperation::check_signature() const {
  transport::WireSignature theirs;
  std::memcpy(&theirs, address(schedule_.steps[signature_recv_].region), sizeof(theirs));
  if (theirs == transport::to_wire(signature_)) return std::nullopt;
  const int p = transport_.size(), r = transport_.rank();
  return transport::collective_mismatch((r + p - 1) % p, transport::from_wire(theirs), r, signature_);
}

ScheduleOperation::ScheduleOperation(transport::Transport& transport, const PointToPoint& message,
                                     transport::MessageKey key)
    : Operation(Kind::point_to_point, transport::Signature{}),
      transport_(transport),
      type_(message.type),
      op_(ReduceOp::sum),
      elem_size_(size_of(message.type)),
      message_(message) {
  const schedule::Region region{Buffer::output, 0, message.count};
  if (message.is_send) {
    schedule_.send(message.peer, region);
  } else {
    schedule_.recv(message.peer, region);
    on_success([this, peer = message.peer] { set_source(peer); });
  }
  output_ = static_cast<std::byte*>(message.data);
  keys_ = {key};
  build_graph();
}

void ScheduleOperation::build_graph() {
  const std::size_t n = schedule_.steps.size();
  remaining_deps_.assign(n, 0);
  dependents_begin_.assign(n + 1, 0);
  for (const auto& step : schedule_.steps)
    for (auto d : step.deps) ++dependents_begin_[d + 1];
  for (std::size_t i = 0; i < n; ++i) dependents_begin_[i + 1] += dependents_begin_[i];
  dependents_.resize(dependents_begin_[n]);
  std::vector<std::uint32_t> fill(dependents_begin_.begin(), dependents_begin_.end() - 1);
  for (std::uint32_t i = 0; i < n; ++i) {
    remaining_deps_[i] = static_cast<std::uint32_t>(schedule_.steps[i].deps.size());
    for (auto d : schedule_.steps[i].deps) dependents_[fill[d]++] = i;
    if (remaining_deps_[i] == 0) ready_.push_back(i);
  }
  std::reverse(ready_.begin(), ready_.end());  // pop_back() then starts steps in list order
  completions_ = std::make_unique<Completion[]>(n);
  staging_.resize(n);
  if (schedule_.scratch_count > 0)
    scratch_ = std::make_unique_for_overwrite<std::byte[]>(schedule_.scratch_count * elem_size_);
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
      base = scratch_.get();
      break;
  }
  return base == nullptr ? nullptr : base + region.offset * elem_size_;
}

void ScheduleOperation::start_step(std::uint32_t index) {
  const auto& step = schedule_.steps[index];
  const std::size_t bytes = step.region.count * elem_size_;
  Completion* done = &completions_[index];
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
      transport_.post_send(step.peer, keys_[index], address(step.region), bytes, done);
      break;
    case StepKind::recv:
      transport_.post_recv(step.peer, keys_[index], address(step.region), bytes, done);
      break;
    case StepKind::recv_reduce:
      if (!transport_.post_recv_reduce(step.peer, keys_[index], address(step.region), address(step.operand),
                                       step.region.count, type_, op_, done)) {
        try {
          staging_[index] = std::make_unique_for_overwrite<std::byte[]>(std::max<std::size_t>(bytes, 1));
        } catch (const std::bad_alloc&) {  // on the progress thread: the caller hears of it by name
          fail(Error(ErrorCode::system,
                     describe() + ": out of memory for a staging buffer of " + std::to_string(bytes) + " bytes"));
          return;
        }
        transport_.post_recv(step.peer, keys_[index], staging_[index].get(), bytes, done);
      }
      break;
  }
  in_flight_.push_back(index);
}

void ScheduleOperation::complete_step(std::uint32_t index) {
  ++completed_;
  for (std::uint32_t k = dependents_begin_[index]; k < dependents_begin_[index + 1]; ++k)
    if (--remaining_deps_[dependents_[k]] == 0) ready_.push_back(dependents_[k]);
}

void ScheduleOperation::start() {
  if (schedule_.steps.empty()) return succeed();
  progress();
}

bool ScheduleOperation::progress() {
  if (finished()) return true;
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
      if (index == signature_recv_) {
        if (auto mismatch = check_signature()) {
          fail(*mismatch);
          return true;
        }
      }
      if (staging_[index]) {  // a staged recv_reduce: combine now
        const auto& step = schedule_.steps[index];
        reduce::apply(op_, type_, address(step.region), address(step.operand), staging_[index].get(),
                      step.region.count);
        staging_[index].reset();
      }
      complete_step(index);
      changed = true;
    }
    if (completed_ == schedule_.steps.size()) succeed();
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
  for (std::uint32_t index : in_flight_) peers.push_back(schedule_.steps[index].peer);
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
