// libtorch glue: a checkpoint's shards as tensors (docs/training.md, "Checkpoints"). The byte
// layout and its checks are in torch_checkpoint_bytes.hpp (no libtorch, so that it is fuzzed),
// the file steps in torch_checkpoint_files.hpp. Part of <tutti/torch.hpp>; header-only.
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

#include "tutti/torch_checkpoint_bytes.hpp"
#include "tutti/torch_checkpoint_files.hpp"
#include "tutti/tutti.hpp"

namespace tutti::torch::detail {

/// One named tensor of a checkpoint (a parameter, a field of its optimizer state, a group's options).
struct CheckpointEntry {
  std::string name;
  ::torch::Tensor tensor;  // contiguous, CPU
};

/// The element size of the scalar types a checkpoint may hold (plain numbers: what parameters,
/// optimizer state and options are), 0 for any other: a shard naming a quantized or an unknown
/// type is refused before libtorch sees it.
inline std::size_t checkpoint_element_size(std::int32_t type) {
  using S = c10::ScalarType;
  if (type < 0 || type >= static_cast<std::int32_t>(S::NumOptions)) return 0;  // the cast below would wrap
  switch (static_cast<S>(type)) {
    case S::Byte:
    case S::Char:
    case S::Short:
    case S::Int:
    case S::Long:
    case S::Half:
    case S::Float:
    case S::Double:
    case S::ComplexFloat:
    case S::ComplexDouble:
    case S::Bool:
    case S::BFloat16:
      return c10::elementSize(static_cast<S>(type));
    default:
      return 0;
  }
}

/// The shard file's bytes, its checksum trailer included.
inline std::string encode_shard(int rank, int world, const std::vector<CheckpointEntry>& entries) {
  std::string out = shard_header(rank, world, entries.size());
  for (const auto& e : entries)
    put_shard_entry(out, e.name, static_cast<std::int32_t>(e.tensor.scalar_type()), e.tensor.sizes().vec(),
                    std::string_view(static_cast<const char*>(e.tensor.data_ptr()), e.tensor.nbytes()));
  seal_shard(out);
  return out;
}

/// The entries of a shard file, verified (parse_shard) and copied out of `bytes`.
/// Throws Error(invalid_argument) naming `path` for a damaged file, Error(mismatch) when it is
/// not the shard `rank` of `world`.
inline std::vector<CheckpointEntry> decode_shard(std::string_view bytes, const std::string& path, int rank, int world) {
  std::vector<CheckpointEntry> entries;
  for (const auto& view : parse_shard(bytes, path, rank, world, checkpoint_element_size)) {
    auto tensor = ::torch::empty(view.sizes, ::torch::TensorOptions().dtype(static_cast<c10::ScalarType>(view.type)));
    std::memcpy(tensor.data_ptr(), view.data.data(), view.data.size());
    entries.push_back({view.name, std::move(tensor)});
  }
  return entries;
}

}  // namespace tutti::torch::detail
