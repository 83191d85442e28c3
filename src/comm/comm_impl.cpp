#include "comm/comm_impl.hpp"
#include "comm/access.hpp"

#include "exec/matched_recv.hpp"

#include <algorithm>
#include <array>
#include <cstring>
#include <new>
#include <numeric>

#include "comm/tuning.hpp"
#include "core/copy.hpp"
#include "core/env.hpp"
#include "exec/matched_recv.hpp"
#include "exec/request.hpp"
#include "reduce/reduce.hpp"
#include "transport/in_place.hpp"

namespace tutti::comm {

CommImpl::CommImpl(std::unique_ptr<transport::Transport> transport)
    : rank_(transport->rank()), size_(transport->size()), default_timeout_(core::default_timeout()) {
  queue_ = std::make_shared<exec::OperationQueue>(std::move(transport));
}

namespace {

// Bytes the algorithm choice looks at: the same on every rank of the call.
std::size_t choice_bytes(const Call& call, int p) {
  const std::size_t elem = size_of(call.type);
  switch (call.collective) {
    case Collective::allreduce:
    case Collective::reduce:
    case Collective::broadcast:
      return call.count * elem;
    case Collective::allgatherv:
      return std::accumulate(call.counts.begin(), call.counts.end(), std::size_t{0}) * elem;
    case Collective::alltoallv:
    case Collective::barrier:
      return 0;
    default:
      return static_cast<std::size_t>(p) * call.count * elem;
  }
}

bool has_result(const Call& call, int rank) {
  switch (call.collective) {
    case Collective::allreduce:
    case Collective::reduce_scatter:
      return true;
    case Collective::reduce:
      return rank == call.root;
    default:
      return false;
  }
}

}  // namespace

bool CommImpl::direct_serves(Collective collective) const {
  return queue_->transport().serves_natively(Algorithm::direct, collective);
}

int CommImpl::host_blocks() const {
  return topology_ && choice::within_host(transport_kind()) ? topology_->blocked_ranks_per_host() : 0;
}

Algorithm CommImpl::chosen_algorithm(Collective collective, Algorithm requested, std::size_t bytes) const {
  const Algorithm asked = choice::requested_algorithm(collective, requested);
  if (collective == Collective::allreduce && asked == Algorithm::hierarchical) return Algorithm::hierarchical;
  const ChoiceMemo& m = memo_;
  if (m.valid && m.collective == collective && m.requested == requested && m.bytes == bytes &&
      m.version == choice::active_version())
    return m.algorithm;
  // Ranks in blocks on hosts over TCP (init() learned the topology): the cost model prices the
  // hosts' links and weighs hierarchical allreduce. Other layouts that span hosts with several
  // ranks on one: hierarchical allreduce from hierarchical_min_bytes. The same on every rank.
  const int blocks = host_blocks();
  Algorithm algorithm = Algorithm::automatic;
  if (collective == Collective::allreduce && asked == Algorithm::automatic && topology_ && blocks == 0 &&
      prefers_hierarchical(*topology_, bytes)) {
    algorithm = Algorithm::hierarchical;
  } else {
    const choice::ChoiceContext context{transport_kind(),          transport_name(), size_,
                                        direct_serves(collective), link_cost_,       blocks};
    algorithm = choice::choose_algorithm(collective, requested, context, bytes);
  }
  memo_ = {collective, requested, bytes, choice::active_version(), algorithm, true};
  return algorithm;
}

Request CommImpl::start(const Call& call, bool blocking) {
  try {
    return start_call(call, blocking);
  } catch (const std::bad_alloc&) {
    // Working buffers (a snapshot of an in-place input, a schedule's scratch) are sized by the
    // caller's count: running out of memory for them is an Error that names the size.
    const std::size_t bytes = call.count * size_of(call.type);
    throw Error(ErrorCode::system, std::string(to_string(call.collective)) + " (rank " + std::to_string(rank_) +
                                       "): out of memory for the working buffers of a call of " +
                                       std::to_string(call.count) + " elements of " +
                                       std::string(to_string(call.type)) + " (" + std::to_string(bytes) +
                                       " bytes each)");
  }
}

Request CommImpl::start_call(const Call& call, bool blocking) {
  queue_->check_usable(true);
  std::optional<Extents> validated;
  if (blocking && run_now(call, validated)) return Request();
  const Extents extents = validated ? *validated : validate(call, rank_, size_);
  const Algorithm requested = choice::requested_algorithm(call.collective, call.options.algorithm);
  const Algorithm algorithm =
      requested == Algorithm::direct || requested == Algorithm::mpi
          ? requested
          : chosen_algorithm(call.collective, call.options.algorithm, choice_bytes(call, size_));
  if (algorithm == Algorithm::hierarchical) return start_hierarchical(call, blocking);
  if (algorithm == Algorithm::direct || algorithm == Algorithm::mpi) return start_native(call, algorithm, blocking);
  return start_schedule(call, algorithm, extents, blocking);
}

// The short way of a blocking call: a plainly valid one (anything else goes the general way,
// which names what is wrong) that resolves to a native algorithm the transport can run at once
// with nothing outstanding (the small direct collectives over shm). What the general path would
// do, without its operation objects.
bool CommImpl::run_now(const Call& call, std::optional<Extents>& validated) {
  if (transport_kind() != transport::Kind::shm) return false;  // the one transport that runs calls at once
  // (An alltoallv's and an allgatherv's counts are checked in full: that is the general way's first
  // step too, which then takes `validated` instead of checking them again.)
  if (call.collective == Collective::alltoallv || call.collective == Collective::allgatherv)
    validated = validate(call, rank_, size_);
  else if (!plainly_valid(call, rank_, size_))
    return false;
  const Algorithm requested = choice::requested_algorithm(call.collective, call.options.algorithm);
  if (requested != Algorithm::automatic && requested != Algorithm::direct) return false;
  const Algorithm algorithm = requested == Algorithm::direct
                                  ? requested
                                  : chosen_algorithm(call.collective, requested, choice_bytes(call, size_));
  if (algorithm != Algorithm::direct) return false;
  transport::Signature signature = transport::Signature::of(call, algorithm);
  return queue_->run_now(algorithm, call, signature, timeout_of(call));
}

// Maps the user's buffers onto the schedule's input and output, handling the in-place forms the
// schedules do not run natively (see schedule.hpp) with a snapshot of the input or a staging
// output, which `op` then owns.
exec::Operation::Buffers CommImpl::map_buffers(const Call& call, const Extents& extents, Staging& staging) const {
  const std::size_t elem = size_of(call.type);
  const transport::InPlace in_place = transport::map_in_place(call, rank_);
  exec::Operation::Buffers buffers{in_place.input, call.recv};
  switch (call.collective) {
    case Collective::broadcast:
      buffers.input = nullptr;
      break;
    case Collective::reduce:
    case Collective::gather:
      if (rank_ != call.root) buffers.output = nullptr;
      break;
    case Collective::scatter:
      if (rank_ != call.root) buffers.input = nullptr;
      break;
    default:
      break;
  }
  if (in_place.snapshot_input && extents.send > 0) {
    staging.input = std::make_unique_for_overwrite<std::byte[]>(extents.send * elem);
    core::copy(staging.input.get(), call.send, extents.send * elem);
    buffers.input = staging.input.get();
  }
  if (in_place.stage_output) {
    staging.output = std::make_unique_for_overwrite<std::byte[]>(extents.recv * elem);
    buffers.output = staging.output.get();
  }
  return buffers;
}

std::shared_ptr<const exec::Plan> CommImpl::plan_for(const Call& call, Algorithm algorithm,
                                                     const transport::Signature& signature, bool run_ahead) {
  schedule::Params params = schedule::Params::of(call, rank_, size_);
  params.ranks_per_host = host_blocks();  // the same for the communicator's life: not in the key
  if (schedule::pipelined_chain(algorithm, call.collective)) {
    // A chain's chunks follow the link's costs, as the cost model priced them.
    const auto cost = choice::cost_for(queue_->transport().name(), queue_->transport().kind(), link_cost_);
    schedule::fit_chunks(params, algorithm, cost.alpha, cost.beta);
  }
  auto make = [&] {
    return exec::Plan::collective(queue_->transport(), schedule::make(algorithm, params), signature, size_of(call.type),
                                  run_ahead);
  };
  if (!call.counts.empty() || !call.recv_counts.empty()) return make();
  const PlanKey key{algorithm, call.collective, call.count,        size_of(call.type),
                    call.root, run_ahead,       params.chunk_bytes};
  for (const CachedPlan& cached : plans_)
    if (cached.plan && cached.key == key) return cached.plan;
  auto plan = make();
  plans_[next_plan_] = {key, plan};
  next_plan_ = (next_plan_ + 1) % kPlans;
  return plan;
}

Request CommImpl::start_schedule(const Call& call, Algorithm algorithm, const Extents& extents, bool blocking) {
  const transport::Signature upcoming = transport::Signature::of(call, algorithm);
  const std::size_t weight = exec::Plan::run_ahead_weight(queue_->transport(), upcoming, size_of(call.type));
  std::shared_ptr<const exec::Plan> plan = plan_for(call, algorithm, upcoming, run_ahead_.admits(weight));
  Staging staging;
  const exec::Operation::Buffers buffers = map_buffers(call, extents, staging);
  const transport::Signature signature = next_signature(call, algorithm);
  run_ahead_.record(*plan, weight);  // with the sequence number it takes
  auto op = exec::Operation::collective(queue_->transport(), std::move(plan), buffers, call.type,
                                        call.op.value_or(ReduceOp::sum), signature);
  op->timeout = timeout_of(call);
  const bool average = call.op == ReduceOp::avg && has_result(call, rank_);
  if (average || staging.output) {
    auto* result = static_cast<std::byte*>(buffers.output);
    auto* recv = static_cast<std::byte*>(call.recv);
    const std::size_t count = extents.recv;
    const DataType type = call.type;
    const int p = size_;
    op->on_success([=] {
      if (average) reduce::divide(type, result, count, p);
      if (result != recv && count > 0) core::copy(recv, result, count * size_of(type));
    });
  }
  if (staging.input) op->own(std::move(staging.input));
  if (staging.output) op->own(std::move(staging.output));
  return submit_collective(std::move(op), blocking);
}

Request CommImpl::submit(std::shared_ptr<exec::Operation> op, bool blocking) {
  // A caller that waits on the request at once (CallerWaits) progresses it itself, as a blocking
  // call's does: waking the progress engine would only add a thread hand-off.
  auto shared = queue_->submit(std::move(op), blocking || caller_waits_);
  return Request(std::make_shared<exec::RequestState>(queue_, std::move(shared)));
}

// A blocking collective's caller waits at once (Communicator's blocking forms): it waits here,
// and the empty Request it gets back returns from wait() at once; no handle is made for it.
Request CommImpl::submit_collective(std::shared_ptr<exec::Operation> op, bool blocking) {
  if (!blocking) return submit(std::move(op), blocking);
  const auto shared = queue_->submit(std::move(op), blocking);
  queue_->wait(*shared, std::nullopt);
  return Request();
}

std::chrono::milliseconds CommImpl::timeout_of(const Call& call) const {
  return call.options.timeout.count() > 0 ? call.options.timeout : default_timeout_;
}

// The signature of the call about to be submitted: takes the communicator's next sequence number.
transport::Signature CommImpl::next_signature(const Call& call, Algorithm algorithm) {
  transport::Signature signature = transport::Signature::of(call, algorithm);
  signature.seq = queue_->next_seq();
  return signature;
}

// Algorithm::direct (shared memory) and Algorithm::mpi (MPI's own collectives): collectives the
// transport runs itself, as native operations of the queue: one starts once every earlier
// collective finished and is progressed, timed and aborted like any other (by the caller or the
// engine). A blocking call with nothing else in flight runs right here: no operation object.
Request CommImpl::start_native(const Call& call, Algorithm algorithm, bool blocking) {
  transport::Transport& transport = queue_->transport();
  if (!transport.serves_natively(algorithm, call.collective)) {
    const std::string what =
        std::string(to_string(call.collective)) + ": Algorithm::" + std::string(to_string(algorithm)) + " ";
    if (algorithm == Algorithm::mpi)
      throw Error(ErrorCode::unsupported, what +
                                              "needs a communicator over MPI (tutti::from_mpi, or init() under "
                                              "mpirun, with Tutti built with MPI)");
    if (transport.kind() != transport::Kind::shm)
      throw Error(ErrorCode::unsupported, what + "needs the shared-memory transport (processes on one host)");
    throw Error(ErrorCode::unsupported, what + "serves every collective but alltoallv");
  }
  const auto timeout = timeout_of(call);
  std::unique_ptr<transport::NativeCollective> run = transport.start_native(algorithm, call, timeout);
  const transport::Signature signature = next_signature(call, algorithm);
  run->bind(signature);
  if (blocking && queue_->announce_when_idle(signature)) {
    try {
      transport::finish(*run, transport, signature, timeout);
    } catch (const Error&) {
      queue_->mark_reported();
      throw;
    }
    return Request();
  }
  auto op = exec::Operation::native(signature, std::move(run));
  op->timeout = timeout;
  return submit_collective(std::move(op), blocking);
}

namespace {

exec::PointToPoint message_of(bool is_send, const void* data, std::size_t count, DataType type, int peer, int tag,
                              int size) {
  const char* name = is_send ? "send" : "recv";
  if (size <= 0) throw Error(ErrorCode::invalid_argument, std::string(name) + ": the communicator is empty");
  const bool any = !is_send && peer == any_source;
  validate_point_to_point(is_send, data, count, type, any ? 0 : peer, tag, size);
  return {.is_send = is_send,
          .data = const_cast<void*>(data),
          .count = count,
          .type = type,
          .peer = any ? exec::PointToPoint::any_peer : peer,
          .tag = tag};
}

}  // namespace

Request CommImpl::start_point_to_point(bool is_send, const void* data, std::size_t count, DataType type, int peer,
                                       int tag, bool blocking) {
  const exec::PointToPoint message = message_of(is_send, data, count, type, peer, tag, size_);
  queue_->check_usable(false);
  return start_message(message, blocking);
}

Request CommImpl::start_message(const exec::PointToPoint& message, bool blocking) {
  std::shared_ptr<exec::Operation> op;
  if (message.is_send) {
    op =
        exec::Operation::point_to_point(queue_->transport(), message, queue_->next_send_key(message.peer, message.tag));
  } else if (auto key = message.peer == exec::PointToPoint::any_peer
                            ? std::nullopt
                            : queue_->take_direct_recv_key(message.peer, message.tag)) {
    op = exec::Operation::point_to_point(queue_->transport(), message, *key);
  } else {
    op = queue_->make_matched_recv(message);
  }
  op->timeout = default_timeout_;
  return submit(std::move(op), blocking);
}

int CommImpl::run_point_to_point(bool is_send, const void* data, std::size_t count, DataType type, int peer, int tag) {
  const exec::PointToPoint message = message_of(is_send, data, count, type, peer, tag, size_);
  queue_->check_usable(false);
  if (queue_->run_messages({&message, 1}, default_timeout_)) return is_send ? -1 : message.peer;
  Request request = start_message(message, true);
  request.wait();
  return request.source();
}

int CommImpl::sendrecv(const void* send, std::size_t send_count, int dest, void* recv, std::size_t recv_count,
                       int source, DataType type, int send_tag, int recv_tag) {
  const std::array<exec::PointToPoint, 2> messages{message_of(true, send, send_count, type, dest, send_tag, size_),
                                                   message_of(false, recv, recv_count, type, source, recv_tag, size_)};
  const auto* s = static_cast<const std::byte*>(send);
  const auto* r = static_cast<const std::byte*>(recv);
  if (messages[0].bytes() > 0 && messages[1].bytes() > 0 && s < r + messages[1].bytes() && r < s + messages[0].bytes())
    throw Error(ErrorCode::invalid_argument, "sendrecv: the send and receive buffers overlap");
  queue_->check_usable(false);
  if (queue_->run_messages(messages, default_timeout_)) return messages[1].peer;
  // A receive through the matcher (from any source, or behind one): two operations.
  Request received = start_message(messages[1], true);
  Request sent = start_message(messages[0], true);
  sent.wait();
  received.wait();
  return received.source();
}

Communicator CommImpl::split(int color, int key) {
  const int mine[2] = {color, key};
  std::vector<int> all(2 * static_cast<std::size_t>(size_));
  Call call;
  call.collective = Collective::allgather;
  call.send = mine;
  call.recv = all.data();
  call.count = 2;
  call.type = DataType::i32;
  start(call, true).wait();
  const std::uint64_t split_seq = queue_->next_seq();  // the same on every rank: identifies this split
  if (color < 0) return Communicator();
  std::vector<int> ranks;
  for (int r = 0; r < size_; ++r)
    if (all[2 * static_cast<std::size_t>(r)] == color) ranks.push_back(r);
  std::stable_sort(ranks.begin(), ranks.end(), [&](int a, int b) {
    return all[2 * static_cast<std::size_t>(a) + 1] < all[2 * static_cast<std::size_t>(b) + 1];
  });
  const int new_rank = static_cast<int>(std::find(ranks.begin(), ranks.end(), rank_) - ranks.begin());
  std::uint64_t id = queue_->transport().id();
  for (std::uint64_t part : {split_seq, static_cast<std::uint64_t>(static_cast<std::uint32_t>(color))})
    id = (id ^ (part + 0x9e3779b97f4a7c15ull + (id << 6) + (id >> 2))) * 0xff51afd7ed558ccdull;
  auto child = std::make_shared<CommImpl>(queue_->transport().split(id, ranks, new_rank));
  child->host_override_ = host_override_;
  if (topology_) child->topology_ = topology_->subset(ranks);
  // The measured link prices calls that cross it: a part within one host (shared memory) has none.
  if (child->transport_kind() != transport::Kind::shm) child->link_cost_ = link_cost_;
  return Access::make(std::move(child));
}

}  // namespace tutti::comm
