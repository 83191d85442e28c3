// libtorch glue: a checkpoint's shards as tensors (docs/training.md, "Checkpoints"). The byte
// layout and its checks are in checkpoint_bytes.hpp (no libtorch, so that it is fuzzed),
// the file steps in checkpoint_files.hpp. Private to Tutti::torch (checkpoint_format.cpp).
//
// A checkpoint is a directory holding one shard per rank (`shard-R-of-P`, binary) and a
// `MANIFEST` (text) that rank 0 writes last, once every shard is known to be on disk. Every file
// is written under a temporary name, fsynced, renamed and its directory fsynced, so a directory
// without a MANIFEST is a checkpoint that never completed, and a MANIFEST names only shards that
// were complete (it records their sizes and checksums).
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include <torch/types.h>

#include "libtorch/checkpoint_bytes.hpp"
#include "libtorch/checkpoint_files.hpp"
#include "tutti/tutti.hpp"

namespace tutti::libtorch::detail {

/// One named tensor of a checkpoint (a parameter, a field of its optimizer state, a group's options).
struct CheckpointEntry {
  std::string name;
  torch::Tensor tensor;  // contiguous, CPU
};

/// The element size of the scalar types a checkpoint may hold (plain numbers: what parameters,
/// optimizer state and options are), 0 for any other: a shard naming a quantized or an unknown
/// type is refused before libtorch sees it.
std::size_t checkpoint_element_size(std::int32_t type);

/// The shard file's bytes, its checksum trailer included.
std::string encode_shard(int rank, int world, const std::vector<CheckpointEntry>& entries);

/// The entries of a shard file, verified (parse_shard) and copied out of `bytes`.
/// Throws Error(invalid_argument) naming `path` for a damaged file, Error(mismatch) when it is
/// not the shard `rank` of `world`.
std::vector<CheckpointEntry> decode_shard(std::string_view bytes, const std::string& path, int rank, int world);

}  // namespace tutti::libtorch::detail
