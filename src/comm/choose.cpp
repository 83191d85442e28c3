// Algorithm choice (choice.hpp): TUTTI_ALGO, then the tuning table, then the cost model.
#include <algorithm>
#include <cstdio>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <tuple>

#include "comm/choice.hpp"
#include "comm/tuning.hpp"
#include "core/env.hpp"
#include "core/log.hpp"
#include "schedule/schedule.hpp"
#include "transport/cost.hpp"

namespace tutti::comm::choice {

namespace {

Algorithm parse_algorithm(const std::string& name) {
  if (const auto a = algorithm_from_name(name); a) return *a;
  throw Error(ErrorCode::invalid_argument, "TUTTI_ALGO: unknown algorithm '" + name + "'");
}

Collective parse_collective(const std::string& name) {
  if (const auto c = collective_from_name(name)) return *c;
  throw Error(ErrorCode::invalid_argument, "TUTTI_ALGO: unknown collective '" + name + "'");
}

// TUTTI_ALGO, parsed once.
const std::map<Collective, Algorithm>& forced_by_environment() {
  static const std::map<Collective, Algorithm> forced = [] {
    const auto text = core::env("TUTTI_ALGO");
    return text ? parse_forced_algorithms(*text) : std::map<Collective, Algorithm>{};
  }();
  return forced;
}

// Where a choice came from, for the TUTTI_DEBUG=info line.
std::string source_of(Algorithm requested, bool forced, const Choice& choice, std::string_view transport) {
  if (requested != Algorithm::automatic) return "the call's options";
  if (forced) return "TUTTI_ALGO";
  if (choice.from_table) return "tuning file " + std::string(choice.origin);
  char costs[128];
  std::snprintf(costs, sizeof(costs), " α=%.3g β=%.3g γ=%.3g)", choice.cost.alpha, choice.cost.beta, choice.cost.gamma);
  return "cost model (" + std::string(transport) + costs;
}

// Once per (collective, transport, ranks, size class, algorithm, source): a line per decision.
void log_choice(Collective collective, const ChoiceContext& context, std::size_t bytes, Algorithm algorithm,
                const std::string& source) {
  static std::mutex mutex;
  static std::set<std::tuple<Collective, std::string, int, int, Algorithm, std::string>> logged;
  const int bytes_class = size_class(bytes);
  {
    std::lock_guard lock(mutex);
    if (!logged.emplace(collective, std::string(context.transport), context.ranks, bytes_class, algorithm, source)
             .second)
      return;
  }
  core::log(core::LogLevel::info, -1,
            std::string(to_string(collective)) +
                (bytes == 0 ? std::string(" 0") : " ~2^" + std::to_string(bytes_class - 1)) + " B on " +
                std::to_string(context.ranks) + " ranks: " + std::string(to_string(algorithm)) + " from " + source);
}

}  // namespace

std::map<Collective, Algorithm> parse_forced_algorithms(std::string_view text) {
  std::map<Collective, Algorithm> out;
  std::size_t start = 0;
  while (start <= text.size()) {
    const std::size_t end = std::min(text.find(',', start), text.size());
    const std::string item(text.substr(start, end - start));
    const std::size_t colon = item.find(':');
    if (colon == std::string::npos)
      throw Error(ErrorCode::invalid_argument, "TUTTI_ALGO: expected collective:algorithm, got '" + item + "'");
    out[parse_collective(item.substr(0, colon))] = parse_algorithm(item.substr(colon + 1));
    start = end + 1;
  }
  return out;
}

Algorithm requested_algorithm(Collective collective, Algorithm requested) {
  if (requested != Algorithm::automatic) return requested;
  const auto& forced = forced_by_environment();
  const auto it = forced.find(collective);
  return it != forced.end() ? it->second : Algorithm::automatic;
}

Algorithm step_algorithm(Collective collective, const ChoiceContext& context, std::size_t bytes) {
  const Algorithm forced = requested_algorithm(collective, Algorithm::automatic);
  if (schedule::applies(forced, collective)) return forced;
  load_from_environment();
  const Algorithm chosen = automatic_choice(collective, context.kind, context.transport, context.ranks,
                                            context.direct_available, bytes, context.link, context.ranks_per_host)
                               .algorithm;
  // A step runs on its own communicator, which cannot itself be hierarchical's.
  return chosen == Algorithm::hierarchical ? Algorithm::automatic : chosen;
}

Algorithm choose_algorithm(Collective collective, Algorithm requested, const ChoiceContext& context,
                           std::size_t bytes) {
  const int p = context.ranks;
  Algorithm algorithm = requested_algorithm(collective, requested);
  const bool forced = algorithm != Algorithm::automatic;
  Choice choice;
  if (!forced) {
    load_from_environment();
    // Every collective has schedule candidates, so the model always names one.
    choice = automatic_choice(collective, context.kind, context.transport, p, context.direct_available, bytes,
                              context.link, context.ranks_per_host);
    algorithm = choice.algorithm;
  }
  const std::vector<Algorithm> native = transport::native_candidates(context.kind, collective);
  const bool native_serves =
      context.direct_available && std::find(native.begin(), native.end(), algorithm) != native.end();
  if (algorithm == Algorithm::hierarchical && collective == Collective::allreduce && !forced) {
    // The cost model chose it for ranks that span hosts in blocks: CommImpl::start runs it.
  } else if (!native_serves && !schedule::applies(algorithm, collective)) {
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
    throw Error(ErrorCode::unsupported, std::string(to_string(collective)) + ": algorithm " +
                                            std::string(to_string(algorithm)) + why + "; available: " + serves);
  }
  if (core::log_enabled(core::LogLevel::info))
    log_choice(collective, context, bytes, algorithm, source_of(requested, forced, choice, context.transport));
  return algorithm;
}

}  // namespace tutti::comm::choice
