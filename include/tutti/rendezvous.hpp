// Joining a job through a key-value store the caller already has (torch.distributed's c10d::Store,
// a framework's own rendezvous), instead of the TUTTI_STORE that tutti::init() reads.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

#include "tutti/tutti.hpp"

namespace tutti {

/// A key-value store shared by the ranks of one job, provided by the caller. Keys Tutti writes
/// start with "tutti/"; give each communicator a store (or prefix) of its own.
class KeyValueStore {
 public:
  virtual ~KeyValueStore() = default;
  /// Sets `key` to `value` (overwrites).
  virtual void set(const std::string& key, const std::string& value) = 0;
  /// The value of `key`, waiting until some rank sets it; throws Error(timeout) after `timeout`.
  virtual std::string get(const std::string& key, std::chrono::milliseconds timeout) = 0;
  /// Atomically adds `delta` to the integer at `key` (absent = 0) and returns the new value.
  virtual std::int64_t add(const std::string& key, std::int64_t delta) = 0;
};

/// Joins the job of `size` ranks as `rank`, exchanging addresses through `store` (every rank calls
/// it with the same store and size). The transport is chosen as tutti::init() chooses it (shared
/// memory on one host, TCP across hosts with TUTTI_TOKEN; TUTTI_TRANSPORT forces shm or tcp), and
/// `timeout` (0: TUTTI_TIMEOUT_MS) bounds the rendezvous. Throws Error(invalid_argument) for a bad
/// rank or size, Error(unsupported) for TUTTI_TRANSPORT=mpi, the store's errors, and Error(timeout)
/// when a rank does not arrive in time.
Communicator init(KeyValueStore& store, int rank, int size, std::chrono::milliseconds timeout = {});

}  // namespace tutti
