// Algorithm choice. For now a size rule (a latency algorithm for small messages, a bandwidth
// algorithm for large ones); TUTTI_ALGO forces an algorithm per collective, as NCCL_ALGO does.
#include <map>
#include <mutex>
#include <string>

#include "comm/comm_impl.hpp"
#include "core/env.hpp"
#include "core/log.hpp"

namespace tutti::detail {

using schedule::Collective;

namespace {

constexpr std::size_t small_bytes = 64 * 1024;
constexpr std::size_t medium_bytes = 512 * 1024;

Algorithm parse_algorithm(const std::string& name) {
  for (int a = static_cast<int>(Algorithm::automatic); a <= static_cast<int>(Algorithm::mpi); ++a)
    if (to_string(static_cast<Algorithm>(a)) == name) return static_cast<Algorithm>(a);
  throw Error(ErrorCode::invalid_argument, "TUTTI_ALGO: unknown algorithm '" + name + "'");
}

Collective parse_collective(const std::string& name) {
  for (int c = static_cast<int>(Collective::allreduce); c <= static_cast<int>(Collective::barrier); ++c)
    if (schedule::to_string(static_cast<Collective>(c)) == name) return static_cast<Collective>(c);
  throw Error(ErrorCode::invalid_argument, "TUTTI_ALGO: unknown collective '" + name + "'");
}

// TUTTI_ALGO="allreduce:ring,allgather:bruck", parsed once.
const std::map<Collective, Algorithm>& forced_by_environment() {
  static const std::map<Collective, Algorithm> forced = [] {
    std::map<Collective, Algorithm> out;
    const auto text = core::env("TUTTI_ALGO");
    if (!text) return out;
    std::size_t start = 0;
    while (start <= text->size()) {
      const std::size_t end = std::min(text->find(',', start), text->size());
      const std::string item = text->substr(start, end - start);
      const std::size_t colon = item.find(':');
      if (colon == std::string::npos)
        throw Error(ErrorCode::invalid_argument, "TUTTI_ALGO: expected collective:algorithm, got '" + item + "'");
      out[parse_collective(item.substr(0, colon))] = parse_algorithm(item.substr(colon + 1));
      start = end + 1;
    }
    return out;
  }();
  return forced;
}

Algorithm size_rule(Collective collective, int p, std::size_t bytes) {
  const bool power_of_two = (p & (p - 1)) == 0;
  switch (collective) {
    case Collective::allreduce:
      if (bytes <= small_bytes) return Algorithm::recursive_doubling;
      return bytes <= medium_bytes ? Algorithm::rabenseifner : Algorithm::ring;
    case Collective::reduce_scatter:
      return bytes <= medium_bytes ? Algorithm::rabenseifner : Algorithm::ring;
    case Collective::allgather:
    case Collective::allgatherv:
      if (bytes > small_bytes) return Algorithm::ring;
      return power_of_two ? Algorithm::recursive_doubling : Algorithm::bruck;
    case Collective::broadcast:
    case Collective::reduce:
      return bytes <= medium_bytes ? Algorithm::binomial_tree : Algorithm::ring;
    case Collective::alltoall:
      return bytes <= 256 * static_cast<std::size_t>(p) ? Algorithm::bruck : Algorithm::pairwise;
    case Collective::alltoallv:
      return Algorithm::pairwise;
    case Collective::gather:
    case Collective::scatter:
      return bytes <= medium_bytes ? Algorithm::binomial_tree : Algorithm::linear;
    case Collective::barrier:
      return Algorithm::bruck;
  }
  return Algorithm::ring;
}

}  // namespace

Algorithm requested_algorithm(Collective collective, Algorithm requested) {
  if (requested != Algorithm::automatic) return requested;
  const auto& forced = forced_by_environment();
  const auto it = forced.find(collective);
  return it != forced.end() ? it->second : Algorithm::automatic;
}

Algorithm step_algorithm(Collective collective, int p, std::size_t bytes) {
  const Algorithm forced = requested_algorithm(collective, Algorithm::automatic);
  return schedule::applies(forced, collective) ? forced : size_rule(collective, p, bytes);
}

Algorithm choose_algorithm(Collective collective, Algorithm requested, const ChoiceContext& context,
                           std::size_t bytes) {
  const int p = context.ranks;
  Algorithm algorithm = requested_algorithm(collective, requested);
  if (algorithm == Algorithm::automatic) algorithm = size_rule(collective, p, bytes);
  if (!schedule::applies(algorithm, collective)) {
    // CommImpl::start runs hierarchical allreduce and mpi itself; anything else that reaches
    // here has no schedule.
    std::string serves;
    for (Algorithm a : schedule::algorithms_for(collective))
      serves += (serves.empty() ? "" : ", ") + std::string(to_string(a));
    if (collective == Collective::allreduce) serves += ", hierarchical";
    std::string why = " does not serve this collective";
    if (algorithm == Algorithm::direct || algorithm == Algorithm::mpi)
      why = " needs the multi-process runtime (shared memory or MPI), which this communicator does not have";
    else if (algorithm == Algorithm::hierarchical)
      why = " serves allreduce only";
    throw Error(ErrorCode::unsupported, std::string(schedule::to_string(collective)) + ": algorithm " +
                                            std::string(to_string(algorithm)) + why + "; available: " + serves);
  }
  if (core::log_enabled(core::LogLevel::info)) {
    static std::mutex mutex;
    static std::map<std::pair<Collective, int>, Algorithm> logged;  // once per (collective, size class)
    int size_class = 0;
    for (std::size_t b = bytes; b > 1; b >>= 1) ++size_class;
    std::lock_guard lock(mutex);
    if (logged.try_emplace({collective, size_class}, algorithm).second)
      core::log(core::LogLevel::info, -1,
                std::string(schedule::to_string(collective)) + " ~2^" + std::to_string(size_class) + " B on " +
                    std::to_string(p) + " ranks: " + std::string(to_string(algorithm)));
  }
  return algorithm;
}

}  // namespace tutti::detail
