// tutti-train's command line.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>

#include "fashion_mnist.hpp"

namespace tutti::train {

/// --straggler RANK:FACTOR: that rank's compute takes FACTOR (>= 1) times as long.
struct Straggler {
  int rank = 0;
  double factor = 1;
};

struct Settings {
  int epochs = 2;
  std::int64_t batch_size = 64;  // per rank
  double lr = 0.05;
  double momentum = 0.9;
  int threads = 1;  // torch intra-op threads per rank
  std::uint64_t seed = 42;
  bool overlap = true;
  std::string timeline;                         // empty: none
  std::optional<std::size_t> fusion_threshold;  // bytes; unset: the engine's (TUTTI_FUSION_THRESHOLD)
  int backward_passes = 1;                      // backward passes per optimizer step
  std::size_t train_samples = 0;                // first N training samples; 0 = all
  std::size_t test_samples = 0;                 // first N test samples; 0 = all
  std::string data = default_fashion_mnist_dir;
  std::string compression = "none";    // DistributedOptions::compression, as compress::Compression::parse reads it
  std::string profile;                 // --profile FILE; empty: none
  std::optional<Straggler> straggler;  // --straggler RANK:FACTOR
  std::string checkpoint_dir;          // --checkpoint DIR; empty: none
  std::int64_t checkpoint_every = 0;   // --checkpoint-every N, in optimizer steps
  bool checkpoint_blocking = false;    // --checkpoint-blocking: written before training goes on
  std::string resume;                  // --resume DIR; empty: a fresh run
  bool elastic = false;                // --elastic: tutti::elastic, under tutti-run --elastic
  std::int64_t commit_every = 20;      // --commit-every N: optimizer steps between elastic commits
  int width = 1;                       // --width W: the network's channels and hidden units times W
  int pipeline = 1;                    // --pipeline N: stages
  int micro_batches = 1;               // --micro-batches M (pipeline only)
  std::string schedule = "1f1b";       // --schedule gpipe|1f1b
  int tensor_parallel = 1;             // --tensor-parallel T
  int zero = 0;                        // --zero 1|2: sharded optimizer state (and gradients); 0: off
  std::size_t device_memory = 0;       // --device-memory SIZE (a plain number: MiB), in bytes; 0: no budget
  bool swap = true;                    // --no-swap: over the budget is an error
  std::string loss_log;                // --loss-log FILE: every step's global loss, by rank 0
  std::int64_t log_interval = 0;       // --log-interval N: a line every N steps, by rank 0; 0: none
  bool progress = true;                // --no-progress: no progress line on the terminal
  bool help = false;                   // -h/--help: the flags were printed
};

/// A malformed command line (tutti-train exits 2).
struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// Whether the run is anything but plain data parallelism (pipeline, tensor parallel, ZeRO, a
/// device-memory budget): what --profile and --checkpoint do not cover.
bool beyond_data_parallel(const Settings& s);

/// Parses argv (flags, or --config FILE); throws UsageError naming the flag. For -h/--help it
/// prints the flags and returns settings with `help` set.
Settings parse_settings(int argc, char** argv);

}  // namespace tutti::train
