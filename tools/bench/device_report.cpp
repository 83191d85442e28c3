// Device mode's table: the host columns (both forms, stream-aware), then the host's enqueue and
// idle columns, the sync peer and the device-to-device copy of the same bytes, all from one run.
#include <algorithm>
#include <cstdio>

#include "bench/report.hpp"

namespace tutti::bench {

namespace {

// GB/s of a copy of `bytes` taking `seconds` (read + write move twice that).
double copy_rate(std::size_t bytes, double seconds) {
  return seconds > 0 ? static_cast<double>(bytes) / seconds / 1e9 : 0;
}

}  // namespace

void Report::device_header(Kind kind) const {
  const bool sync = !peers_.empty();
  std::printf("#\n# Collective %s on device %s, backend %s, %d ranks over %s\n#\n",
              std::string(to_string(kind)).c_str(), device_.c_str(), backend_.c_str(), ranks_, transport_.c_str());
  // Each title is right-aligned over its columns.
  std::printf("# %10s %12s %6s %6s %6s %33s %33s %21s", "", "", "", "", "", "out-of-place (stream)",
              "in-place (stream)", "host, primary form");
  if (sync) std::printf(" %17s", "sync (same run)");
  std::printf(" %18s", "d2d copy");
  if (overlap_) std::printf(" %28s", "beside compute (2 streams)");
  std::printf("\n# %10s %12s %6s %6s %6s %10s %7s %7s %6s %10s %7s %7s %6s %7s %7s %5s", "size", "count", "type",
              "redop", "root", "time", "algbw", "busbw", "#wrong", "time", "algbw", "busbw", "#wrong", "enq", "max",
              "idle");
  if (sync) std::printf(" %8s %8s", "busbw", "tutti/x");
  std::printf(" %9s %8s", "time", "bus/d2d");
  if (overlap_) std::printf(" %9s %9s %8s", "compute", "both", "both/max");
  std::printf("\n# %10s %12s %6s %6s %6s %10s %7s %7s %6s %10s %7s %7s %6s %7s %7s %5s", "(B)", "(elements)", "", "",
              "", "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(us)", "");
  if (sync) std::printf(" %8s %8s", "(GB/s)", "");
  std::printf(" %9s %8s", "(us)", "");
  if (overlap_) std::printf(" %9s %9s %8s", "(us)", "(us)", "");
  std::printf("\n");
  std::fflush(stdout);
}

void Report::print_device_row(const Row& row) const {
  const std::size_t bytes = case_bytes(row.c, ranks_);
  std::printf(
      "  %10zu %12zu %6s %6s %6d", bytes, case_elements(row.c, ranks_), std::string(to_string(row.c.type)).c_str(),
      reduces(row.c.kind) ? std::string(to_string(row.c.op)).c_str() : "none", rooted(row.c.kind) ? row.c.root : -1);
  print_measure(row, ranks_, row.out_of_place);
  print_measure(row, ranks_, row.in_place);
  const Measure& mine = primary(row);
  if (mine.measured())
    std::printf(" %7.2f %7.2f %5.2f", mine.enqueue * 1e6, mine.enqueue_max * 1e6, mine.idle);
  else
    std::printf(" %7s %7s %5s", "N/A", "N/A", "N/A");
  for (const std::string& peer : peers_) {
    const auto it = row.peers.find(peer);
    if (it == row.peers.end() || !it->second.measured() || !mine.measured())
      std::printf(" %8s %8s", "-", "-");
    else
      std::printf(" %8.2f %8.2f", busbw(row, ranks_, it->second.time), it->second.time / mine.time);
  }
  if (row.copy > 0)
    std::printf(" %9.2f", row.copy * 1e6);
  else
    std::printf(" %9s", "-");
  if (row.copy > 0 && bytes > 0 && mine.measured())
    std::printf(" %8.2f", busbw(row, ranks_, mine.time) / copy_rate(bytes, row.copy));
  else
    std::printf(" %8s", "-");
  if (overlap_ && row.both > 0)
    std::printf(" %9.2f %9.2f %8.2f", row.compute * 1e6, row.both * 1e6, row.overlap());
  else if (overlap_)
    std::printf(" %9s %9s %8s", "-", "-", "-");
  std::printf("\n");
  std::fflush(stdout);
}

void Report::device_footer() const {
  const Row* largest = nullptr;
  double enqueue = 0, enqueue_max = 0;
  for (const Row& row : rows_) {
    if (row.copy > 0 && (!largest || case_bytes(row.c, ranks_) > case_bytes(largest->c, ranks_))) largest = &row;
    for (const Measure* m : {&row.out_of_place, &row.in_place})
      if (m->measured()) enqueue = std::max(enqueue, m->enqueue), enqueue_max = std::max(enqueue_max, m->enqueue_max);
  }
  std::printf("# Device               : %s%s\n", device_.c_str(),
              device_ == "emulated" ? " (functional only: its timings say nothing about a GPU)" : "");
  std::printf("# Host enqueue         : %.2f us per call at most (mean per row), %.2f us the longest call\n",
              enqueue * 1e6, enqueue_max * 1e6);
  double best = 0, worst = 0;
  for (const Row& row : rows_)
    if (const double o = row.overlap(); o > 0) best = best > 0 ? std::min(best, o) : o, worst = std::max(worst, o);
  if (overlap_ && worst > 0)
    std::printf(
        "# Overlap              : both / max(collective, compute) from %.2f to %.2f (1: the shorter is hidden)\n", best,
        worst);
  if (largest) {
    const double rate = copy_rate(case_bytes(largest->c, ranks_), largest->copy);
    std::printf(
        "# D2D copy ceiling     : %.2f GB/s at %zu B (bytes / time; read + write %.2f GB/s), each rank copying at "
        "once\n",
        rate, case_bytes(largest->c, ranks_), 2 * rate);
  }
}

}  // namespace tutti::bench
