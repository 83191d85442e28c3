// The state of tutti.horovod.torch between init() and shutdown(): the world communicator, the
// training engine every named operation goes through, where the ranks run, and the handles of the
// operations in flight.
#pragma once

#include <chrono>
#include <cstddef>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include "horovod/ops.hpp"
#include "tutti/engine.hpp"
#include "tutti/tutti.hpp"

namespace tutti_python::horovod {

/// Engine settings given by Horovod's variables (HOROVOD_FUSION_THRESHOLD, HOROVOD_CYCLE_TIME,
/// HOROVOD_TIMELINE, parsed by the Python module); each one set replaces the TUTTI_* equivalent.
struct HorovodSettings {
  std::optional<std::size_t> fusion_threshold;  // bytes
  std::optional<double> cycle_time_ms;
  std::optional<std::string> timeline;
};

/// Every member is called with the GIL held, which serializes them.
class Context {
 public:
  /// Collective over `world` (the job hvd.init() joined): learns which ranks share a host (one
  /// allgather of host names) and starts the engine.
  Context(const HorovodSettings& settings, tutti::Communicator world);
  /// Collective: stops the engine; operations still in flight fail with ErrorCode::aborted.
  ~Context();
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;

  int rank() const { return world_.rank(); }
  int size() const { return world_.size(); }
  int local_rank() const { return local_rank_; }
  int local_size() const { return local_size_; }
  int cross_rank() const { return cross_rank_; }
  int cross_size() const { return cross_size_; }

  tutti::Engine& engine() { return *engine_; }
  tutti::Communicator& world() { return world_; }

  /// A fresh handle number: also the suffix of the names given to unnamed operations, so that the
  /// ranks, issuing the same operations, give them the same names.
  int next_handle() { return next_handle_++; }
  /// Takes ownership of `op` under `handle`.
  void add(int handle, std::unique_ptr<PendingOp> op);
  /// Whether the operation has finished, completed or failed (advancing every operation in
  /// flight); synchronize() then returns at once, with the result or the error. Never blocks.
  /// Error(invalid_argument) for an unknown handle.
  bool poll(int handle);
  /// Blocks until the operation completes, advancing every other one meanwhile (an allgather's
  /// second phase starts when its first completes, whichever handle the caller waits on), then
  /// forgets the handle and returns its results. Throws the operation's error. Called with the GIL
  /// held; releases it while it waits, and a pending signal (Ctrl-C) interrupts the wait.
  std::vector<::torch::Tensor> synchronize(int handle);
  /// The handles in flight.
  std::size_t pending() const { return ops_.size(); }

 private:
  PendingOp& find(int handle);
  void advance_others(int handle);

  tutti::Communicator world_;
  std::unique_ptr<tutti::Engine> engine_;
  int local_rank_ = 0, local_size_ = 1, cross_rank_ = 0, cross_size_ = 1;
  int next_handle_ = 0;
  std::map<int, std::unique_ptr<PendingOp>> ops_;
};

}  // namespace tutti_python::horovod
