// The tuning table: its file format (parse, write, look up), the active table, and the cached
// automatic choices made from it.
#include "comm/tuning.hpp"

#include <algorithm>
#include <atomic>
#include <bit>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <set>
#include <shared_mutex>
#include <sstream>
#include <tuple>

#include "core/env.hpp"
#include "core/log.hpp"
#include "core/names.hpp"

namespace tutti::comm::choice {

using Json = nlohmann::json;

namespace {

// Reads one JSON document's fields, naming the file and the place of whatever is wrong.
class Reader {
 public:
  explicit Reader(const std::string& origin) : origin_(origin) {}

  [[noreturn]] void fail(const std::string& where, const std::string& what) const {
    throw Error(ErrorCode::invalid_argument,
                "tuning file " + origin_ + ": " + (where.empty() ? "" : where + ": ") + what);
  }
  const Json& field(const Json& object, const char* name, const std::string& where) const {
    const auto it = object.find(name);
    if (it == object.end()) fail(where, std::string("missing field '") + name + "'");
    return *it;
  }
  std::size_t size(const Json& object, const char* name, const std::string& where) const {
    const Json& v = field(object, name, where);
    if (!v.is_number_unsigned()) fail(where, std::string("'") + name + "' must be a non-negative integer");
    return v.get<std::size_t>();
  }
  double seconds(const Json& object, const char* name, const std::string& where) const {
    const Json& v = field(object, name, where);
    if (!v.is_number() || !std::isfinite(v.get<double>()) || v.get<double>() < 0)
      fail(where, std::string("'") + name + "' must be a non-negative number");
    return v.get<double>();
  }
  std::string text(const Json& object, const char* name, const std::string& where) const {
    const Json& v = field(object, name, where);
    if (!v.is_string()) fail(where, std::string("'") + name + "' must be a string");
    return v.get<std::string>();
  }

  // Reads entry `e` into table.entries, or table.backend_entries for a GPU transport.
  void entry(const Json& e, const std::string& where, Table& table) const {
    if (!e.is_object()) fail(where, "an entry must be an object");
    const std::string collective = text(e, "collective", where), transport = text(e, "transport", where);
    const auto c = core::collective_from_name(collective);
    if (!c) fail(where, "unknown collective '" + collective + "'");
    const std::size_t ranks = size(e, "ranks", where);
    if (ranks < 1 || ranks > 1u << 30) fail(where, "'ranks' must be at least 1");
    const std::size_t min_bytes = size(e, "min_bytes", where), max_bytes = size(e, "max_bytes", where);
    if (min_bytes > max_bytes) fail(where, "min_bytes is greater than max_bytes");
    // GPU backends belong to the device "transports" (gpu:emulated, gpu:cuda), host algorithms to
    // the others; a device entry may name its backend as "algorithm" too.
    const bool device = transport.starts_with("gpu:");
    const std::string name = text(e, device && e.contains("backend") ? "backend" : "algorithm", where);
    const auto a = core::algorithm_from_name(name);
    const auto b = gpu::backend_from_name(name);
    const std::string for_transport = " for transport '" + transport + "'";
    if (device) {
      if (!b || *b == gpu::Backend::automatic)
        fail(where, "unknown backend '" + name + "'" + (a ? for_transport : std::string()));
      table.backend_entries.push_back({*c, transport, static_cast<int>(ranks), min_bytes, max_bytes, *b});
    } else {
      if (!a || *a == Algorithm::automatic)
        fail(where, "unknown algorithm '" + name + "'" + (b ? for_transport : std::string()));
      table.entries.push_back({*c, transport, static_cast<int>(ranks), min_bytes, max_bytes, *a});
    }
  }

 private:
  const std::string& origin_;
};

}  // namespace

Table Table::parse(const std::string& text, const std::string& origin) {
  const Reader read(origin);
  Json doc;
  try {
    doc = Json::parse(text);
  } catch (const Json::exception& e) {
    read.fail("", std::string("not valid JSON (") + e.what() + ")");
  }
  if (!doc.is_object()) read.fail("", "expected a JSON object");
  if (read.size(doc, "version", "") != 1) read.fail("", "unsupported version (expected 1)");
  Table table;
  table.origin = origin;
  if (const auto models = doc.find("cost_model"); models != doc.end()) {
    if (!models->is_object()) read.fail("cost_model", "must be an object keyed by transport");
    for (const auto& [transport, m] : models->items()) {
      const std::string where = "cost_model." + transport;
      if (!m.is_object()) read.fail(where, "must be an object");
      table.cost_models[transport] = {read.seconds(m, "alpha_s", where), read.seconds(m, "beta_s_per_byte", where),
                                      read.seconds(m, "gamma_s_per_element", where)};
    }
  }
  if (const auto entries = doc.find("entries"); entries != doc.end()) {
    if (!entries->is_array()) read.fail("entries", "must be an array");
    for (std::size_t i = 0; i < entries->size(); ++i)
      read.entry((*entries)[i], "entries[" + std::to_string(i) + "]", table);
  }
  return table;
}

std::string Table::to_json() const {
  nlohmann::ordered_json doc;
  doc["version"] = 1;
  doc["cost_model"] = nlohmann::ordered_json::object();
  for (const auto& [transport, c] : cost_models)
    doc["cost_model"][transport] = {
        {"alpha_s", c.alpha}, {"beta_s_per_byte", c.beta}, {"gamma_s_per_element", c.gamma}};
  doc["entries"] = nlohmann::ordered_json::array();
  const auto write = [&](const auto& e, const char* field, std::string_view name) {
    doc["entries"].push_back({{"collective", std::string(to_string(e.collective))},
                              {"transport", e.transport},
                              {"ranks", e.ranks},
                              {"min_bytes", e.min_bytes},
                              {"max_bytes", e.max_bytes},
                              {field, std::string(name)}});
  };
  for (const Entry& e : entries) write(e, "algorithm", to_string(e.algorithm));
  for (const BackendEntry& e : backend_entries) write(e, "backend", gpu::to_string(e.backend));
  return doc.dump(2) + "\n";
}

namespace {

// The first of `entries` for (collective, transport, ranks) whose range holds `bytes`.
template <typename E>
const E* first_match(const std::vector<E>& entries, Collective collective, std::string_view transport, int ranks,
                     std::size_t bytes) {
  for (const E& e : entries)
    if (e.collective == collective && e.transport == transport && e.ranks == ranks && e.min_bytes <= bytes &&
        bytes <= e.max_bytes)
      return &e;
  return nullptr;
}

}  // namespace

std::optional<Algorithm> Table::lookup(Collective collective, std::string_view transport, int ranks,
                                       std::size_t bytes) const {
  const Entry* e = first_match(entries, collective, transport, ranks, bytes);
  return e ? std::optional(e->algorithm) : std::nullopt;
}

std::optional<gpu::Backend> Table::lookup_backend(Collective collective, std::string_view transport, int ranks,
                                                  std::size_t bytes) const {
  const BackendEntry* e = first_match(backend_entries, collective, transport, ranks, bytes);
  return e ? std::optional(e->backend) : std::nullopt;
}

// ---- the active table and the choices cached from it ----

namespace {

// (collective, kind, transport, ranks, direct_available, size class); the transport views a
// State::transports name.
using CacheKey = std::tuple<Collective, transport::Kind, std::string_view, int, bool, int>;

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

CostParams cost_in(const Table& table, std::string_view transport, transport::Kind kind) {
  const auto it = table.cost_models.find(std::string(transport));
  return it != table.cost_models.end() ? it->second : transport::default_cost(kind);
}

Table read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(ErrorCode::invalid_argument, "tuning file " + path + ": cannot be read");
  std::ostringstream text;
  text << in.rdbuf();
  return Table::parse(text.str(), path);
}

Decision decide(const State& s, Collective collective, transport::Kind kind, std::string_view transport, int ranks,
                bool direct, int klass) {
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
  d.model.cost = cost_in(s.table, transport, kind);
  d.model.algorithm = cheapest(kind, collective, ranks, low, direct, d.model.cost);
  return d;
}

}  // namespace

std::string default_path() {
  if (const auto xdg = core::env("XDG_CACHE_HOME")) return *xdg + "/tutti/tuning.json";
  if (const auto home = core::env("HOME")) return *home + "/.cache/tutti/tuning.json";
  return "";
}

void load_from_environment() {
  if (loaded.load(std::memory_order_acquire)) return;
  static std::mutex mutex;
  std::lock_guard lock(mutex);
  if (loaded.load(std::memory_order_acquire)) return;
  if (const auto named = core::env("TUTTI_TUNING_FILE")) {
    install(read_file(*named));  // throws: the user asked for this file
  } else if (const std::string path = default_path(); !path.empty() && std::filesystem::exists(path)) {
    try {
      install(read_file(path));
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

CostParams cost_for(std::string_view transport, transport::Kind kind) { return cost_in(active(), transport, kind); }

int size_class(std::size_t bytes) { return static_cast<int>(std::bit_width(bytes)); }

std::size_t class_size(int size_class) { return size_class == 0 ? 0 : std::size_t{1} << (size_class - 1); }

Choice automatic_choice(Collective collective, transport::Kind kind, std::string_view transport, int ranks,
                        bool direct_available, std::size_t bytes) {
  State& s = state();
  const int klass = size_class(bytes);
  const Decision* found = nullptr;
  {
    std::shared_lock lock(s.mutex);
    const auto it = s.cache.find(CacheKey{collective, kind, transport, ranks, direct_available, klass});
    if (it != s.cache.end()) found = &it->second;
  }
  if (found == nullptr) {
    Decision d = decide(s, collective, kind, transport, ranks, direct_available, klass);  // slow: outside the lock
    std::unique_lock lock(s.mutex);
    const std::string_view name = *s.transports.emplace(transport).first;  // outlives the key
    found = &s.cache.try_emplace(CacheKey{collective, kind, name, ranks, direct_available, klass}, std::move(d))
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
