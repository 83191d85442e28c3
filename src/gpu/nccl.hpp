// The nccl backend: NCCL's collectives on the caller's CUDA streams, with what NCCL lacks added
// around them: the communicator is bootstrapped over the host communicator, every operation's
// call is compared across ranks (a mismatch is named instead of hanging), and a watchdog aborts
// the NCCL communicator (ncclCommAbort, which makes its pending kernels return, so the streams
// are released) on a mismatch, a timeout, a dead local peer or an error NCCL reports, with the
// error raised by check() and later calls. libnccl is loaded at run time (dlopen), so a build
// with the CUDA toolkit runs on machines without NCCL; there the backend is unsupported.
#pragma once

#include <memory>
#include <string>

#include "device/device.hpp"
#include "gpu/backend.hpp"
#include "tutti/tutti.hpp"

namespace tutti::gpu::detail {

class Nccl : public DeviceBackend {
 public:
  /// Collective over `host` (a private duplicate only this backend calls). Error(unsupported) on
  /// every rank alike when this build has no NCCL, the device is not CUDA, libnccl cannot be
  /// loaded, or NCCL cannot make the communicator (it refuses two ranks on one GPU).
  static std::unique_ptr<Nccl> create(std::shared_ptr<device::Device> device, tutti::Communicator host);
  Backend id() const override { return Backend::nccl; }
};

}  // namespace tutti::gpu::detail
