// The public gpu::Communicator: argument checks as the host API's, then a hand-over to the
// backend; the device functions forward to the communicator's device.
#include <string>

#include "comm/comm_impl.hpp"
#include "comm/reduce_local.hpp"
#include "comm/tuning.hpp"
#include "gpu/gpu_impl.hpp"

namespace tutti::gpu {

namespace detail {

Impl::Impl(tutti::Communicator& host, device::Kind kind, int ordinal)
    : rank_(host.rank()), size_(host.size()), host_(host) {
  if (size_ <= 0) throw Error(ErrorCode::invalid_argument, "gpu::Communicator: the host communicator is empty");
  device_ = device::make_device(kind, ordinal);
  tuning_transport_ = "gpu:" + std::string(device::to_string(device_->kind()));
  // Ranks that are threads of this process on this GPU submit their device work in order.
  order_ = LocalOrder::join(host, device_->queue_domain());
  // A private duplicate: only the progress thread calls it, so `host` stays the caller's.
  backend_ = std::make_unique<HostTransfer>(device_, host.split(0, host.rank()), order_);
  // Another duplicate for ipc's watchdog; the backend refuses alike on every rank.
  try {
    ipc_ = std::make_unique<Ipc>(device_, host.split(0, host.rank()), Ipc::default_capacity(), order_);
  } catch (const Error& error) {
    if (error.code() != ErrorCode::unsupported) throw;
    ipc_refusal_ = error.what();
  }
}

Impl::~Impl() {
  nccl_.reset();
  ipc_.reset();
  backend_.reset();  // releases the streams and stops the progress thread
  device_.reset();
}

void Impl::check() {
  backend_->check();
  if (ipc_) ipc_->check();
  if (nccl_) nccl_->check();
}

Nccl* Impl::nccl(std::string& refusal) {
  if (!nccl_tried_) {
    nccl_tried_ = true;
    try {
      if (device_->kind() != device::Kind::cuda)
        throw Error(ErrorCode::unsupported,
                    "tutti::gpu: the nccl backend is not available: it needs a CUDA device "
                    "(this communicator's is " +
                        std::string(device::to_string(device_->kind())) + ")");
      nccl_ = Nccl::create(device_, host_.split(0, rank_));
    } catch (const Error& error) {
      if (error.code() != ErrorCode::unsupported) throw;
      nccl_refusal_ = error.what();
    }
  }
  refusal = nccl_refusal_;
  return nccl_.get();
}

void Impl::validate(const DeviceCall& dc) const {
  const tutti::comm::Call& call = dc.call;
  const std::size_t elem = size_of(call.type);
  const std::string what = dc.kind == DeviceCall::Kind::send   ? "send"
                           : dc.kind == DeviceCall::Kind::recv ? "recv"
                                                               : std::string(to_string(call.collective));
  auto device_memory = [&](const void* p, std::size_t count, const char* name) {
    if (count == 0) return;
    const auto* first = static_cast<const std::byte*>(p);
    if (!device_->is_device_pointer(first) || !device_->is_device_pointer(first + count * elem - 1))
      throw Error(ErrorCode::invalid_argument, what + ": " + name + " is not device memory (" + std::to_string(count) +
                                                   " elements from " +
                                                   std::to_string(reinterpret_cast<std::uintptr_t>(p)) + ")");
  };
  if (dc.kind != DeviceCall::Kind::collective) {
    const bool is_send = dc.kind == DeviceCall::Kind::send;
    const void* data = is_send ? call.send : call.recv;
    tutti::comm::validate_point_to_point(is_send, data, call.count, call.type, dc.peer, dc.tag, size_);
    device_memory(data, call.count, "data");
    return;
  }
  const tutti::comm::Extents extents = tutti::comm::validate(call, rank_, size_);
  if (call.collective != Collective::broadcast) device_memory(call.send, extents.send, "send");
  device_memory(call.recv, extents.recv, call.collective == Collective::broadcast ? "buffer" : "recv");
}

DeviceBackend* Impl::backend(Backend id, std::string& refusal) {
  switch (id) {
    case Backend::ipc:
      refusal = ipc_refusal_;
      return ipc_.get();
    case Backend::nccl:
      return nccl(refusal);
    default:
      return backend_.get();
  }
}

void Impl::enqueue(DeviceCall call, device::Stream stream) {
  check();
  check_backend_options(call);
  validate(call);
  // The backend: the one the options name; automatic takes what automatic_backend says, or
  // host_transfer where the options name a host algorithm for its host collective.
  std::string refusal;
  DeviceBackend* chosen = backend_.get();
  if (call.backend != Backend::automatic) {
    chosen = backend(call.backend, refusal);
    if (chosen != nullptr && !chosen->serves(call, &refusal)) chosen = nullptr;
    if (chosen == nullptr)
      throw Error(ErrorCode::unsupported, "tutti::gpu: the " + std::string(to_string(call.backend)) +
                                              " backend cannot run this " +
                                              std::string(to_string(call.call.collective)) + ": " + refusal);
  } else if (call.call.options.algorithm == Algorithm::automatic) {
    chosen = backend(automatic_backend(call), refusal);  // one that serves the call
  }
  chosen->enqueue(call, stream);
}

Backend Impl::automatic_backend(const DeviceCall& call) {
  const bool ipc_serves = ipc_ && ipc_->serves(call, nullptr);
  if (call.kind == DeviceCall::Kind::collective) {
    namespace choice = tutti::comm::choice;
    choice::load_from_environment();
    const std::size_t bytes = call.call.count * size_of(call.call.type);
    const std::optional<Backend> named =
        choice::active().lookup_backend(call.call.collective, tuning_transport_, size_, bytes);
    std::string refusal;
    if (named == Backend::host_transfer) return Backend::host_transfer;
    if (named == Backend::ipc && ipc_serves) return Backend::ipc;
    if (named == Backend::nccl)
      if (Nccl* backend = nccl(refusal); backend != nullptr && backend->serves(call, nullptr)) return Backend::nccl;
  }
  return ipc_serves ? Backend::ipc : Backend::host_transfer;
}

}  // namespace detail

namespace {

using tutti::comm::make_call;

// A collective with its gpu::Options split as DeviceCall carries them.
void run(detail::Impl& impl, Collective collective, const void* send, void* recv, std::size_t count, DataType type,
         std::optional<ReduceOp> op, int root, Stream stream, const Options& options) {
  const tutti::Options host{.algorithm = options.algorithm, .timeout = options.timeout};
  impl.enqueue(detail::DeviceCall{.call = make_call(collective, send, recv, count, type, op, root, host),
                                  .backend = options.backend},
               device::Stream{stream});
}

}  // namespace

Communicator::Communicator(tutti::Communicator& host, int device)
    : impl_(std::make_unique<detail::Impl>(host, device::kind_from_env(device::Kind::cuda), device)) {}
Communicator::Communicator(tutti::Communicator& host, DeviceKind kind, int device)
    : impl_(std::make_unique<detail::Impl>(host, kind, device)) {}
Communicator::~Communicator() = default;
Communicator::Communicator(Communicator&&) noexcept = default;
Communicator& Communicator::operator=(Communicator&&) noexcept = default;

detail::Impl& Communicator::checked() const {
  if (!impl_) throw Error(ErrorCode::invalid_argument, "gpu::Communicator: moved from");
  return *impl_;
}

int Communicator::rank() const { return impl_ ? impl_->rank() : -1; }
int Communicator::size() const { return impl_ ? impl_->size() : 0; }

void Communicator::allreduce(const void* send, void* recv, std::size_t count, DataType type, ReduceOp op, Stream stream,
                             const Options& options) {
  run(checked(), Collective::allreduce, send, recv, count, type, op, -1, stream, options);
}
void Communicator::broadcast(void* buffer, std::size_t count, DataType type, int root, Stream stream,
                             const Options& options) {
  run(checked(), Collective::broadcast, buffer, buffer, count, type, std::nullopt, root, stream, options);
}
void Communicator::allgather(const void* send, void* recv, std::size_t send_count, DataType type, Stream stream,
                             const Options& options) {
  run(checked(), Collective::allgather, send, recv, send_count, type, std::nullopt, -1, stream, options);
}
void Communicator::reduce_scatter(const void* send, void* recv, std::size_t recv_count, DataType type, ReduceOp op,
                                  Stream stream, const Options& options) {
  run(checked(), Collective::reduce_scatter, send, recv, recv_count, type, op, -1, stream, options);
}

void Communicator::reduce(const void* send, void* recv, std::size_t count, DataType type, ReduceOp op, int root,
                          Stream stream, const Options& options) {
  run(checked(), Collective::reduce, send, recv, count, type, op, root, stream, options);
}
void Communicator::alltoall(const void* send, void* recv, std::size_t count_per_rank, DataType type, Stream stream,
                            const Options& options) {
  run(checked(), Collective::alltoall, send, recv, count_per_rank, type, std::nullopt, -1, stream, options);
}
void Communicator::barrier(Stream stream, const Options& options) {
  run(checked(), Collective::barrier, nullptr, nullptr, 0, DataType::u8, std::nullopt, -1, stream, options);
}
void Communicator::send(const void* data, std::size_t count, DataType type, int peer, Stream stream, int tag) {
  detail::DeviceCall call{.kind = detail::DeviceCall::Kind::send,
                          .call = make_call(Collective::barrier, data, nullptr, count, type, std::nullopt, -1, {}),
                          .peer = peer,
                          .tag = tag};
  checked().enqueue(call, device::Stream{stream});
}
void Communicator::recv(void* data, std::size_t count, DataType type, int peer, Stream stream, int tag) {
  detail::DeviceCall call{.kind = detail::DeviceCall::Kind::recv,
                          .call = make_call(Collective::barrier, nullptr, data, count, type, std::nullopt, -1, {}),
                          .peer = peer,
                          .tag = tag};
  checked().enqueue(call, device::Stream{stream});
}

void Communicator::check() { checked().check(); }

void* Communicator::allocate(std::size_t bytes) { return checked().device().allocate(bytes); }
void Communicator::free(void* pointer) { checked().device().free(pointer); }
Stream Communicator::create_stream() { return checked().device().create_stream().handle; }
void Communicator::destroy_stream(Stream stream) { checked().device().destroy_stream(device::Stream{stream}); }
void Communicator::copy(void* dst, const void* src, std::size_t bytes, Stream stream) {
  checked().device().copy(dst, src, bytes, device::Stream{stream});
}
void Communicator::reduce_local(void* dst, const void* a, const void* b, std::size_t count, DataType type, ReduceOp op,
                                Stream stream) {
  comm::check_local_op(op);
  checked().device().reduce(dst, a, b, count, type, op, device::Stream{stream});
}
void Communicator::synchronize(Stream stream, std::chrono::milliseconds timeout) {
  checked().device().synchronize(device::Stream{stream}, timeout);
}

std::string device_name(DeviceKind kind, int device) { return device::make_device(kind, device)->name(); }

}  // namespace tutti::gpu
