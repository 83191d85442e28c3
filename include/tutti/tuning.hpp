// The tuning table behind Algorithm::automatic: measured choices per (collective, transport, ranks,
// size range) and each transport's measured cost model (α, β, γ). Every rank reads it from the
// JSON file TUTTI_TUNING_FILE names, else from default_path() when that file exists; `tutti-bench
// --calibrate` and `--tune` write it with what this header offers. The file:
//
//   {"version": 1,
//    "cost_model": {"shm": {"alpha_s": 2e-6, "beta_s_per_byte": 1e-10, "gamma_s_per_element": 2.5e-10}},
//    "entries": [{"collective": "allreduce", "transport": "shm", "ranks": 2,
//                 "min_bytes": 0, "max_bytes": 65536, "algorithm": "direct"}]}
//
// Byte ranges are inclusive at both ends and count bytes as Communicator::chosen_algorithm does
// (the total over ranks for allgather, reduce_scatter and alltoall). Where entries overlap, the
// first one wins. Names are to_string(Collective) and to_string(Algorithm); transports are
// Communicator::transport_name(). Entries for the GPU "transports" (gpu:cuda, gpu:emulated:
// gpu::Communicator's automatic backend) name a gpu::Backend instead, as "backend": "ipc" (files
// that give it as "algorithm" read the same).
//
// Every rank of a communicator must choose alike, so ranks of one job must use the same table.
#pragma once

#include <cstddef>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "tutti/types.hpp"

namespace tutti {

class Communicator;

namespace tuning {

/// One transport's costs as the cost model prices a message: α per message, β per byte, γ per
/// reduced element (seconds).
struct CostModel {
  double alpha = 0;  // s
  double beta = 0;   // s/byte
  double gamma = 0;  // s/element
};

/// A host transport's measured choice for calls of `collective` on `ranks` ranks.
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
  std::vector<Entry> entries;                    // host transports
  std::vector<BackendEntry> backend_entries;     // GPU transports
  std::map<std::string, CostModel> cost_models;  // by transport name
  std::string origin;                            // the file it came from ("" if none)

  /// The algorithm of the first entry for (collective, transport, ranks) whose range holds `bytes`.
  std::optional<Algorithm> lookup(Collective collective, std::string_view transport, int ranks,
                                  std::size_t bytes) const;
  /// The backend of the first backend entry for (collective, transport, ranks) whose range holds `bytes`.
  std::optional<gpu::Backend> lookup_backend(Collective collective, std::string_view transport, int ranks,
                                             std::size_t bytes) const;
  /// The file format above, pretty-printed (origin is not written).
  std::string to_json() const;
  /// Parses the file format. Error(invalid_argument) naming `origin` and what is wrong (bad JSON,
  /// unknown version, collective, algorithm or backend, a backend for a host transport or a host
  /// algorithm for a GPU one, a missing or negative field, min > max).
  static Table parse(const std::string& text, const std::string& origin);
  /// Reads and parses the file at `path` (origin: `path`). Error(invalid_argument) naming the file
  /// if it cannot be read, or as parse.
  static Table read(const std::string& path);
  /// Writes to_json() to `path`, making its missing directories. Error(system) naming the file if
  /// it cannot be written.
  void write(const std::string& path) const;
};

/// The per-user table file: $XDG_CACHE_HOME/tutti/tuning.json, else $HOME/.cache/tutti/tuning.json
/// ("" when neither variable is set).
std::string default_path();

/// Makes `table` the one automatic choices read in this process, in place of the file's; later
/// calls choose from it (choices made before are forgotten). Every rank must use the same table.
void use(Table table);

/// The table automatic choices read: the last one `use` gave, else the file's (loaded now if no
/// choice has loaded it yet; an empty table when there is no file). Error(invalid_argument) naming
/// the file TUTTI_TUNING_FILE names when it cannot be read or parsed, as init(). The reference
/// stays valid for the life of the process.
const Table& active();

/// Measures `comm`'s transport: α and β from ping-pongs of 8 B and 4 MiB between rank 0 and its
/// partner (the first rank on another host where the ranks span hosts, else rank 1), γ from the f32
/// sum kernel on one core; each the slowest rank's. Collective; with one rank, α = β = 0.
CostModel measure(Communicator& comm);

}  // namespace tuning
}  // namespace tutti
