// Tutti::torch's checkpoints (include/tutti/torch_checkpoint.hpp), taken and restored: a rank's
// snapshot, the writer thread, reading, verifying and restoring (checkpoint.cpp). What a checkpoint
// holds is in checkpoint_state.hpp, its files in checkpoint_format.hpp (their bytes in
// checkpoint_bytes.hpp, the file steps in checkpoint_files.hpp).
//
// How rank 0 learns that every shard is on disk without stalling training: the writer thread of
// every rank, after writing its shard, joins an allgather of (written, bytes, checksum) on a
// communicator of its own, split from the training communicator when the first checkpoint is
// taken and used by the writer threads only. Rank 0's writer then writes the MANIFEST and
// broadcasts whether it did, so every rank's wait_checkpoint() reports the same outcome. The
// training thread never takes part: a checkpoint costs it the copy of its shard only. (Confirming
// completion at the next step boundary instead would put a collective, and the wait for the
// slowest writer, on the training thread.) Calls on the two communicators never interleave: each
// has one thread issuing calls, as Communicator asks.
#pragma once

#include <torch/optim/optimizer.h>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <filesystem>
#include <functional>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

#include "libtorch/checkpoint_format.hpp"
#include "libtorch/checkpoint_state.hpp"
#include "tutti/torch_checkpoint.hpp"
#include "tutti/tutti.hpp"

namespace tutti::libtorch::detail {

/// One rank's part of a checkpoint, copied at the step boundary: what the writer thread needs.
struct CheckpointJob {
  std::string dir;
  std::vector<CheckpointEntry> mine;  // copies of the entries this rank writes
  Manifest manifest;                  // without the shards' sizes and checksums (rank 0 adds them)
  bool has_shard = true;              // false: this rank's snapshot failed, and its caller has the error
};

/// Copies this rank's share of the checkpoint of `params` and `optimizer` (see shard_owners), and
/// creates `dir`. Errors: Error(invalid_argument) for malformed metadata, a parameter name with
/// whitespace, or a `dir` that already holds a checkpoint; Error(system) if `dir` cannot be made;
/// Error(unsupported) from checkpoint_entries.
CheckpointJob snapshot_checkpoint(int rank, int world, const std::string& dir, const NamedTensors& params,
                                  torch::optim::Optimizer& optimizer, const CheckpointMetadata& metadata,
                                  const CheckpointExtras& extras = {});

/// Writes checkpoints in a thread of its own, one at a time (see the top of this file).
class CheckpointWriter {
 public:
  /// `comm`: used by the writer thread only, the same on every rank (a split of the training
  /// communicator).
  explicit CheckpointWriter(Communicator comm) : comm_(std::move(comm)) {}
  /// Waits for the write in flight; its error, if any, is reported on stderr (a destructor
  /// cannot throw it): call wait() before to get it.
  ~CheckpointWriter() {
    try {
      wait();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "tutti: error: %s\n", e.what());
    }
  }
  CheckpointWriter(const CheckpointWriter&) = delete;
  CheckpointWriter& operator=(const CheckpointWriter&) = delete;

  /// Waits for the previous write (throwing its error, and then not starting this one), then
  /// writes `job` in the background.
  void start(CheckpointJob job) {
    wait();
    thread_ = std::thread([this, job = std::move(job)]() mutable {
      try {
        write(job);
      } catch (...) {
        error_ = std::current_exception();
      }
    });
  }

  /// For a rank whose snapshot failed (its caller has the error): joins the writers' collectives
  /// without a shard, so that the other ranks' writers learn it rather than wait for it, and the
  /// writers' collectives stay matched for the next checkpoint.
  void start_without_shard() {
    CheckpointJob job;
    job.has_shard = false;
    start(std::move(job));
  }

  /// Waits until the write in flight is published (or failed) on every rank; throws its error.
  void wait() {
    if (thread_.joinable()) thread_.join();
    if (auto error = std::exchange(error_, nullptr)) std::rethrow_exception(error);
  }

 private:
  void write(CheckpointJob& job) {
    const int rank = comm_.rank(), world = comm_.size();
    std::uint64_t mine[3] = {0, 0, 0};  // written, bytes, checksum
    std::exception_ptr failure;
    try {
      if (!job.has_shard) throw Error(ErrorCode::aborted, "no snapshot");  // reported by checkpoint_async
      const std::string bytes = encode_shard(rank, world, job.mine);
      job.mine.clear();  // the snapshot's memory goes back before the write
      write_file_atomically(job.dir, shard_name(rank, world), bytes);
      mine[0] = 1;
      mine[1] = bytes.size();
      std::memcpy(&mine[2], bytes.data() + bytes.size() - 8, 8);
    } catch (...) {
      failure = std::current_exception();
    }
    std::vector<std::uint64_t> all(3 * static_cast<std::size_t>(world));
    comm_.allgather(mine, all.data(), 3, DataType::u64);
    std::string missing;
    for (int r = 0; r < world; ++r)
      if (all[3 * static_cast<std::size_t>(r)] == 0) missing += (missing.empty() ? "" : ", ") + std::to_string(r);
    std::uint64_t published = 0;
    if (rank == 0 && missing.empty()) {
      try {
        for (int r = 0; r < world; ++r)
          job.manifest.shards.push_back(
              {all[3 * static_cast<std::size_t>(r) + 1], all[3 * static_cast<std::size_t>(r) + 2]});
        write_file_atomically(job.dir, manifest_name, encode_manifest(job.manifest));
        published = 1;
      } catch (...) {
        failure = std::current_exception();
      }
    }
    comm_.broadcast(&published, 1, DataType::u64, 0);
    if (!job.has_shard) return;
    if (failure) std::rethrow_exception(failure);
    const std::string where = "tutti::libtorch checkpoint " + job.dir + " (rank " + std::to_string(rank) + "): ";
    if (!missing.empty())
      throw Error(ErrorCode::system, where + "rank(s) " + missing +
                                         " could not write their shards (see their "
                                         "errors); the checkpoint is not published");
    if (!published)
      throw Error(ErrorCode::system, where + "rank 0 could not write the MANIFEST (see its error); not published");
  }

  Communicator comm_;
  std::thread thread_;
  std::exception_ptr error_;
};

/// A checkpoint as read back: its MANIFEST and every tensor, by entry name.
struct CheckpointContents {
  Manifest manifest;
  std::map<std::string, torch::Tensor> tensors;
};

/// Reads and verifies dir's MANIFEST and all its shards; restores nothing. Only regular files are
/// read (read_checkpoint_file), each shard's size checked against the MANIFEST before it is read.
/// Errors: Error(invalid_argument) for an incomplete checkpoint (no MANIFEST) or a damaged or
/// refused file (checksum, size, structure, a link, a FIFO), naming the file; Error(mismatch)
/// for another world size.
CheckpointContents read_checkpoint(const std::string& dir, int world_size);

/// Checks `c` against `params` and `optimizer` (the optimizer's type, every parameter's name,
/// type and shape, every state field), then copies it into them: nothing is written unless all
/// of it fits. Error(mismatch) naming the first difference; Error(invalid_argument) for entries
/// that do not belong (a damaged checkpoint). `before_writing` runs once the checks passed (to
/// agree with the other ranks first: it may throw, and then nothing is written). Of `extras`
/// (restored as `rank`): every buffer must be there (Error(mismatch)); the compressor's state is
/// restored when the checkpoint was written with the same compression, else the compressor is
/// left as it is; the generator, when the checkpoint has this rank's. Other ranks' entries are
/// passed over.
void restore_checkpoint(CheckpointContents c, const std::string& dir, const NamedTensors& params,
                        torch::optim::Optimizer& optimizer, const std::function<void()>& before_writing,
                        const CheckpointExtras& extras = {}, int rank = 0);

/// Makes the ranks of `comm` agree on whether each could load `dir` (collective): returns if none
/// failed, else throws on every rank the same Error, the one of the lowest rank that failed (its
/// code and message, truncated to a kilobyte), naming it and the other ranks that failed.
void agree_on_load(Communicator& comm, const std::string& dir, const std::exception_ptr& failure);

/// Reads `dir` on every rank of `comm` and restores it into `params` and `optimizer` (collective).
/// The ranks agree before anything is written: either every rank restores, or every rank throws
/// the same Error (agree_on_load: the first failing rank's, from read_checkpoint or
/// restore_checkpoint). Returns the checkpoint's metadata.
CheckpointMetadata load_checkpoint(Communicator& comm, const std::string& dir, const NamedTensors& params,
                                   torch::optim::Optimizer& optimizer, const CheckpointExtras& extras = {});

/// The "optimizer_steps" a MANIFEST records (0 without); Error(invalid_argument) naming `path`
/// for one that is not a number.
long long optimizer_steps_of(const Manifest& manifest, const std::string& path);

}  // namespace tutti::libtorch::detail
