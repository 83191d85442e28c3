#include "compress/random.hpp"

#include "tutti/types.hpp"

namespace tutti::compress {

double uniform(const RandomKey& key, std::uint64_t counter) { return detail::CounterRandom(key)(counter); }

std::uint64_t stream_of(std::string_view text) { return tutti::detail::fnv1a(text); }

}  // namespace tutti::compress
