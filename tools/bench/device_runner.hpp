// Device mode's measurements: a case's buffers mirrored in device memory, a batch of collectives
// enqueued on one stream and timed to one synchronize, the exact check through a copy back to the
// host, the sync peer (the MPI + CUDA way) and the device-to-device copy ceiling.
#pragma once

#include <chrono>
#include <cstddef>
#include <functional>
#include <span>

#include "bench/cases.hpp"
#include "bench/options.hpp"
#include "bench/report.hpp"
#include "tutti/gpu.hpp"
#include "tutti/tutti.hpp"

namespace tutti::bench {

/// A stream's deadline: only a hung stream reaches it.
inline constexpr std::chrono::milliseconds stream_deadline{120000};

/// What one rank measures with: the host communicator, its gpu twin and one stream.
struct DeviceContext {
  Communicator& world;
  gpu::Communicator& gpu;
  gpu::Stream stream;
  const BenchOptions& options;
  gpu::Options call_options;  // what every device collective gets (device_options(--backend))
  void synchronize() { gpu.synchronize(stream, stream_deadline); }
};

/// `bytes` of device memory (at least one), freed at scope exit, except while an exception
/// unwinds: a stream may still use it then, and the device frees it with the gpu::Communicator.
class DeviceMemory {
 public:
  DeviceMemory(gpu::Communicator& gpu, std::size_t bytes);
  ~DeviceMemory();
  DeviceMemory(const DeviceMemory&) = delete;
  DeviceMemory& operator=(const DeviceMemory&) = delete;
  void* get() const { return pointer_; }

 private:
  gpu::Communicator& gpu_;
  void* pointer_;
  int exceptions_;
};

/// A host Buffers laid out again in device memory: the device twins of its send() and recv().
class DeviceBuffers {
 public:
  DeviceBuffers(gpu::Communicator& gpu, Buffers& host, const Case& c);

  const void* send() const { return send_; }
  void* recv() { return recv_; }
  /// The device storage behind send() (in place: recv's) and recv(), as Buffers' storage.
  void* input_storage() { return in_place_ ? recv_storage_.get() : send_storage_.get(); }
  void* output_storage() { return recv_storage_.get(); }
  /// Enqueues host -> device copies of both storages (inputs and poisoned outputs).
  void upload(gpu::Stream stream);
  /// Enqueues the device -> host copy of the output storage.
  void download(gpu::Stream stream);

 private:
  gpu::Communicator& gpu_;
  Buffers& host_;
  bool in_place_;
  DeviceMemory send_storage_, recv_storage_;  // send_storage_ unused in place
  const void* send_ = nullptr;
  void* recv_ = nullptr;
};

/// Times `iterations` calls of `op` enqueued back to back and one synchronize, after `warmup`
/// calls and a barrier: time per call, host enqueue time per call (mean and largest) and the
/// host's idle fraction, reduced over ranks (max; idle: min).
Measure time_stream(DeviceContext& context, const std::function<void()>& op, int warmup, int iterations);

/// Iterations for a measurement of `op` (as choose_iterations, each call synchronized).
int choose_stream_iterations(DeviceContext& context, const std::function<void()>& op);

/// Runs `op` once on fresh inputs (uploaded, outputs poisoned on the device), copies the result
/// back over a poisoned host output and returns the wrong elements summed over ranks.
std::size_t check_device(DeviceContext& context, Buffers& host, DeviceBuffers& device, const std::function<void()>& op,
                         bool corrupt);

/// The sync peer, one call: synchronize the stream, copy the input to the host, run Tutti's host
/// collective there, copy the result back, synchronize.
void run_sync(DeviceContext& context, const Case& c, Buffers& host, DeviceBuffers& device);

/// Seconds per device-to-device copy of `bytes` on the stream, timed as time_stream times.
double time_copy(DeviceContext& context, std::size_t bytes);

/// --overlap: `op` (a collective that takes `alone` seconds per call on the stream) beside the
/// device's stand-in compute (Device::compute) on a second stream, with as many rounds as make
/// the compute alone take about `alone` (the same on every rank). Returns seconds per call of the
/// compute alone and of both together (each call of `op` with one compute; max over ranks).
struct Overlap {
  double compute = 0, both = 0;
};
Overlap time_overlap(DeviceContext& context, const std::function<void()>& op, double alone);

}  // namespace tutti::bench
