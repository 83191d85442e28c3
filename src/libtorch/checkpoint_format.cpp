// The checkpoint_format.hpp functions.
#include <torch/types.h>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include "libtorch/checkpoint_bytes.hpp"
#include "libtorch/checkpoint_files.hpp"
#include "libtorch/checkpoint_format.hpp"
#include "tutti/tutti.hpp"

namespace tutti::libtorch::detail {

std::size_t checkpoint_element_size(std::int32_t type) {
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

std::string encode_shard(int rank, int world, const std::vector<CheckpointEntry>& entries) {
  std::string out = shard_header(rank, world, entries.size());
  for (const auto& e : entries)
    put_shard_entry(out, e.name, static_cast<std::int32_t>(e.tensor.scalar_type()), e.tensor.sizes().vec(),
                    std::string_view(static_cast<const char*>(e.tensor.data_ptr()), e.tensor.nbytes()));
  seal_shard(out);
  return out;
}

std::vector<CheckpointEntry> decode_shard(std::string_view bytes, const std::string& path, int rank, int world) {
  std::vector<CheckpointEntry> entries;
  for (const auto& view : parse_shard(bytes, path, rank, world, checkpoint_element_size)) {
    auto tensor = torch::empty(view.sizes, torch::TensorOptions().dtype(static_cast<c10::ScalarType>(view.type)));
    std::memcpy(tensor.data_ptr(), view.data.data(), view.data.size());
    entries.push_back({view.name, std::move(tensor)});
  }
  return entries;
}

}  // namespace tutti::libtorch::detail
