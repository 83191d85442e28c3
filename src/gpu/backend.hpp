// What every GPU backend is to a gpu::Communicator (docs/gpu.md, "Backends"): host_transfer (a
// host collective between copies to and from pinned staging, any host transport), ipc (device to
// device through mapped staging, one host) and nccl (NCCL on CUDA). Each says which operations it
// runs, enqueues them on a stream without waiting, and keeps its own progress thread or watchdog,
// which records the first failure of its operations and releases their streams; check() raises it.
// The communicator picks one per operation (gpu::Options::backend, or automatic) and talks to it
// only through this interface.
#pragma once

#include <atomic>
#include <chrono>
#include <mutex>
#include <optional>
#include <string>
#include <utility>

#include "comm/comm_impl.hpp"
#include "core/env.hpp"
#include "device/device.hpp"
#include "tutti/gpu.hpp"
#include "tutti/tutti.hpp"

namespace tutti::gpu::detail {

/// One operation as the host call describes it (validated before it is enqueued): a collective
/// (`call`), or a point-to-point send or receive of call.send / call.recv with `peer` and `tag`.
/// gpu::Options travel split: `backend`, and call.options with the host algorithm and timeout.
struct DeviceCall {
  enum class Kind { collective, send, recv };
  Kind kind = Kind::collective;
  tutti::comm::Call call;
  int peer = -1;
  int tag = 0;
  Backend backend = Backend::automatic;
};

/// Applies the option rules of <tutti/gpu.hpp> to `call` (Error(invalid_argument) where they are
/// broken): call.backend is valid, and ipc and nccl carry no host algorithm.
void check_backend_options(const DeviceCall& call);

/// For a backend's serves(): records `reason` in `why` (where not null) and returns false.
inline bool refuse(std::string* why, std::string reason) {
  if (why != nullptr) *why = std::move(reason);
  return false;
}

/// For the serves() of a backend that runs collectives only (ipc, nccl): whether `call` is one;
/// point-to-point is refused, saying that host_transfer runs it.
inline bool collective_only(const DeviceCall& call, std::string* why) {
  return call.kind == DeviceCall::Kind::collective || refuse(why, "point-to-point operations use host_transfer");
}

/// The operation's timeout: Options::timeout, else the default (TUTTI_TIMEOUT_MS).
inline std::chrono::milliseconds timeout_of(const DeviceCall& call) {
  return call.call.options.timeout.count() > 0 ? call.call.options.timeout : core::default_timeout();
}

/// The first failure of a backend's operations (the first recorded wins). Shared, so that whoever
/// keeps it learns the outcome of operations whose backend was destroyed with them in flight.
class FailureRecord {
 public:
  /// Records `error` unless a failure is recorded already.
  void record(Error error);
  /// Raises the recorded failure, if any (never blocks for long: one uncontended lock).
  void check() const;
  bool failed() const { return failed_.load(std::memory_order_acquire); }
  /// The recorded failure, if any.
  std::optional<Error> failure() const;

 private:
  mutable std::mutex mutex_;
  std::atomic<bool> failed_{false};
  std::optional<Error> error_;  // under mutex_
};

class DeviceBackend {
 public:
  virtual ~DeviceBackend() = default;
  /// Which backend this is: host_transfer, ipc or nccl.
  virtual Backend id() const = 0;
  /// Whether it runs `call` here; else `why` (where not null) says why not.
  virtual bool serves(const DeviceCall& call, std::string* why) const = 0;
  /// Enqueues `call` (validated, served) on `stream` and returns without waiting for the stream;
  /// raises a failure recorded earlier instead (nothing enqueued).
  virtual void enqueue(const DeviceCall& call, device::Stream stream) = 0;
  /// Raises the first failure of an operation this backend ran, if any; never blocks for long.
  virtual void check() = 0;
};

}  // namespace tutti::gpu::detail
