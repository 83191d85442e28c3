// The tuning table's file format: parse, write, read, look up (<tutti/tuning.hpp>).
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/env.hpp"
#include "tutti/tuning.hpp"

namespace tutti::tuning {

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
    const auto c = collective_from_name(collective);
    if (!c) fail(where, "unknown collective '" + collective + "'");
    const std::size_t ranks = size(e, "ranks", where);
    if (ranks < 1 || ranks > 1u << 30) fail(where, "'ranks' must be at least 1");
    const std::size_t min_bytes = size(e, "min_bytes", where), max_bytes = size(e, "max_bytes", where);
    if (min_bytes > max_bytes) fail(where, "min_bytes is greater than max_bytes");
    // GPU backends belong to the device "transports" (gpu:emulated, gpu:cuda), host algorithms to
    // the others; a device entry may name its backend as "algorithm" too.
    const bool device = transport.starts_with("gpu:");
    const std::string name = text(e, device && e.contains("backend") ? "backend" : "algorithm", where);
    const auto a = algorithm_from_name(name);
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

Table Table::read(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(ErrorCode::invalid_argument, "tuning file " + path + ": cannot be read");
  std::ostringstream text;
  text << in.rdbuf();
  return parse(text.str(), path);
}

void Table::write(const std::string& path) const {
  const std::filesystem::path file(path);
  std::error_code error;
  if (file.has_parent_path()) std::filesystem::create_directories(file.parent_path(), error);
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << to_json();
  out.flush();
  if (!out) throw Error(ErrorCode::system, "tuning file " + path + ": cannot be written");
}

std::string default_path() {
  if (const auto xdg = core::env("XDG_CACHE_HOME")) return *xdg + "/tutti/tuning.json";
  if (const auto home = core::env("HOME")) return *home + "/.cache/tutti/tuning.json";
  return "";
}

}  // namespace tutti::tuning
