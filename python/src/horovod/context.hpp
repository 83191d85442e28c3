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
#include <vector>

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
  std::optional<double> stall_warning_s;   // HOROVOD_STALL_CHECK_TIME_SECONDS (0: no warning)
  std::optional<double> stall_shutdown_s;  // HOROVOD_STALL_SHUTDOWN_TIME_SECONDS (0: never)
};

/// A Horovod process set: some of the job's ranks, with a communicator split from the world's and
/// an engine of their own (names are negotiated among the set's ranks only). Id 0 is the global
/// set (the world and its engine).
struct ProcessSet {
  std::vector<int> ranks;                   // job ranks, ascending
  std::optional<tutti::Communicator> comm;  // this rank's, when it is a member
  std::unique_ptr<tutti::Engine> engine;    // likewise
  int operations = 0;                       // suffix of the names given to its unnamed operations

  bool member() const { return comm.has_value(); }
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

  tutti::Engine& engine() { return *sets_.at(0).engine; }
  tutti::Communicator& world() { return world_; }

  /// The process set `id` (0: the global set). Error(invalid_argument) for an id that is not (or
  /// no longer) a process set, or one this rank is not a member of.
  ProcessSet& process_set(int id);
  /// The set's ranks (any rank may ask, member or not). Error(invalid_argument) for an unknown id.
  const std::vector<int>& process_set_ranks(int id) const;
  /// The ids of the process sets, ascending (0 first).
  std::vector<int> process_set_ids() const {
    std::vector<int> ids;
    for (const auto& [id, set] : sets_) ids.push_back(id);
    return ids;
  }
  /// Collective over the world (every rank calls it with the same ranks, in the same order of
  /// calls): a new process set of `ranks` (sorted, unique, each in [0, size)); its members split a
  /// communicator and start an engine. Returns its id, or -1 where a set of these ranks exists
  /// (Horovod's duplicate). Error(mismatch) on every rank when the ranks gave different lists,
  /// Error(invalid_argument) for a rank out of range.
  int add_process_set(std::vector<int> ranks);
  /// Collective over the world: removes process set `id` (its members stop its engine; operations
  /// still in flight on it fail with ErrorCode::aborted). False for id 0 or an unknown id.
  bool remove_process_set(int id);

  /// A fresh handle number.
  int next_handle() { return next_handle_++; }
  /// The suffix of the next unnamed operation on process set `id`: its operations counted on this
  /// rank, so that the set's ranks, issuing the same operations, give them the same names.
  int next_unnamed(int id) { return process_set(id).operations++; }
  /// Takes ownership of `op` on process set `set` under `handle`; `key` is its kind and name.
  void add(int handle, int set, std::unique_ptr<PendingOp> op, const std::string& key);
  /// Error(invalid_argument) where an operation of this kind and name on process set `set` has not
  /// been synchronized yet on this rank (Horovod's duplicate name, raised whether or not the first
  /// one has completed: a completed one's handle is still outstanding).
  void check_not_in_flight(int set, const std::string& kind, const std::string& name) const;
  /// Whether the operation has finished, completed or failed (advancing every operation in
  /// flight); synchronize() then returns at once, with the result or the error. Never blocks.
  /// Error(invalid_argument) for an unknown handle.
  bool poll(int handle);
  /// Blocks until the operation completes, advancing every other one meanwhile (an allgather's
  /// second phase starts when its first completes, whichever handle the caller waits on), then
  /// forgets the handle and returns its results. Throws the operation's error. Called with the GIL
  /// held; releases it while it waits, and a pending signal (Ctrl-C) interrupts the wait.
  std::vector<torch::Tensor> synchronize(int handle);
  /// The handles in flight.
  std::size_t pending() const { return ops_.size(); }

 private:
  PendingOp& find(int handle);
  void forget(int handle);
  void advance_others(int handle);

  tutti::Communicator world_;
  tutti::EngineOptions options_;
  std::map<int, ProcessSet> sets_;  // by id; 0, the global set, holds world_ and the main engine
  int next_set_ = 1;
  int local_rank_ = 0, local_size_ = 1, cross_rank_ = 0, cross_size_ = 1;
  int next_handle_ = 0;
  std::map<int, std::unique_ptr<PendingOp>> ops_;
  std::map<int, std::pair<int, std::string>> op_sets_;  // handle -> its process set, "kind name"
};

}  // namespace tutti_python::horovod
