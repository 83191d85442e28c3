// The counter-based generator behind compress::uniform, with the key folded once: SplitMix64's
// finalizer over (key, counter). Counter-based rather than sequential so that element i's number
// needs no state, and every rank, thread or rerun that asks for (key, i) gets the same one.
#pragma once

#include <cstdint>

#include "tutti/compress.hpp"

namespace tutti::compress::detail {

constexpr std::uint64_t mix(std::uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebull;
  x ^= x >> 31;
  return x;
}

class CounterRandom {
 public:
  explicit CounterRandom(const RandomKey& key) {
    h_ = mix(key.seed + kGolden);
    h_ = mix(h_ ^ (static_cast<std::uint64_t>(key.rank) + kGolden));
    h_ = mix(h_ ^ (key.step + kGolden));
    h_ = mix(h_ ^ (key.stream + kGolden));
  }
  /// A uniform double in [0, 1), 53 random bits.
  double operator()(std::uint64_t counter) const {
    return static_cast<double>(mix(h_ + (counter + 1) * kGolden) >> 11) * 0x1p-53;
  }

 private:
  static constexpr std::uint64_t kGolden = 0x9e3779b97f4a7c15ull;
  std::uint64_t h_ = 0;
};

}  // namespace tutti::compress::detail
