// Stream-aware collectives (issue 13): a collective on device buffers is enqueued on a GPU stream
// like a kernel, so that the host never waits for the device to communicate. No CUDA header here:
// a cudaStream_t converts to gpu::Stream implicitly, so users without CUDA can include this too.
//
// Contract of every collective below:
// - The call checks its arguments exactly as the host API does (count overflow, null pointers
//   with count > 0, root range, invalid enums, overlapping buffers that are not in place), and
//   also that every buffer is device memory; a bad argument raises Error(invalid_argument) from
//   the call and nothing is enqueued.
// - Then it enqueues the collective on `stream` and returns at once: it never waits for the
//   stream or the device. The collective runs after everything enqueued on `stream` before it;
//   everything enqueued after it sees the result. Buffers must stay valid until then.
// - Operations are numbered in host-call order and run in that order, one after the other, on
//   every rank (as on the host: issue them in the same order everywhere). A later operation on
//   another stream therefore waits for the earlier ones, whatever stream they are on.
// - A failure after the call returned (a peer died, a timeout, a mismatch between ranks) is
//   recorded (the first one wins) and raised, with its ErrorCode, by check() and by every later
//   collective call, which then enqueues nothing. The stream is always released: the failed
//   operation and every operation still queued behind it complete on their streams, with
//   undefined contents in their output buffers.
// - Options::backend picks the backend: host_transfer, ipc or nccl, or automatic (the tuning
//   table's choice for transport "gpu:<device kind>" where that backend runs the call, else ipc
//   where it serves the call, else host_transfer). Options::algorithm is host_transfer's host
//   collective algorithm (ring, direct, ...; automatic: the cost model); with backend automatic, a
//   host algorithm means host_transfer. Options::timeout bounds the operation, counted from when
//   the stream reached it.
// - The options are checked with the arguments (Error(invalid_argument), nothing enqueued): a
//   Backend value out of range; backend ipc or nccl with a host algorithm (they run no host
//   collective). A backend this build or placement lacks, or one that cannot run the call, is
//   Error(unsupported) from the call, and nothing is enqueued.
// - A tutti::Options converts to Options: its algorithm is the host algorithm, with backend
//   automatic.
//
// Backend host_transfer (docs/gpu.md): the stream copies the input to pinned host staging and
// raises a flag; a progress thread of this communicator runs the host collective on the staging
// and raises the flag the stream waits on before it copies the result back. Large allreduce,
// reduce and broadcast are pipelined in chunks.
#pragma once

#include <chrono>
#include <cstddef>
#include <memory>
#include <optional>
#include <string_view>

#include "tutti/tutti.hpp"

namespace tutti::gpu {

/// A device stream: a cudaStream_t on CUDA, or a stream create_stream made.
using Stream = void*;

// gpu::DeviceKind, gpu::Backend, its to_string and backend_from_name are declared in <tutti/types.hpp>.

/// Per-call options of the collectives of gpu::Communicator.
struct Options {
  Backend backend = Backend::automatic;
  /// host_transfer's host collective algorithm (ring, direct, ...); automatic: the cost model.
  Algorithm algorithm = Algorithm::automatic;
  /// Deadline of the operation from when the stream reaches it; 0 = the default (TUTTI_TIMEOUT_MS).
  std::chrono::milliseconds timeout{0};

  Options() = default;
  Options(Backend backend, std::chrono::milliseconds timeout = {}) : backend(backend), timeout(timeout) {}
  Options(Backend backend, Algorithm algorithm, std::chrono::milliseconds timeout = {})
      : backend(backend), algorithm(algorithm), timeout(timeout) {}
  /// The host options: options.algorithm is the host algorithm, the backend automatic.
  Options(const tutti::Options& options);
};

namespace detail {
class Impl;
struct Access;  // the engine's and tests' view of the implementation (src/gpu/access.hpp)
}  // namespace detail

/// The GPU twin of a host communicator: the same ranks, collectives on device buffers enqueued on
/// streams. Owns its device (CUDA device `device`, or an emulated one), pinned staging and one
/// progress thread. Calls on one gpu::Communicator must come from one thread at a time.
class Communicator {
 public:
  /// Collective over `host` (it splits a private duplicate that only the progress thread uses,
  /// so `host` stays free for its own calls). The device kind comes from TUTTI_DEVICE
  /// (`emulated` or `cuda`), else CUDA. Error(unsupported) if CUDA is asked for and this build
  /// has no CUDA or no device is present; Error(invalid_argument) for another TUTTI_DEVICE.
  explicit Communicator(tutti::Communicator& host, int device = 0);
  Communicator(tutti::Communicator& host, DeviceKind kind, int device = 0);
  /// Releases every stream still waiting on this communicator's operations, stops the progress
  /// thread and frees the device (so streams create_stream made are destroyed: an emulated
  /// stream runs its queued work first). Never waits for a held stream; waits for a host
  /// collective in flight (its peers are late) at most until that operation's timeout. On CUDA
  /// the caller's streams must not still be waiting on the communicator's buffers' contents.
  ~Communicator();
  Communicator(Communicator&&) noexcept;
  Communicator& operator=(Communicator&&) noexcept;

  int rank() const;
  int size() const;

  // ---- collectives (counts in elements; the contract at the top of this file) ----

  /// recv[i] = op over ranks of send[i], on every rank. In place: send == recv.
  void allreduce(const void* send, void* recv, std::size_t count, DataType type, ReduceOp op, Stream stream,
                 const Options& options = {});
  /// Copies root's buffer to every rank's buffer.
  void broadcast(void* buffer, std::size_t count, DataType type, int root, Stream stream, const Options& options = {});
  /// recv (size()*send_count elements) gets every rank's block in rank order.
  /// In place: send == recv + rank*send_count or send == recv.
  void allgather(const void* send, void* recv, std::size_t send_count, DataType type, Stream stream,
                 const Options& options = {});
  /// send holds size()*recv_count elements; rank r receives block r of the reduction.
  /// In place: recv == send + rank*recv_count or send == recv.
  void reduce_scatter(const void* send, void* recv, std::size_t recv_count, DataType type, ReduceOp op, Stream stream,
                      const Options& options = {});
  /// Like allreduce, but only `root` receives the result (recv is ignored elsewhere and may be null).
  void reduce(const void* send, void* recv, std::size_t count, DataType type, ReduceOp op, int root, Stream stream,
              const Options& options = {});
  /// Block j of send (count_per_rank elements) goes to rank j, which stores it as its block `rank`.
  /// In place: send == recv.
  void alltoall(const void* send, void* recv, std::size_t count_per_rank, DataType type, Stream stream,
                const Options& options = {});
  /// Work enqueued on `stream` after the barrier runs once every rank's stream reached it.
  void barrier(Stream stream, const Options& options = {});
  /// Sends `count` elements to `peer` once `stream` reaches the call; the matching recv is the
  /// peer's recv with this rank and `tag` (tag >= 0). Point-to-point operations are numbered with
  /// the collectives and start in that order; a send and a receive need not complete in order, so
  /// two ranks may each send and then receive. The host's default timeout (TUTTI_TIMEOUT) bounds each.
  void send(const void* data, std::size_t count, DataType type, int peer, Stream stream, int tag = 0);
  /// Receives `count` elements from `peer` into device memory; work after it on `stream` sees them.
  void recv(void* data, std::size_t count, DataType type, int peer, Stream stream, int tag = 0);

  /// Raises the recorded failure of an earlier operation, if any (never blocks).
  void check();

  // ---- the device, for users of the emulated device and for tests (thin forwards) ----

  /// `bytes` of device memory (256-byte aligned). Error(invalid_argument) for 0 bytes.
  void* allocate(std::size_t bytes);
  /// Frees what allocate returned (nullptr: no-op); no stream may still use it.
  void free(void* pointer);
  Stream create_stream();
  void destroy_stream(Stream stream);
  /// Enqueues a copy of `bytes` on `stream`, in any direction (device, pinned or host memory).
  void copy(void* dst, const void* src, std::size_t bytes, Stream stream);
  /// Enqueues dst[i] = a[i] op b[i] for i < count on `stream`, all three in device memory, with
  /// the device's reduction kernel: bit for bit what tutti::reduce_local computes on the host.
  /// Errors (nothing enqueued) as tutti::reduce_local's, and for a buffer outside device memory.
  void reduce_local(void* dst, const void* a, const void* b, std::size_t count, DataType type, ReduceOp op,
                    Stream stream);
  /// Waits until everything enqueued on `stream` is done; Error(timeout) after `timeout`.
  void synchronize(Stream stream, std::chrono::milliseconds timeout);

 private:
  friend struct detail::Access;
  detail::Impl& checked() const;
  std::unique_ptr<detail::Impl> impl_;
};

/// Opens device `device` of `kind` on its own and returns its name ("emulated", or the CUDA
/// device's): a check a rank can make before the collective constructor, which every rank must
/// reach. Error(unsupported) where CUDA is asked for and this build has none or the device is absent.
std::string device_name(DeviceKind kind, int device = 0);

}  // namespace tutti::gpu
