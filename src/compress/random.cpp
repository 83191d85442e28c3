#include "compress/random.hpp"

namespace tutti::compress {

double uniform(const RandomKey& key, std::uint64_t counter) { return detail::CounterRandom(key)(counter); }

std::uint64_t stream_of(std::string_view text) {
  std::uint64_t h = 0xcbf29ce484222325ull;  // FNV-1a, 64 bits
  for (const char c : text) {
    h ^= static_cast<unsigned char>(c);
    h *= 0x100000001b3ull;
  }
  return h;
}

}  // namespace tutti::compress
