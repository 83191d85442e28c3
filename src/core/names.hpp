// Reading the vocabulary's names back (TUTTI_ALGO, tuning files, command lines); `to_string`
// in <tutti/types.hpp> writes them, from the same tables.
#pragma once

#include <optional>
#include <string_view>

#include "tutti/types.hpp"

namespace tutti::core {

/// The algorithm `to_string` spells `name` ("ring", "recursive_doubling", ...), if any.
std::optional<Algorithm> algorithm_from_name(std::string_view name);
/// The collective `to_string` spells `name` ("allreduce", "reduce_scatter", ...), if any.
std::optional<Collective> collective_from_name(std::string_view name);
/// The data type `to_string` spells `name` ("f32", "bf16", ...), if any.
std::optional<DataType> data_type_from_name(std::string_view name);

/// Whether collective `c` has a root (reduce, broadcast, gather, scatter).
constexpr bool has_root(Collective c) {
  return c == Collective::reduce || c == Collective::broadcast || c == Collective::gather || c == Collective::scatter;
}

}  // namespace tutti::core
