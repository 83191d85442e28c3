// What is behind a gpu::Communicator: its device and its backends (gpu/backend.hpp: host_transfer,
// ipc where the ranks share a host, nccl made at first use). Kept apart from the public header so
// that no device type leaks into <tutti/gpu.hpp>.
#pragma once

#include <memory>

#include "device/device.hpp"
#include "gpu/host_transfer.hpp"
#include "gpu/ipc.hpp"
#include "gpu/local_order.hpp"
#include "gpu/nccl.hpp"
#include "tutti/gpu.hpp"

namespace tutti::gpu::detail {

class Impl {
 public:
  Impl(tutti::Communicator& host, device::Kind kind, int ordinal);
  ~Impl();

  int rank() const { return rank_; }
  int size() const { return size_; }
  device::Device& device() { return *device_; }
  /// The device, kept alive by whoever holds it after this communicator is gone (tests).
  std::shared_ptr<device::Device> shared_device() const { return device_; }
  /// The backend `id` names (host_transfer for automatic), or nullptr with `refusal` saying why it
  /// is not available (ipc, nccl).
  DeviceBackend* backend(Backend id, std::string& refusal);
  /// host_transfer's failures; they outlive the communicator (destroying it with operations in
  /// flight records ErrorCode::aborted there).
  std::shared_ptr<const FailureRecord> host_transfer_failures() const { return backend_->failures(); }
  /// The ipc backend, or nullptr where it is not available (ipc_refusal() says why).
  Ipc* ipc() { return ipc_.get(); }
  const std::string& ipc_refusal() const { return ipc_refusal_; }
  /// Raises the first recorded failure of either backend.
  void check();

  /// Checks `call` as the host API does, plus: every buffer it touches is device memory.
  void validate(const DeviceCall& call) const;
  /// Raises a recorded failure, checks call.backend against call.call.options (check_backend_options),
  /// validates `call`, picks its backend and enqueues it on `stream`.
  void enqueue(DeviceCall call, device::Stream stream);
  /// The backend `automatic` takes for `call`: the tuning table's entry for transport
  /// "gpu:<device kind>" where it names a backend that runs the call here, else ipc where it
  /// serves the call, else host_transfer. Collective where it makes the nccl backend.
  Backend automatic_backend(const DeviceCall& call);

 private:
  int rank_;
  int size_;
  std::shared_ptr<device::Device> device_;
  std::string tuning_transport_;       // "gpu:<device kind>": the tuning table's name for it
  std::shared_ptr<LocalOrder> order_;  // with the ranks sharing this GPU's queues, if any
  std::unique_ptr<HostTransfer> backend_;
  std::unique_ptr<Ipc> ipc_;
  std::string ipc_refusal_;
  /// The nccl backend, made by the first call that asks for it (collective, as that call is).
  Nccl* nccl(std::string& refusal);
  tutti::Communicator host_;  // a handle: the nccl backend splits its duplicate at first use
  std::unique_ptr<Nccl> nccl_;
  bool nccl_tried_ = false;
  std::string nccl_refusal_;
};

}  // namespace tutti::gpu::detail
