// tutti-bench's output: nccl-tests' table on stdout (rank 0), the progress line on stderr, and
// the JSON file that tools/plot_bench.py reads.
#pragma once

#include <cstdio>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "bench/cases.hpp"
#include "bench/ceiling.hpp"
#include "common/progress.hpp"

namespace tutti::bench {

struct Measure {
  double time = 0;  // seconds per iteration (max over ranks of the mean); 0 = not measured
  // --per-call: seconds of the median call (each rank's median, max over ranks); 0 = not measured.
  double median = 0;
  std::size_t wrong = 0;
  // Device mode: host seconds per enqueueing call (max over ranks of the mean, and the longest
  // call), and the fraction of the batch the host spent outside the calls (min over ranks; < 0
  // when not measured).
  double enqueue = 0, enqueue_max = 0, idle = -1;
  bool measured() const { return time > 0; }
};

struct Row {
  Case c;
  std::string algorithm;  // as asked (automatic or forced)
  std::string chosen;     // what automatic resolved to ("" when forced)
  Measure out_of_place, in_place;
  std::map<std::string, Measure> peers;           // primary form
  std::map<std::string, Measure> peers_in_place;  // the other form, where a peer has it (MPI_IN_PLACE)
  double bound = 0;                               // t_bound (seconds), 0 without --ceiling
  double copy = 0;                                // device mode: seconds per D2D copy of the row's bytes
  // --overlap (device mode): seconds per call of the compute alone, and of the primary form and
  // the compute together on two streams (0: not measured).
  double compute = 0, both = 0;
  double overlap() const;  // both / max(primary's time, compute); 0 when not measured
};

/// algbw and busbw in GB/s of `row` at `seconds` per iteration.
double algbw(const Row& row, int ranks, double seconds);
double busbw(const Row& row, int ranks, double seconds);
/// The form peers are compared with: out of place, except broadcast (in place only).
const Measure& primary(const Row& row);
/// Prints one form's `time algbw busbw #wrong` columns (N/A when not measured).
void print_measure(const Row& row, int ranks, const Measure& m);

class Report {
 public:
  /// `print`: this rank prints the table (rank 0); every rank keeps the rows.
  Report(int ranks, std::string transport, std::vector<std::string> peers, bool ceiling, bool print)
      : ranks_(ranks), transport_(std::move(transport)), peers_(std::move(peers)), ceiling_(ceiling), print_(print) {}
  /// A group's header: the collective and algorithm, then the column names.
  void header(Kind kind, const std::string& algorithm) const;
  void row(const Row& row);
  void print_row(const Row& row) const;
  /// `Avg bus bandwidth`, and the out-of-bounds and wrong totals.
  void footer(const std::optional<Ceiling>& ceiling) const;
  /// Device mode (device_report.cpp): the rows are gpu::Communicator's on `device` (as the
  /// device names itself), with the enqueue, idle and D2D copy columns.
  void set_device(std::string device, std::string backend, bool overlap = false) {
    device_ = std::move(device);
    backend_ = std::move(backend);
    overlap_ = overlap;
  }
  std::size_t wrong() const { return wrong_; }
  const std::vector<Row>& rows() const { return rows_; }
  /// Writes every row as JSON (the schema tools/plot_bench.py reads). Throws std::runtime_error.
  void write_json(const std::string& path, const std::string& command, const std::string& launcher,
                  const std::optional<Ceiling>& ceiling) const;

 private:
  int ranks_;
  std::string transport_;
  std::vector<std::string> peers_;
  bool ceiling_;
  bool print_;
  void device_header(Kind kind) const;
  void print_device_row(const Row& row) const;
  void device_footer() const;

  std::string device_, backend_;  // empty: host mode
  bool overlap_ = false;          // device mode: the --overlap columns
  std::vector<Row> rows_;
  std::size_t wrong_ = 0;
  double busbw_sum_ = 0;
  int busbw_cells_ = 0;
};

/// The progress line (tools/common/progress.hpp).
using Progress = tools::Progress;

/// "4 B", "64 KiB", "256 MiB".
std::string human_bytes(std::size_t bytes);

}  // namespace tutti::bench
