// What the vocabulary of <tutti/types.hpp> says besides its names (`to_string` and the
// `*_from_name` readers are public there).
#pragma once

#include "tutti/types.hpp"

namespace tutti::core {

/// Whether collective `c` has a root (reduce, broadcast, gather, scatter).
constexpr bool has_root(Collective c) {
  return c == Collective::reduce || c == Collective::broadcast || c == Collective::gather || c == Collective::scatter;
}

}  // namespace tutti::core
