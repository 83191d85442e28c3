// libtorch glue: checkpoints of parameters and optimizer state, written in the background while
// training goes on (DistributedOptimizer::checkpoint_async), and read back (load_checkpoint).
// Part of <tutti/torch.hpp>, which users include: header-only, CPU tensors only. What a
// checkpoint holds is in torch_checkpoint_state.hpp, its files in torch_checkpoint_format.hpp
// (their bytes in torch_checkpoint_bytes.hpp, the file steps in torch_checkpoint_files.hpp);
// docs/training.md, "Checkpoints", is the user's page; docs/security.md, "Checkpoint directory",
// says what a writer of the directory can and cannot do.
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

#include <torch/optim/optimizer.h>

#include "tutti/torch_broadcast.hpp"
#include "tutti/torch_checkpoint_format.hpp"
#include "tutti/torch_checkpoint_state.hpp"
#include "tutti/tutti.hpp"

namespace tutti::torch {

/// What a checkpoint carries beside the tensors (an epoch, a position in the data): keys and
/// values non-empty and without whitespace. "optimizer_steps" is the optimizer's own.
using CheckpointMetadata = std::map<std::string, std::string>;

namespace detail {

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
inline CheckpointJob snapshot_checkpoint(int rank, int world, const std::string& dir, const NamedTensors& params,
                                         ::torch::optim::Optimizer& optimizer, const CheckpointMetadata& metadata) {
  const std::string where = "tutti::torch checkpoint " + dir + " (rank " + std::to_string(rank) + "): ";
  auto plain = [](const std::string& s) { return !s.empty() && s.find_first_of(" \t\r\n\v\f") == std::string::npos; };
  CheckpointJob job{dir, {}, {}};
  job.manifest.world_size = world;
  job.manifest.optimizer = optimizer_type(optimizer);
  for (const auto& [key, value] : metadata) {
    if (!plain(key) || !plain(value))
      throw Error(ErrorCode::invalid_argument, where + "metadata '" + key + "' = '" + value +
                                                   "': keys and values must be non-empty, without whitespace");
    job.manifest.metadata[key] = value;
  }
  for (const auto& [name, t] : params) {
    if (!plain(name)) throw Error(ErrorCode::invalid_argument, where + "parameter name '" + name + "' has whitespace");
    job.manifest.params.emplace_back(name, shape_of(t));
  }
  if (name_exists(dir + "/" + manifest_name))
    throw Error(ErrorCode::invalid_argument, where + "the directory already holds a checkpoint");
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) throw Error(ErrorCode::system, where + "cannot create the directory: " + ec.message());
  open_checkpoint_dir(dir);  // refused now rather than by the writer thread (which checks again)
  const auto entries = checkpoint_entries(params, optimizer);
  const auto owners = shard_owners(entries, world);
  for (std::size_t i = 0; i < entries.size(); ++i)
    if (owners[i] == rank)
      job.mine.push_back({entries[i].name, entries[i].tensor.detach().clone(::torch::MemoryFormat::Contiguous)});
  return job;
}

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
    const std::string where = "tutti::torch checkpoint " + job.dir + " (rank " + std::to_string(rank) + "): ";
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
  std::map<std::string, ::torch::Tensor> tensors;
};

/// Reads and verifies dir's MANIFEST and all its shards; restores nothing. Only regular files are
/// read (read_checkpoint_file), each shard's size checked against the MANIFEST before it is read.
/// Errors: Error(invalid_argument) for an incomplete checkpoint (no MANIFEST) or a damaged or
/// refused file (checksum, size, structure, a link, a FIFO), naming the file; Error(mismatch)
/// for another world size.
inline CheckpointContents read_checkpoint(const std::string& dir, int world_size) {
  const std::string manifest_path = dir + "/" + manifest_name;
  if (!name_exists(manifest_path))
    throw Error(ErrorCode::invalid_argument,
                "tutti::torch checkpoint " + dir + " is incomplete: no MANIFEST (its writing never finished)");
  CheckpointContents c{decode_manifest(read_checkpoint_file(manifest_path, max_manifest_bytes), manifest_path), {}};
  if (c.manifest.world_size != world_size)
    throw Error(ErrorCode::mismatch, "tutti::torch checkpoint " + dir + " was written by " +
                                         std::to_string(c.manifest.world_size) + " ranks, this job has " +
                                         std::to_string(world_size));
  for (int r = 0; r < world_size; ++r) {
    const std::string path = dir + "/" + shard_name(r, world_size);
    const auto& expected = c.manifest.shards[static_cast<std::size_t>(r)];
    const std::string bytes = read_checkpoint_file(path, expected.bytes, expected.bytes);
    std::uint64_t checksum = 0;
    if (bytes.size() >= 8) std::memcpy(&checksum, bytes.data() + bytes.size() - 8, 8);
    if (checksum != expected.checksum)
      throw Error(ErrorCode::invalid_argument, "tutti::torch checkpoint: shard " + path +
                                                   " is damaged: it is not the shard its MANIFEST names (checksum)");
    for (auto& e : decode_shard(bytes, path, r, world_size))
      if (!c.tensors.emplace(e.name, std::move(e.tensor)).second)
        throw Error(ErrorCode::invalid_argument,
                    "tutti::torch checkpoint: " + path + " is damaged: entry " + e.name + " is in two shards");
  }
  return c;
}

/// Checks `c` against `params` and `optimizer` (the optimizer's type, every parameter's name,
/// type and shape, every state field), then copies it into them: nothing is written unless all
/// of it fits. Error(mismatch) naming the first difference; Error(invalid_argument) for entries
/// that do not belong (a damaged checkpoint). `before_writing` runs once the checks passed (to
/// agree with the other ranks first: it may throw, and then nothing is written).
inline void restore_checkpoint(CheckpointContents c, const std::string& dir, const NamedTensors& params,
                               ::torch::optim::Optimizer& optimizer, const std::function<void()>& before_writing) {
  const std::string where = "tutti::torch checkpoint " + dir + ": ";
  if (c.manifest.optimizer != optimizer_type(optimizer))
    throw Error(ErrorCode::mismatch,
                where + "written for " + c.manifest.optimizer + ", not " + optimizer_type(optimizer));
  for (std::size_t i = 0; i < std::max(params.size(), c.manifest.params.size()); ++i) {
    const std::string mine = i < params.size() ? params[i].first + " " + shape_of(params[i].second) : "nothing";
    const auto& theirs = c.manifest.params;
    const std::string saved = i < theirs.size() ? theirs[i].first + " " + theirs[i].second : "nothing";
    if (mine != saved)
      throw Error(ErrorCode::mismatch, where + "written for another model: parameter " + std::to_string(i) + " is " +
                                           saved + " there, " + mine + " here");
  }
  auto take = [&](const std::string& name, const ::torch::Tensor& like) {
    auto it = c.tensors.find(name);
    if (it == c.tensors.end()) return ::torch::Tensor();
    if (it->second.sizes() != like.sizes() || it->second.scalar_type() != like.scalar_type())
      throw Error(ErrorCode::invalid_argument,
                  where + "damaged: " + name + " is " + shape_of(it->second) + ", expected " + shape_of(like));
    return c.tensors.extract(it).mapped();
  };
  std::vector<::torch::Tensor> values;
  for (const auto& [name, t] : params) {
    values.push_back(take("param/" + name, t));
    if (!values.back().defined()) throw Error(ErrorCode::invalid_argument, where + "damaged: no entry for " + name);
  }
  const auto codec = state_codec(optimizer);
  std::vector<std::map<std::string, ::torch::Tensor>> states(params.size());
  for (std::size_t i = 0; codec && i < params.size(); ++i)
    for (const auto& field : codec->fields) {
      auto value = take("state/" + params[i].first + "/" + field,
                        field == "step" ? ::torch::zeros({1}, ::torch::kInt64) : params[i].second);
      if (value.defined()) states[i][field] = value;
    }
  const auto kind = kind_of(optimizer);
  std::vector<std::vector<double>> groups;
  for (std::size_t g = 0; g < optimizer.param_groups().size(); ++g) {
    const auto options = group_options(kind, optimizer.param_groups()[g].options());
    auto value = take("group/" + std::to_string(g), ::torch::tensor(options, ::torch::kFloat64));
    if (!value.defined()) throw Error(ErrorCode::mismatch, where + "no options for param group " + std::to_string(g));
    groups.emplace_back(value.data_ptr<double>(), value.data_ptr<double>() + value.numel());
  }
  if (!c.tensors.empty())
    throw Error(ErrorCode::invalid_argument, where + "entry " + c.tensors.begin()->first + " belongs to nothing here");
  for (std::size_t i = 0; i < states.size(); ++i)
    if (!states[i].empty() && codec->fields.front() == "step" && !states[i].count("step"))
      throw Error(ErrorCode::invalid_argument, where + "damaged: the state of " + params[i].first + " has no step");
  before_writing();

  ::torch::NoGradGuard no_grad;
  for (std::size_t i = 0; i < params.size(); ++i) {
    params[i].second.copy_(values[i]);
    if (states[i].empty())
      optimizer.state().erase(state_key(params[i].second));
    else
      optimizer.state()[state_key(params[i].second)] = codec->make(states[i]);
  }
  for (std::size_t g = 0; g < groups.size(); ++g)
    set_group_options(kind, optimizer.param_groups()[g].options(), groups[g]);
}

/// Makes the ranks of `comm` agree on whether each could load `dir` (collective): returns if none
/// failed, else throws on every rank the same Error, the one of the lowest rank that failed (its
/// code and message, truncated to a kilobyte), naming it and the other ranks that failed.
inline void agree_on_load(Communicator& comm, const std::string& dir, const std::exception_ptr& failure) {
  constexpr std::size_t text_bytes = 1024, record = 4 + text_bytes;  // i32 code + 1 (0: loaded), text
  std::string mine(record, '\0');
  if (failure) {
    std::int32_t code = static_cast<std::int32_t>(ErrorCode::system) + 1;
    std::string text;
    try {
      std::rethrow_exception(failure);
    } catch (const Error& e) {
      code = static_cast<std::int32_t>(e.code()) + 1;
      text = e.what();
    } catch (const std::exception& e) {
      text = e.what();
    } catch (...) {
      text = "an unknown exception";
    }
    std::memcpy(mine.data(), &code, 4);
    text.copy(mine.data() + 4, text_bytes - 1);
  }
  std::string all(record * static_cast<std::size_t>(comm.size()), '\0');
  comm.allgather(mine.data(), all.data(), record, DataType::u8);
  std::optional<std::size_t> first;
  std::string others;
  for (std::size_t r = 0; r < static_cast<std::size_t>(comm.size()); ++r) {
    std::int32_t code;
    std::memcpy(&code, all.data() + r * record, 4);
    if (code == 0) continue;
    if (first) others += (others.empty() ? "" : ", ") + std::to_string(r);
    if (!first) first = r;
  }
  if (!first) return;
  const char* record_of_first = all.data() + *first * record;
  std::int32_t code;
  std::memcpy(&code, record_of_first, 4);
  const auto known = code >= 1 && code <= static_cast<std::int32_t>(ErrorCode::system) + 1;
  const std::string text(record_of_first + 4, ::strnlen(record_of_first + 4, text_bytes));  // bounded by the record
  throw Error(known ? static_cast<ErrorCode>(code - 1) : ErrorCode::system,
              "tutti::torch checkpoint " + dir + ": nothing restored on any rank: rank " + std::to_string(*first) +
                  " could not load it" + (others.empty() ? "" : " (nor could rank(s) " + others + ")") + ": " + text);
}

/// Reads `dir` on every rank of `comm` and restores it into `params` and `optimizer` (collective).
/// The ranks agree before anything is written: either every rank restores, or every rank throws
/// the same Error (agree_on_load: the first failing rank's, from read_checkpoint or
/// restore_checkpoint). Returns the checkpoint's metadata.
inline CheckpointMetadata load_checkpoint(Communicator& comm, const std::string& dir, const NamedTensors& params,
                                          ::torch::optim::Optimizer& optimizer) {
  bool agreed = false;
  try {
    auto contents = read_checkpoint(dir, comm.size());
    CheckpointMetadata metadata = contents.manifest.metadata;
    restore_checkpoint(std::move(contents), dir, params, optimizer, [&] {
      agreed = true;
      agree_on_load(comm, dir, nullptr);
    });
    return metadata;
  } catch (...) {
    if (agreed) throw;
    agreed = true;
    agree_on_load(comm, dir, std::current_exception());
    throw;  // not reached: agree_on_load throws when a rank failed
  }
}

/// The "optimizer_steps" a MANIFEST records (0 without); Error(invalid_argument) naming `path`
/// for one that is not a number.
inline long long optimizer_steps_of(const Manifest& manifest, const std::string& path) {
  const auto it = manifest.metadata.find("optimizer_steps");
  if (it == manifest.metadata.end()) return 0;
  try {
    return std::stoll(it->second);
  } catch (const std::logic_error&) {
    throw Error(ErrorCode::invalid_argument, "checkpoint: " + path + " is damaged: optimizer_steps is not a number");
  }
}

}  // namespace detail

/// The subdirectory of `dir` holding the complete checkpoint with the most optimizer steps (the
/// "optimizer_steps" of its MANIFEST), or nullopt when none has a valid MANIFEST (or `dir` does
/// not exist). Subdirectories without a MANIFEST are checkpoints that never completed and are
/// passed over in silence; a MANIFEST that is damaged or refused (not a regular file) is named in
/// a warning on stderr and passed over. Shards are verified when it is loaded. Looks on this
/// process only: a job uses the collective overload below, so that its ranks load the same one.
inline std::optional<std::string> latest_checkpoint(const std::string& dir) {
  std::optional<std::string> best;
  long long best_steps = -1;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    const std::string path = entry.path().string() + "/" + detail::manifest_name;
    if (!detail::name_exists(path)) continue;
    try {
      const auto manifest =
          detail::decode_manifest(detail::read_checkpoint_file(path, detail::max_manifest_bytes), path);
      const long long steps = detail::optimizer_steps_of(manifest, path);
      if (steps > best_steps) {
        best_steps = steps;
        best = entry.path().string();
      }
    } catch (const std::exception& e) {
      std::fprintf(stderr, "tutti: warning: checkpoint passed over: %s\n", e.what());
    }
  }
  return best;
}

/// latest_checkpoint(dir) as the ranks of `comm` agree on it (collective): rank 0 looks and
/// broadcasts what it chose, so that a checkpoint published while the ranks start does not make
/// them load different ones. Throws on every rank the same Error(invalid_argument) when `dir`
/// is not a directory (a --resume of a path that does not exist is a mistake, not a fresh start).
inline std::optional<std::string> latest_checkpoint(Communicator& comm, const std::string& dir) {
  std::uint64_t head[2] = {0, 0};  // 0: none, 1: found, 2: error; bytes of the text
  std::string text;
  if (comm.rank() == 0) {
    try {
      std::error_code ec;
      if (!std::filesystem::is_directory(dir, ec))
        throw Error(ErrorCode::invalid_argument,
                    "tutti::torch checkpoint directory " + dir + " does not exist or is not a directory");
      if (auto best = latest_checkpoint(dir)) {
        head[0] = 1;
        text = *best;
      }
    } catch (const std::exception& e) {  // shared, so that every rank throws it
      head[0] = 2;
      text = std::string(e.what()) + " (rank 0)";
    }
    head[1] = text.size();
  }
  comm.broadcast(head, 2, DataType::u64, 0);
  text.resize(static_cast<std::size_t>(head[1]));
  if (!text.empty()) comm.broadcast(text.data(), text.size(), DataType::u8, 0);
  if (head[0] == 2) throw Error(ErrorCode::invalid_argument, text);
  if (head[0] == 1) return text;
  return std::nullopt;
}

}  // namespace tutti::torch
