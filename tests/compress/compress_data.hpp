// Test data of the compress suites.
#pragma once

#include <cstddef>
#include <cstring>
#include <random>
#include <vector>

namespace tutti::testing {

/// n standard normal floats from a fixed generator: the same vector for the same seed, so that a
/// test can rebuild any rank's input to compute its reference.
inline std::vector<float> random_vector(std::size_t n, unsigned seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = normal(gen);
  return v;
}

/// Whether two float vectors hold the same bits (NaNs and signed zeros included).
inline bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

}  // namespace tutti::testing
