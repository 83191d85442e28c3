// The active tuning table and the automatic choices cached from it.
#include "comm/tuning.hpp"

#include <algorithm>
#include <atomic>
#include <bit>
#include <filesystem>
#include <limits>
#include <memory>
#include <mutex>
#include <set>
#include <shared_mutex>
#include <tuple>

#include "core/env.hpp"
#include "core/log.hpp"

namespace tutti::comm::choice {

// ---- the active table and the choices cached from it ----

namespace {

// (collective, kind, transport, ranks, direct_available, measured link, ranks per host, size class);
// the transport views a State::transports name, the link an interned cost.
using CacheKey = std::tuple<Collective, transport::Kind, std::string_view, int, bool, const CostParams*, int, int>;

// A cached decision: the cost model's choice for the class, and the table entries that may
// override it for some sizes of the class (only those that match and can serve the call).
struct Decision {
  Choice model;
  std::vector<Entry> entries;
};

// A table with the choices made from it. Never freed: a choice in flight, or a caller of
// active(), may still read a table that set_active has replaced (tables are few and small).
struct State {
  Table table;
  std::shared_mutex mutex;
  std::map<CacheKey, Decision> cache;
  std::set<std::string, std::less<>> transports;  // the cache keys' transport names
};

std::mutex states_mutex;
std::vector<std::unique_ptr<State>> states;
std::atomic<State*> current{nullptr};
std::atomic<bool> loaded{false};

State* install(Table table) {
  std::lock_guard lock(states_mutex);
  states.push_back(std::make_unique<State>());
  states.back()->table = std::move(table);
  current.store(states.back().get(), std::memory_order_release);
  return states.back().get();
}

State& state() {
  State* s = current.load(std::memory_order_acquire);
  if (s != nullptr) return *s;
  std::lock_guard lock(states_mutex);  // the first use: install the empty table once
  if (states.empty()) {
    states.push_back(std::make_unique<State>());
    current.store(states.back().get(), std::memory_order_release);
  }
  return *current.load(std::memory_order_acquire);
}

// The table's costs for the transport, else the communicator's measured link, else the defaults.
CostParams cost_in(const Table& table, std::string_view transport, transport::Kind kind, const CostParams* link) {
  const auto it = table.cost_models.find(std::string(transport));
  return it != table.cost_models.end() ? it->second : link != nullptr ? *link : transport::default_cost(kind);
}

// How a transport of `kind` whose ranks span hosts in blocks of `ranks_per_host` carries what stays
// within a host (within_host), priced by the table's costs for it or its defaults.
HostBlocks host_blocks(const Table& table, transport::Kind kind, int ranks_per_host) {
  const auto local = within_host(kind);
  if (ranks_per_host < 2 || !local) return {};
  return {ranks_per_host, cost_in(table, *local == transport::Kind::shm ? "shm" : "tcp", *local, nullptr), *local};
}

Decision decide(const State& s, Collective collective, transport::Kind kind, std::string_view transport, int ranks,
                bool direct, const CostParams* link, int ranks_per_host, int klass) {
  Decision d;
  const std::size_t low = class_size(klass);
  const std::size_t high = klass == 0                                          ? 0
                           : klass >= std::numeric_limits<std::size_t>::digits ? std::numeric_limits<std::size_t>::max()
                                                                               : (std::size_t{1} << klass) - 1;
  const std::vector<Algorithm> serving = candidates(kind, collective, direct);
  for (const Entry& e : s.table.entries)
    if (e.collective == collective && e.transport == transport && e.ranks == ranks && e.min_bytes <= high &&
        low <= e.max_bytes && std::find(serving.begin(), serving.end(), e.algorithm) != serving.end())
      d.entries.push_back(e);
  d.model.cost = cost_in(s.table, transport, kind, link);
  d.model.algorithm =
      cheapest(kind, collective, ranks, low, direct, d.model.cost, host_blocks(s.table, kind, ranks_per_host));
  return d;
}

}  // namespace

void load_from_environment() {
  if (loaded.load(std::memory_order_acquire)) return;
  static std::mutex mutex;
  std::lock_guard lock(mutex);
  if (loaded.load(std::memory_order_acquire)) return;
  if (const auto named = core::env("TUTTI_TUNING_FILE")) {
    install(Table::read(*named));  // throws: the user asked for this file
  } else if (const std::string path = default_path(); !path.empty() && std::filesystem::exists(path)) {
    try {
      install(Table::read(path));
    } catch (const Error& e) {
      core::log(core::LogLevel::warn, -1, std::string(e.what()) + "; ignored (the cost model decides)");
    }
  }
  loaded.store(true, std::memory_order_release);
}

void set_active(Table table) {
  install(std::move(table));
  loaded.store(true, std::memory_order_release);
}

const Table& active() { return state().table; }

const void* active_version() { return current.load(std::memory_order_acquire); }

CostParams cost_for(std::string_view transport, transport::Kind kind, const CostParams* link) {
  return cost_in(active(), transport, kind, link);
}

int size_class(std::size_t bytes) { return static_cast<int>(std::bit_width(bytes)); }

std::size_t class_size(int size_class) { return size_class == 0 ? 0 : std::size_t{1} << (size_class - 1); }

const CostParams* intern_cost(const CostParams& cost) {
  static std::mutex mutex;
  static std::map<std::tuple<double, double, double>, std::unique_ptr<CostParams>> costs;  // never freed
  std::lock_guard lock(mutex);
  auto& slot = costs[{cost.alpha, cost.beta, cost.gamma}];
  if (!slot) slot = std::make_unique<CostParams>(cost);
  return slot.get();
}

Choice automatic_choice(Collective collective, transport::Kind kind, std::string_view transport, int ranks,
                        bool direct_available, std::size_t bytes, const CostParams* link, int ranks_per_host) {
  State& s = state();
  const int klass = size_class(bytes);
  const Decision* found = nullptr;
  {
    std::shared_lock lock(s.mutex);
    const auto it =
        s.cache.find(CacheKey{collective, kind, transport, ranks, direct_available, link, ranks_per_host, klass});
    if (it != s.cache.end()) found = &it->second;
  }
  if (found == nullptr) {
    Decision d =
        decide(s, collective, kind, transport, ranks, direct_available, link, ranks_per_host, klass);  // slow: unlocked
    std::unique_lock lock(s.mutex);
    const std::string_view name = *s.transports.emplace(transport).first;  // outlives the key
    found = &s.cache
                 .try_emplace(CacheKey{collective, kind, name, ranks, direct_available, link, ranks_per_host, klass},
                              std::move(d))
                 .first->second;
  }
  // Map nodes are stable and never erased while the state lives, so `found` stays valid.
  for (const Entry& e : found->entries)
    if (e.min_bytes <= bytes && bytes <= e.max_bytes) return Choice{e.algorithm, true, s.table.origin, {}};
  return found->model;
}

void reset_for_testing(bool reload) {
  install(reload ? Table{} : Table(active()));
  if (reload) loaded.store(false, std::memory_order_release);
}

}  // namespace tutti::comm::choice

namespace tutti::tuning {

void use(Table table) { comm::choice::set_active(std::move(table)); }

const Table& active() {
  comm::choice::load_from_environment();
  return comm::choice::active();
}

}  // namespace tutti::tuning
