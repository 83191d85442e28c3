// Algorithm::hierarchical for allreduce: the ranks of a host reduce among themselves over the
// fast local path, only one rank per host block crosses the network, then the host shares the
// result locally. With p ranks on H hosts of L ranks each, the network carries 1/L of the data
// per rank instead of all of it.
//
//   equal ranks per host:  reduce_scatter inside the host (rank l keeps block l)
//                          allreduce of block l across hosts, among the ranks with local index l
//                          allgather inside the host
//   unequal ranks per host (local index l does not exist on every host):
//                          reduce to local index 0, allreduce among local index 0s, broadcast
//
// The steps are ordinary collectives on the intra-host and inter-host communicators, split from
// this one at the first hierarchical call (learning the topology first if nobody gave it).
#include <cstring>
#include <functional>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "comm/access.hpp"
#include "comm/comm_impl.hpp"
#include "core/copy.hpp"
#include "core/log.hpp"
#include "exec/request.hpp"
#include "reduce/reduce.hpp"

namespace tutti::comm {

namespace {

using StepOptions = std::function<Options(Collective, const Communicator&, std::size_t)>;

// A composite collective: its steps are nonblocking collectives on other communicators, started
// one after the other as each completes, then `done` runs. A native operation of this
// communicator's queue, so it keeps issue order and is progressed (and timed, and aborted) like
// any other; its steps are progressed by their own queues and by its `progress`.
//
// A failure can reach this communicator without reaching a step's: a rank waits on its host for
// the host's leader while the leader's step across hosts fails (or this rank's own connection to
// the lost host drops). So a rank waiting on a step also watches this communicator
// (`parent_failed`), and a composite that goes with a step still outstanding (it failed, or its
// caller gave up) aborts the steps' communicators, so that no step is left waiting for it or
// writing into the caller's buffers later.
class Composite final : public transport::NativeCollective {
 public:
  using Step = std::function<Request()>;
  using Watch = std::function<std::optional<transport::Failure>()>;
  Composite(std::vector<Step> steps, std::function<void()> done, CommImpl::Hierarchy step_comms, Watch parent_failed)
      : steps_(std::move(steps)),
        done_(std::move(done)),
        step_comms_(std::move(step_comms)),
        parent_failed_(std::move(parent_failed)) {}
  Composite(const Composite&) = delete;
  Composite& operator=(const Composite&) = delete;
  ~Composite() override {
    if (!current_) return;
    const auto failure = parent_failed_();
    step_comms_.abort(failure ? failure->error
                              : Error(ErrorCode::aborted, "hierarchical allreduce: the call was abandoned mid-step"));
  }
  bool progress() override {
    for (;;) {
      if (current_) {
        if (!current_->test()) return false;
        current_.reset();
      }
      if (next_ == steps_.size()) {
        if (done_) std::exchange(done_, nullptr)();
        return true;
      }
      current_ = steps_[next_++]();
    }
  }
  // Its steps complete on other communicators, whose completions do not wake this one's waiters.
  std::optional<std::chrono::microseconds> poll_period() const override { return std::chrono::microseconds(100); }
  // All of it on the calling thread, each step waited for on its own communicator (whose
  // completions wake this thread, where polling the composite would wait up to a period a step),
  // looking at this communicator every `watch_period` meanwhile: its failure passes to the
  // step's communicators, whose wait then raises it.
  void run() {
    while (next_ < steps_.size()) {
      {
        // This thread waits on the step at once: it progresses it itself (no engine hand-off).
        const CommImpl::CallerWaits intra(*Access::impl(step_comms_.intra));
        const CommImpl::CallerWaits inter(*Access::impl(step_comms_.inter));
        current_ = steps_[next_++]();
      }
      const auto since = std::chrono::steady_clock::now();
      bool passed = false;
      while (!current_->wait_for(watch_period, since)) {
        if (passed) continue;
        if (const auto failure = parent_failed_()) {
          step_comms_.abort(failure->error);
          passed = true;
        }
      }
      current_.reset();
    }
    if (done_) std::exchange(done_, nullptr)();
  }

 private:
  static constexpr std::chrono::milliseconds watch_period{10};
  std::vector<Step> steps_;
  std::function<void()> done_;
  CommImpl::Hierarchy step_comms_;
  Watch parent_failed_;
  std::size_t next_ = 0;
  std::optional<Request> current_;
};

// Equal ranks per host. A count the local size does not divide is padded to equal blocks in a
// staging buffer: the padding is reduced like data and dropped, which keeps every step a plain
// equal-block collective.
std::vector<Composite::Step> by_blocks(Communicator& intra, Communicator& inter, const Call& call, ReduceOp op,
                                       const StepOptions& options, std::shared_ptr<std::byte[]>& staging) {
  const std::size_t elem = size_of(call.type), local = static_cast<std::size_t>(intra.size()), n = call.count;
  const std::size_t block = n / local + (n % local != 0 ? 1 : 0);
  // The padded size may exceed a count that validate() accepted: checked like any other size.
  checked_bytes("allreduce (hierarchical)", checked_product("allreduce (hierarchical)", block, local, "padded count"),
                call.type);
  const auto* send = static_cast<const std::byte*>(call.send);
  auto* work = static_cast<std::byte*>(call.recv);
  if (block * local != n) {
    staging = std::make_shared<std::byte[]>(block * local * elem);  // zeroed padding
    core::copy(staging.get(), send, n * elem);
    send = work = staging.get();
  }
  // Out of place, send → recv's block; in place, the NCCL form (send == recv + rank * block).
  std::byte* mine = work + static_cast<std::size_t>(intra.rank()) * block * elem;
  const DataType type = call.type;
  return {
      [=]() mutable {
        return intra.ireduce_scatter(send, mine, block, type, op,
                                     options(Collective::reduce_scatter, intra, block * local * elem));
      },
      [=]() mutable {
        return inter.iallreduce(mine, mine, block, type, op, options(Collective::allreduce, inter, block * elem));
      },
      [=]() mutable {
        return intra.iallgather(mine, work, block, type, options(Collective::allgather, intra, block * local * elem));
      },
  };
}

// Unequal ranks per host: the inter-host communicator of local index 0 holds one rank per host
// (every host has a local index 0), so the hosts' leaders stand for them.
std::vector<Composite::Step> by_leaders(Communicator& intra, Communicator& inter, const Call& call, ReduceOp op,
                                        const StepOptions& options) {
  const std::size_t bytes = call.count * size_of(call.type), count = call.count;
  const DataType type = call.type;
  const void* send = call.send;
  void* recv = call.recv;
  return {
      [=]() mutable {
        return intra.ireduce(send, recv, count, type, op, 0, options(Collective::reduce, intra, bytes));
      },
      [=]() mutable {
        return intra.rank() == 0
                   ? inter.iallreduce(recv, recv, count, type, op, options(Collective::allreduce, inter, bytes))
                   : Request();
      },
      [=]() mutable { return intra.ibroadcast(recv, count, type, 0, options(Collective::broadcast, intra, bytes)); },
  };
}

// The communicators of my host and of my local index across hosts.
CommImpl::Hierarchy split_hierarchy(CommImpl& comm) {
  const int rank = comm.rank();
  const int host = comm.topology().host_index(rank), local = comm.topology().local_index(rank);
  Communicator intra = comm.split(host, rank);
  Communicator inter = comm.split(local, rank);
  return CommImpl::Hierarchy{std::move(intra), std::move(inter)};
}

}  // namespace

void CommImpl::Hierarchy::abort(const Error& error) const noexcept {
  for (const Communicator* comm : {&intra, &inter}) try {
      Access::impl(*comm)->abort_transport(error);
    } catch (...) {  // failed or gone already: nothing waits on it
    }
}

void set_host_for_testing(Communicator& comm, std::string host) {
  if (Access::impl(comm) == nullptr)
    throw Error(ErrorCode::invalid_argument, "set_host_for_testing: the communicator is empty");
  Access::impl(comm)->set_host_override(std::move(host));
}

const Topology& CommImpl::topology() {
  if (!topology_) {
    const std::uint64_t mine = hash_host(host_override_.empty() ? topology_host_name() : host_override_);
    std::vector<std::uint64_t> all(static_cast<std::size_t>(size_));
    Call call;
    call.collective = Collective::allgather;
    call.send = &mine;
    call.recv = all.data();
    call.count = 1;
    call.type = DataType::u64;
    start(call, true).wait();
    topology_.emplace(std::move(all));
    memo_.valid = false;  // a choice made before knew no hosts
  }
  return *topology_;
}

CommImpl::Hierarchy& CommImpl::caller_hierarchy() {
  if (!caller_hierarchy_) caller_hierarchy_ = split_hierarchy(*this);
  return *caller_hierarchy_;
}

CommImpl::Hierarchy& CommImpl::hierarchy() {
  if (!hierarchy_) {
    hierarchy_ = split_hierarchy(*this);
    if (core::log_enabled(core::LogLevel::info))
      core::log(core::LogLevel::info, rank_,
                "hierarchical: " + std::to_string(topology().host_count()) + " hosts, " +
                    std::to_string(hierarchy_->intra.size()) + " ranks on mine" +
                    (topology().uniform() ? ", equal on every host: by blocks" : ", unequal: via host leaders"));
  }
  return *hierarchy_;
}

// A native operation of this communicator's queue whose steps are nonblocking collectives on the
// intra- and inter-host communicators (made, with the topology, at the first hierarchical call).
Request CommImpl::start_hierarchical(const Call& call, bool blocking) {
  Hierarchy& h = hierarchy();
  const ReduceOp op = call.op.value_or(ReduceOp::sum);
  const auto timeout = timeout_of(call);
  const StepOptions options = [timeout](Collective collective, const Communicator& comm, std::size_t bytes) {
    const CommImpl& impl = *Access::impl(comm);
    const choice::ChoiceContext context{impl.transport_kind(), impl.transport_name(), comm.size(),
                                        impl.direct_serves(collective), impl.link_cost()};
    return Options{choice::step_algorithm(collective, context, bytes), timeout};
  };
  const ReduceOp step_op = op == ReduceOp::avg ? ReduceOp::sum : op;  // avg: one division, at the end
  std::shared_ptr<std::byte[]> staging;
  std::vector<Composite::Step> steps = topology().uniform()
                                           ? by_blocks(h.intra, h.inter, call, step_op, options, staging)
                                           : by_leaders(h.intra, h.inter, call, step_op, options);
  const std::size_t count = call.count;
  const DataType type = call.type;
  void* recv = call.recv;
  const int p = size_;
  auto finish = [=] {
    if (staging && count > 0) core::copy(recv, staging.get(), count * size_of(type));
    if (op == ReduceOp::avg && count > 0) reduce::divide(type, recv, count, p);
  };
  auto parent_failed = [queue = std::weak_ptr(queue_)]() -> std::optional<transport::Failure> {
    const auto alive = queue.lock();  // none: the communicator is being destroyed
    return alive ? alive->transport().aborted() : std::nullopt;
  };
  auto run = std::make_shared<Composite>(std::move(steps), std::move(finish), h, std::move(parent_failed));
  const transport::Signature signature = next_signature(call, Algorithm::hierarchical);
  if (blocking && queue_->announce_when_idle(signature)) {  // nothing outstanding: no operation
    try {
      run->run();
    } catch (const Error& error) {  // a step failed on its communicator: this one fails with it
      queue_->transport().abort(error, signature.seq);
      queue_->mark_reported();
      throw;
    }
    return Request();
  }
  auto operation = exec::Operation::native(signature, run);
  operation->timeout = timeout;
  return submit_collective(std::move(operation), blocking);
}

}  // namespace tutti::comm
