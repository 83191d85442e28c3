// libtorch glue: checkpoints of parameters and optimizer state, written in the background while
// training goes on (DistributedOptimizer::checkpoint_async, ShardedOptimizer::checkpoint_async),
// read back (their load_checkpoint), and found (latest_checkpoint). Part of <tutti/torch.hpp>
// (the library Tutti::torch: src/libtorch/checkpoint*.cpp). docs/training.md, "Checkpoints", is
// the user's page; docs/security.md, "Checkpoint directory", says what a writer of the directory
// can and cannot do.
#pragma once

#include <torch/types.h>

#include <map>
#include <optional>
#include <string>

#include "tutti/tutti.hpp"

namespace tutti::libtorch {

/// A copy of the state of torch's default CPU generator (what checkpoints keep of each rank's
/// randomness), and setting it back.
torch::Tensor cpu_generator_state();
void set_cpu_generator_state(const torch::Tensor& state);

/// What a checkpoint carries beside the tensors (an epoch, a position in the data): keys and
/// values non-empty and without whitespace. "optimizer_steps" is the optimizer's own.
using CheckpointMetadata = std::map<std::string, std::string>;

/// The subdirectory of `dir` holding the complete checkpoint with the most optimizer steps (the
/// "optimizer_steps" of its MANIFEST), or nullopt when none has a valid MANIFEST (or `dir` does
/// not exist). Subdirectories without a MANIFEST are checkpoints that never completed and are
/// passed over in silence; a MANIFEST that is damaged or refused (not a regular file) is named in
/// a warning on stderr and passed over. Shards are verified when it is loaded. Looks on this
/// process only: a job uses the collective overload below, so that its ranks load the same one.
std::optional<std::string> latest_checkpoint(const std::string& dir);

/// latest_checkpoint(dir) as the ranks of `comm` agree on it (collective): rank 0 looks and
/// broadcasts what it chose, so that a checkpoint published while the ranks start does not make
/// them load different ones. Throws on every rank the same Error(invalid_argument) when `dir`
/// is not a directory (a --resume of a path that does not exist is a mistake, not a fresh start).
std::optional<std::string> latest_checkpoint(Communicator& comm, const std::string& dir);

}  // namespace tutti::libtorch
