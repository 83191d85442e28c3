// The engine's caller side and lifetime: starting and stopping the background thread, enqueue
// and join, and completing or failing the tensors it holds.
#include "engine/engine_core.hpp"

#include <utility>

#include "comm/access.hpp"
#include "comm/comm_impl.hpp"

namespace tutti::engine {

EngineCore::EngineCore(Communicator& comm, EngineOptions options, device::Device* device)
    : comm_(comm.split(0, comm.rank())),
      options_(std::move(options)),
      rank_(comm_.rank()),
      size_(comm_.size()),
      table_(size_),
      staging_(device != nullptr ? std::make_unique<StreamStaging>(*device) : nullptr) {
  if (comm::Access::impl(comm_)->progressed_by_caller_only())
    throw Error(ErrorCode::unsupported,
                "engine: its thread calls the communicator, but MPI was initialized below MPI_THREAD_SERIALIZED "
                "(plain MPI_Init); use MPI_Init_thread with MPI_THREAD_MULTIPLE");
  start_timeline(options_.timeline_path, false);
  thread_ = std::thread([this] { run(); });
}

EngineCore::~EngineCore() {
  {
    std::lock_guard lock(mutex_);
    shutting_down_ = true;
    aborting_ = std::uncaught_exceptions() > 0;
  }
  flush();
  thread_.join();
  // Anything enqueued after the thread's last cycle.
  std::vector<std::shared_ptr<TensorState>> left;
  {
    std::lock_guard lock(mutex_);
    left.swap(inbox_);
  }
  for (auto& t : left)
    complete(t, std::make_exception_ptr(Error(ErrorCode::aborted, "engine: tensor '" + t->descriptor.name +
                                                                      "' was pending when the engine was destroyed")));
  // Every device tensor is complete, so every stream waiting on this engine is released.
  staging_.reset();
}

void EngineCore::check_arguments(const Descriptor& d, const void* send, const void* recv) const {
  if (d.name.empty()) throw Error(ErrorCode::invalid_argument, "engine: enqueue: the tensor name is empty");
  if (d.count > 0 && (recv == nullptr || (d.kind != Collective::broadcast && send == nullptr)))
    throw Error(ErrorCode::invalid_argument,
                "engine: enqueue '" + d.name + "': null buffer with count " + std::to_string(d.count));
  if (d.kind == Collective::broadcast && (d.root < 0 || d.root >= size_))
    throw Error(ErrorCode::invalid_argument, "engine: enqueue_broadcast '" + d.name + "': root " +
                                                 std::to_string(d.root) + " is not a rank of " + std::to_string(size_));
  if (d.kind == Collective::allgather && d.count > 0 && send != recv) {
    const auto bytes = d.count * size_of(d.type);
    const auto* s = static_cast<const std::byte*>(send);
    const auto* r = static_cast<const std::byte*>(recv);
    if (s < r + bytes * static_cast<std::size_t>(size_) && r < s + bytes && s != r + bytes * rank_)
      throw Error(ErrorCode::invalid_argument, "engine: enqueue_allgather '" + d.name +
                                                   "': send overlaps recv other than at block " +
                                                   std::to_string(rank_));
  }
}

Handle EngineCore::enqueue(Descriptor d, const void* send, void* recv) {
  check_arguments(d, send, recv);
  auto t = std::make_shared<TensorState>();
  t->send = send;
  t->recv = recv;
  t->enqueued = Clock::now();
  t->doorbell = doorbell_;
  bool ring = false;
  {
    std::lock_guard lock(mutex_);
    if (failure_) std::rethrow_exception(failure_);
    if (shutting_down_)
      throw Error(ErrorCode::aborted, "engine: enqueue '" + d.name + "': the engine is shutting down");
    if (!names_.insert(d.name).second)
      throw Error(ErrorCode::invalid_argument, "engine: tensor '" + d.name + "' is already enqueued on rank " +
                                                   std::to_string(rank_) + " and has not completed");
    t->descriptor = std::move(d);
    inbox_.push_back(t);
    ring = idle_;
    idle_ = false;
  }
  if (ring || peer_waiting_.load(std::memory_order_relaxed)) doorbell_->ring();
  return Handle(t);
}

Handle EngineCore::join() {
  auto t = std::make_shared<TensorState>();
  t->doorbell = doorbell_;
  {
    std::lock_guard lock(mutex_);
    if (failure_) std::rethrow_exception(failure_);
    if (shutting_down_) throw Error(ErrorCode::aborted, "engine: join: the engine is shutting down");
    if (join_) throw Error(ErrorCode::invalid_argument, "engine: join: this rank has joined already");
    if (!names_.empty())
      throw Error(ErrorCode::invalid_argument, "engine: join: this rank has " + std::to_string(names_.size()) +
                                                   " tensor(s) pending; wait for them first");
    join_ = t;
    idle_ = false;
  }
  doorbell_->ring();
  return Handle(t);
}

void EngineCore::complete(const std::shared_ptr<TensorState>& t, std::exception_ptr error) {
  {
    std::lock_guard lock(mutex_);
    names_.erase(t->descriptor.name);
    if (t->on_stream && error && !stream_failure_) stream_failure_ = error;
  }
  // A device tensor's stream copies the staging back once released: with the result, or after
  // an error (the contents are then undefined). Nothing may leave it waiting.
  if (t->on_stream) staging_->release(*t);
  t->finish(std::move(error));
}

void EngineCore::fail_everything(std::exception_ptr error) {
  std::vector<std::shared_ptr<TensorState>> left;
  {
    std::lock_guard lock(mutex_);
    if (!failure_) failure_ = error;
    left.swap(inbox_);
  }
  for (auto& [name, t] : announced_) left.push_back(t);
  announced_.clear();
  left.insert(left.end(), held_.begin(), held_.end());
  held_.clear();
  {
    std::lock_guard lock(mutex_);
    if (join_) left.push_back(std::move(join_));
    join_.reset();
  }
  for (auto& t : left) complete(t, error);
}

}  // namespace tutti::engine
