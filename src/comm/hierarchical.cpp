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
#include <memory>

#include "comm/comm_impl.hpp"
#include "core/log.hpp"
#include "reduce/reduce.hpp"

namespace tutti::detail {

namespace {

struct Step {
  DataType type;
  ReduceOp op;  // avg reduces as sum; the division is done once, at the end
  std::chrono::milliseconds timeout;
  Options options(Collective collective, const Communicator& comm, std::size_t bytes) const {
    return {step_algorithm(collective, comm.size(), bytes), timeout};
  }
};

// Equal ranks per host. A count the local size does not divide is padded to equal blocks in a
// staging buffer: the padding is reduced like data and dropped, which keeps every step a plain
// equal-block collective.
void allreduce_by_blocks(Communicator& intra, Communicator& inter, const Call& call, const Step& step) {
  const std::size_t elem = size_of(call.type), local = static_cast<std::size_t>(intra.size()), n = call.count;
  const std::size_t block = n / local + (n % local != 0 ? 1 : 0);
  // The padded size may exceed a count that validate() accepted: checked like any other size.
  checked_bytes("allreduce (hierarchical)", checked_product("allreduce (hierarchical)", block, local, "padded count"),
                call.type);
  const auto* send = static_cast<const std::byte*>(call.send);
  auto* work = static_cast<std::byte*>(call.recv);
  std::unique_ptr<std::byte[]> staging;
  if (block * local != n) {
    staging = std::make_unique<std::byte[]>(block * local * elem);  // zeroed padding
    std::memcpy(staging.get(), send, n * elem);
    send = work = staging.get();
  }
  // Out of place, send → recv's block; in place, the NCCL form (send == recv + rank * block).
  std::byte* mine = work + static_cast<std::size_t>(intra.rank()) * block * elem;
  intra.reduce_scatter(send, mine, block, call.type, step.op,
                       step.options(Collective::reduce_scatter, intra, block * local * elem));
  inter.allreduce(mine, mine, block, call.type, step.op, step.options(Collective::allreduce, inter, block * elem));
  intra.allgather(mine, work, block, call.type, step.options(Collective::allgather, intra, block * local * elem));
  if (staging && n > 0) std::memcpy(call.recv, staging.get(), n * elem);
}

// Unequal ranks per host: the inter-host communicator of local index 0 holds one rank per host
// (every host has a local index 0), so the hosts' leaders stand for them.
void allreduce_by_leaders(Communicator& intra, Communicator& inter, const Call& call, const Step& step) {
  const std::size_t bytes = call.count * size_of(call.type);
  intra.reduce(call.send, call.recv, call.count, call.type, step.op, 0, step.options(Collective::reduce, intra, bytes));
  if (intra.rank() == 0)
    inter.allreduce(call.recv, call.recv, call.count, call.type, step.op,
                    step.options(Collective::allreduce, inter, bytes));
  intra.broadcast(call.recv, call.count, call.type, 0, step.options(Collective::broadcast, intra, bytes));
}

}  // namespace

void set_host_for_testing(Communicator& comm, std::string host) {
  if (comm.impl() == nullptr)
    throw Error(ErrorCode::invalid_argument, "set_host_for_testing: the communicator is empty");
  comm.impl()->set_host_override(std::move(host));
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
  }
  return *topology_;
}

CommImpl::Hierarchy& CommImpl::hierarchy() {
  if (!hierarchy_) {
    const int host = topology().host_index(rank_), local = topology().local_index(rank_);
    Communicator intra = split(host, rank_);
    Communicator inter = split(local, rank_);
    hierarchy_ = Hierarchy{std::move(intra), std::move(inter)};
    if (core::log_enabled(core::LogLevel::info))
      core::log(core::LogLevel::info, rank_,
                "hierarchical: " + std::to_string(topology().host_count()) + " hosts, " +
                    std::to_string(hierarchy_->intra.size()) + " ranks on mine" +
                    (topology().uniform() ? ", equal on every host: by blocks" : ", unequal: via host leaders"));
  }
  return *hierarchy_;
}

// Runs on the caller's thread and returns a completed Request, like start_mpi: the steps are
// blocking collectives on other communicators, which this communicator's queue cannot progress.
// So iallreduce with hierarchical (forced or chosen) is blocking: it does not overlap compute.
Request CommImpl::start_hierarchical(const Call& call) {
  queue_->wait_all();  // issue order: every earlier operation completes first
  queue_->next_seq();  // keeps the sequence numbers of all ranks in step
  Hierarchy& h = hierarchy();
  const ReduceOp op = call.op.value_or(ReduceOp::sum);
  const Step step{call.type, op == ReduceOp::avg ? ReduceOp::sum : op,
                  call.options.timeout.count() > 0 ? call.options.timeout : default_timeout_};
  if (topology().uniform())
    allreduce_by_blocks(h.intra, h.inter, call, step);
  else
    allreduce_by_leaders(h.intra, h.inter, call, step);
  if (op == ReduceOp::avg && call.count > 0) reduce::divide(call.type, call.recv, call.count, size_);
  return Request();
}

}  // namespace tutti::detail
