#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>

#include "tutti/compress.hpp"

namespace tutti::compress {

void top_k(const float* in, std::size_t count, std::size_t k, std::uint32_t* indices, float* values) {
  if (k > count)
    throw Error(ErrorCode::invalid_argument,
                "top_k: k = " + std::to_string(k) + " is more than the " + std::to_string(count) + " elements");
  if (k > 0 && (in == nullptr || indices == nullptr || values == nullptr))
    throw Error(ErrorCode::invalid_argument, "top_k: null buffer with k = " + std::to_string(k));
  if (count > UINT32_MAX)
    throw Error(ErrorCode::invalid_argument, "top_k: " + std::to_string(count) + " elements do not fit u32 indices");
  if (k == 0) return;
  std::vector<std::uint32_t> order(count);
  std::iota(order.begin(), order.end(), 0u);
  // A strict total order: NaN first, then larger magnitude, then lower index.
  auto before = [in](std::uint32_t a, std::uint32_t b) {
    const float x = std::fabs(in[a]), y = std::fabs(in[b]);
    const bool nx = std::isnan(x), ny = std::isnan(y);
    if (nx != ny) return nx;
    if (!nx && x != y) return x > y;
    return a < b;
  };
  std::nth_element(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(k - 1), order.end(), before);
  std::sort(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(k));
  for (std::size_t j = 0; j < k; ++j) {
    indices[j] = order[j];
    values[j] = in[order[j]];
  }
}

}  // namespace tutti::compress
