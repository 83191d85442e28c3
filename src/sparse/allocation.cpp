#include "sparse/allocation.hpp"

#include <sys/sysinfo.h>

#include <limits>
#include <string>

#include "tutti/tutti.hpp"

namespace tutti::sparse::detail {

std::size_t allocation_limit() {
  struct sysinfo info {};
  if (::sysinfo(&info) != 0) return std::numeric_limits<std::size_t>::max();
  const auto total = (static_cast<unsigned __int128>(info.totalram) + info.totalswap) * info.mem_unit;
  return total > std::numeric_limits<std::size_t>::max() ? std::numeric_limits<std::size_t>::max()
                                                         : static_cast<std::size_t>(total);
}

void check_allocation(std::size_t count, std::size_t element_bytes, std::string_view what, std::string_view operation,
                      int rank) {
  const auto bytes = static_cast<unsigned __int128>(count) * element_bytes;
  const std::size_t limit = allocation_limit();
  if (bytes <= limit) return;
  const std::string size = bytes > std::numeric_limits<std::size_t>::max()
                               ? "more than 2^64"
                               : std::to_string(static_cast<std::size_t>(bytes));
  throw Error(ErrorCode::invalid_argument,
              std::string(operation) + " (rank " + std::to_string(rank) + "): " + std::string(what) + " (" +
                  std::to_string(count) + " elements of " + std::to_string(element_bytes) + " bytes: " + size +
                  " bytes) exceeds this host's memory (" + std::to_string(limit) + " bytes of RAM and swap)");
}

}  // namespace tutti::sparse::detail
