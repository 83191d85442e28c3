// The tuning table: measured choices (collective, transport, ranks, size range) -> algorithm and
// measured cost-model parameters per transport, read from a JSON file that `tutti-bench
// --calibrate`/`--tune` write. The file:
//
//   {"version": 1,
//    "cost_model": {"shm": {"alpha_s": 2e-6, "beta_s_per_byte": 1e-10, "gamma_s_per_element": 2.5e-10}},
//    "entries": [{"collective": "allreduce", "transport": "shm", "ranks": 2,
//                 "min_bytes": 0, "max_bytes": 65536, "algorithm": "direct"}]}
//
// Byte ranges are inclusive at both ends and count bytes as choose_algorithm does (the total over
// ranks for allgather, reduce_scatter and alltoall). Where entries overlap, the first one wins.
// Names are to_string(Collective) and to_string(Algorithm). Entries for the GPU "transports"
// (gpu:cuda, gpu:emulated: gpu::Communicator's automatic backend) name a gpu::Backend instead, as
// "backend": "ipc" (files that give it as "algorithm" read the same).
//
// Every rank of a communicator must choose alike, so the choice reads only the call, the active
// table and the cost parameters; ranks of one job must therefore see the same file.
#pragma once

#include <cstddef>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "comm/cost_model.hpp"
#include "schedule/schedule.hpp"
#include "tutti/types.hpp"

namespace tutti::comm::choice {

struct Entry {
  Collective collective = Collective::allreduce;
  std::string transport;
  int ranks = 1;
  std::size_t min_bytes = 0, max_bytes = 0;  // inclusive
  Algorithm algorithm = Algorithm::ring;
};

/// An entry for a GPU "transport" (its name starts with "gpu:"): a gpu::Communicator backend.
struct BackendEntry {
  Collective collective = Collective::allreduce;
  std::string transport;
  int ranks = 1;
  std::size_t min_bytes = 0, max_bytes = 0;  // inclusive
  gpu::Backend backend = gpu::Backend::host_transfer;
};

struct Table {
  std::vector<Entry> entries;                     // host transports
  std::vector<BackendEntry> backend_entries;      // GPU transports
  std::map<std::string, CostParams> cost_models;  // by transport name
  std::string origin;                             // the file it came from ("" if none)

  /// The algorithm of the first entry for (collective, transport, ranks) whose range holds `bytes`.
  std::optional<Algorithm> lookup(Collective collective, std::string_view transport, int ranks,
                                  std::size_t bytes) const;
  /// The backend of the first backend entry for (collective, transport, ranks) whose range holds `bytes`.
  std::optional<gpu::Backend> lookup_backend(Collective collective, std::string_view transport, int ranks,
                                             std::size_t bytes) const;
  /// The file format above, pretty-printed (origin is not written).
  std::string to_json() const;
  /// Parses the file format. Throws Error(invalid_argument) naming `origin` and what is wrong
  /// (bad JSON, unknown version, collective, algorithm or backend, a backend for a host transport
  /// or a host algorithm for a GPU one, a missing or negative field, min > max).
  static Table parse(const std::string& text, const std::string& origin);
};

/// The per-user table: $XDG_CACHE_HOME/tutti/tuning.json, else $HOME/.cache/tutti/tuning.json
/// ("" when neither variable is set).
std::string default_path();

/// Makes the table TUTTI_TUNING_FILE names (else the default path's, when that file exists) the
/// active one; does so once per process, and not after set_active. Called by tutti::init() and at
/// the first automatic choice. Throws Error(invalid_argument) naming the file if TUTTI_TUNING_FILE
/// names a missing, unreadable or malformed file (and again at the next call); a malformed default
/// file is logged as a warning and ignored.
void load_from_environment();

/// Replaces the active table (an empty one: the cost model's defaults only) and forgets every
/// cached choice. For tests and `tutti-bench --tune`.
void set_active(Table table);

/// The active table. Thread-safe; the reference stays valid for the life of the process (tables
/// set_active replaces are kept, as choices in flight may still read them).
const Table& active();

/// Changes whenever the active table does (set_active, reset_for_testing, the first load): callers
/// that memoize choices compare it.
const void* active_version();

/// The active table's cost_model entry for `transport` (a Transport::name()), else the compiled-in
/// costs of its kind (transport::default_cost).
CostParams cost_for(std::string_view transport, transport::Kind kind);

/// Where an automatic choice came from.
struct Choice {
  Algorithm algorithm = Algorithm::automatic;  // automatic: no candidate serves the collective
  bool from_table = false;                     // else from the cost model
  std::string_view origin;                     // from_table: the table's file (valid for the process)
  CostParams cost;                             // !from_table: the parameters it used
};

/// What `automatic` resolves to when TUTTI_ALGO is silent: the first active-table entry that
/// matches and can serve the call on a transport of `kind` named `transport` (`direct` only when
/// `direct_available`; never mpi or
/// hierarchical), else the cost model's cheapest candidate for the size class of `bytes` (the
/// powers of two: a class [2^k, 2^(k+1)) is decided at 2^k, whatever size came first). Cached
/// per (collective, kind, transport, ranks, direct_available, class); thread-safe; below a microsecond
/// once cached.
Choice automatic_choice(Collective collective, transport::Kind kind, std::string_view transport, int ranks,
                        bool direct_available, std::size_t bytes);

/// The size class of `bytes` (0 for 0, else 1 + floor(log2 bytes)) and the size it is decided at.
int size_class(std::size_t bytes);
std::size_t class_size(int size_class);

/// Test-only: forgets cached choices; with `reload`, also the active table and whether the
/// environment was loaded (the next load_from_environment reads it again).
void reset_for_testing(bool reload = false);

}  // namespace tutti::comm::choice
