#include <algorithm>
#include <bit>
#include <functional>
#include <string>

#include "tutti/compress.hpp"

namespace tutti::compress {

void top_k(const float* in, std::size_t count, std::size_t k, std::uint32_t* indices, float* values) {
  if (k > count)
    throw Error(ErrorCode::invalid_argument,
                "top_k: k = " + std::to_string(k) + " is more than the " + std::to_string(count) + " elements");
  if (k > 0 && (in == nullptr || indices == nullptr))
    throw Error(ErrorCode::invalid_argument, "top_k: null buffer with k = " + std::to_string(k));
  if (count > UINT32_MAX)
    throw Error(ErrorCode::invalid_argument, "top_k: " + std::to_string(count) + " elements do not fit u32 indices");
  if (k == 0) return;
  // One 64-bit key per element: |x|'s bits above (as unsigned integers they order by magnitude,
  // and NaNs, whose bits are above infinity's, first), the complement of the index below (so the
  // lower index wins a tie). The largest k keys are the top k; a key comparison is one integer
  // compare, which makes the selection several times faster than comparing floats and indices.
  std::vector<std::uint64_t> keys(count);
  for (std::size_t i = 0; i < count; ++i) {
    const std::uint64_t magnitude = std::bit_cast<std::uint32_t>(in[i]) & 0x7fffffffu;
    keys[i] = magnitude << 32 | (0xffffffffu - static_cast<std::uint32_t>(i));
  }
  std::nth_element(keys.begin(), keys.begin() + static_cast<std::ptrdiff_t>(k - 1), keys.end(),
                   std::greater<std::uint64_t>());
  for (std::size_t j = 0; j < k; ++j) indices[j] = 0xffffffffu - static_cast<std::uint32_t>(keys[j]);
  std::sort(indices, indices + k);
  if (values != nullptr)
    for (std::size_t j = 0; j < k; ++j) values[j] = in[indices[j]];
}

}  // namespace tutti::compress
