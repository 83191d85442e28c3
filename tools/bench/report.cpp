#include "bench/report.hpp"

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>
#include <stdexcept>

namespace tutti::bench {

void print_measure(const Row& row, int ranks, const Measure& m) {
  if (!m.measured()) {
    std::printf(" %10s %7s %7s %6s", "N/A", "N/A", "N/A", "N/A");
    return;
  }
  std::printf(" %10.2f %7.2f %7.2f %6zu", m.time * 1e6, algbw(row, ranks, m.time), busbw(row, ranks, m.time), m.wrong);
}

double algbw(const Row& row, int ranks, double seconds) {
  return seconds > 0 ? static_cast<double>(case_bytes(row.c, ranks)) / seconds / 1e9 : 0;
}

double busbw(const Row& row, int ranks, double seconds) {
  return algbw(row, ranks, seconds) * bus_factor(row.c.kind, ranks);
}

double Row::overlap() const {
  const double longer = std::max(primary(*this).time, compute);
  return both > 0 && longer > 0 ? both / longer : 0;
}

const Measure& primary(const Row& row) { return row.c.kind == Collective::broadcast ? row.in_place : row.out_of_place; }

std::string human_bytes(std::size_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB"};
  int unit = 0;
  double value = static_cast<double>(bytes);
  while (value >= 1024 && unit < 3) value /= 1024, ++unit;
  char text[32];
  std::snprintf(text, sizeof(text), value == static_cast<double>(static_cast<long>(value)) ? "%.0f %s" : "%.1f %s",
                value, units[unit]);
  return text;
}

void Report::header(Kind kind, const std::string& algorithm) const {
  if (!device_.empty()) return device_header(kind);
  std::printf("#\n# Collective %s, algorithm %s, %d ranks over %s\n#\n", std::string(to_string(kind)).c_str(),
              algorithm.c_str(), ranks_, transport_.c_str());
  std::printf("# %10s %12s %6s %6s %6s %36s %36s", "", "", "", "", "", "out-of-place", "in-place");
  for (const std::string& peer : peers_) std::printf(" %17s", (peer + " (same run)").c_str());
  std::printf("\n# %10s %12s %6s %6s %6s %10s %7s %7s %6s %10s %7s %7s %6s", "size", "count", "type", "redop", "root",
              "time", "algbw", "busbw", "#wrong", "time", "algbw", "busbw", "#wrong");
  for (std::size_t i = 0; i < peers_.size(); ++i) std::printf(" %8s %8s", "busbw", "tutti/x");
  if (ceiling_) std::printf(" %8s", "bound/t");
  std::printf("\n# %10s %12s %6s %6s %6s %10s %7s %7s %6s %10s %7s %7s %6s", "(B)", "(elements)", "", "", "", "(us)",
              "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)", "(GB/s)", "");
  for (std::size_t i = 0; i < peers_.size(); ++i) std::printf(" %8s %8s", "(GB/s)", "");
  std::printf("\n");
  std::fflush(stdout);
}

void Report::row(const Row& row) {
  if (print_) print_row(row);
  for (const Measure* m : {&row.out_of_place, &row.in_place})
    if (m->measured()) busbw_sum_ += busbw(row, ranks_, m->time), ++busbw_cells_, wrong_ += m->wrong;
  for (const auto* form : {&row.peers, &row.peers_in_place})
    for (const auto& [name, peer] : *form) wrong_ += peer.wrong;
  rows_.push_back(row);
}

void Report::print_row(const Row& row) const {
  if (!device_.empty()) return print_device_row(row);
  std::printf("  %10zu %12zu %6s %6s %6d", case_bytes(row.c, ranks_), case_elements(row.c, ranks_),
              std::string(to_string(row.c.type)).c_str(),
              reduces(row.c.kind) ? std::string(to_string(row.c.op)).c_str() : "none",
              rooted(row.c.kind) ? row.c.root : -1);
  print_measure(row, ranks_, row.out_of_place);
  print_measure(row, ranks_, row.in_place);
  const Measure& mine = primary(row);
  for (const std::string& peer : peers_) {
    const auto it = row.peers.find(peer);
    if (it == row.peers.end() || !it->second.measured()) {
      std::printf(" %8s %8s", "-", "-");
      continue;
    }
    std::printf(" %8.2f %8.2f", busbw(row, ranks_, it->second.time), it->second.time / mine.time);
  }
  if (ceiling_) std::printf(" %8.2f", row.bound / mine.time);
  std::printf("%s", row.chosen.empty() ? "" : ("  " + row.chosen).c_str());
  // --per-call: the median calls after the row, Tutti's primary form's first.
  if (mine.median > 0) {
    std::printf("  median(us) %.2f", mine.median * 1e6);
    for (const std::string& peer : peers_)
      if (const auto it = row.peers.find(peer); it != row.peers.end() && it->second.median > 0)
        std::printf(" %s %.2f", peer.c_str(), it->second.median * 1e6);
  }
  std::printf("\n");
  std::fflush(stdout);
}

void Report::footer(const std::optional<Ceiling>& ceiling) const {
  std::printf("# Out of bounds values : %zu %s\n", wrong_, wrong_ ? "ERROR" : "OK");
  std::printf("# Avg bus bandwidth    : %g\n", busbw_cells_ ? busbw_sum_ / busbw_cells_ : 0.0);
  if (!device_.empty()) device_footer();
  if (ceiling)
    std::printf("# Ceiling              : memory bandwidth %.2f GB/s (all ranks, read + write), flag latency %.3f us\n",
                ceiling->memory_bandwidth / 1e9, ceiling->latency * 1e6);
  std::printf("#\n");
  std::fflush(stdout);
}

void Report::write_json(const std::string& path, const std::string& command, const std::string& launcher,
                        const std::optional<Ceiling>& ceiling) const {
  using nlohmann::json;
  char host[256] = {};
  ::gethostname(host, sizeof(host) - 1);
  json doc = {{"tool", "tutti-bench"},   {"version", 1},         {"host", host},       {"ranks", ranks_},
              {"transport", transport_}, {"launcher", launcher}, {"command", command}, {"results", json::array()}};
  if (!device_.empty()) doc["device"] = device_, doc["backend"] = backend_;
  if (ceiling)
    doc["ceiling"] = {{"memory_bandwidth_GBps", ceiling->memory_bandwidth / 1e9},
                      {"latency_us", ceiling->latency * 1e6}};
  for (const Row& row : rows_) {
    for (const bool in_place : {false, true}) {
      const Measure& m = in_place ? row.in_place : row.out_of_place;
      if (!m.measured()) continue;
      json r = {{"collective", to_string(row.c.kind)},
                {"algorithm", row.algorithm},
                {"chosen", row.chosen.empty() ? row.algorithm : row.chosen},
                {"type", std::string(to_string(row.c.type))},
                {"op", reduces(row.c.kind) ? std::string(to_string(row.c.op)) : "none"},
                {"root", row.c.root},
                {"bytes", case_bytes(row.c, ranks_)},
                {"count", case_elements(row.c, ranks_)},
                {"in_place", in_place},
                {"time_us", m.time * 1e6},
                {"algbw_GBps", algbw(row, ranks_, m.time)},
                {"busbw_GBps", busbw(row, ranks_, m.time)},
                {"wrong", m.wrong}};
      if (m.median > 0) r["median_us"] = m.median * 1e6;
      if (m.idle >= 0)
        r["enqueue_us"] = m.enqueue * 1e6, r["enqueue_max_us"] = m.enqueue_max * 1e6, r["idle_fraction"] = m.idle;
      if (row.copy > 0) {
        r["copy_us"] = row.copy * 1e6;
        if (case_bytes(row.c, ranks_) > 0)
          r["busbw_over_copy"] =
              busbw(row, ranks_, m.time) * row.copy * 1e9 / static_cast<double>(case_bytes(row.c, ranks_));
      }
      if (&m == &primary(row) && row.both > 0)
        r["overlap"] = {
            {"compute_us", row.compute * 1e6}, {"both_us", row.both * 1e6}, {"both_over_max", row.overlap()}};
      if (row.bound > 0) {
        r["bound_fraction"] = row.bound / m.time;
        r["ceiling_busbw_GBps"] = busbw(row, ranks_, row.bound);
      }
      for (const auto& [name, peer] : &m == &primary(row) ? row.peers : row.peers_in_place)
        if (peer.measured()) {
          r["peers"][name] = {{"time_us", peer.time * 1e6},
                              {"busbw_GBps", busbw(row, ranks_, peer.time)},
                              {"ratio", peer.time / m.time},
                              {"wrong", peer.wrong}};
          if (peer.median > 0 && m.median > 0)
            r["peers"][name]["median_us"] = peer.median * 1e6,
            r["peers"][name]["median_ratio"] = peer.median / m.median;
        }
      doc["results"].push_back(std::move(r));
    }
  }
  std::ofstream out(path);
  out << doc.dump(1) << "\n";
  if (!out) throw std::runtime_error("--json: cannot write " + path);
}

}  // namespace tutti::bench
