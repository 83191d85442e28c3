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
  bool help = false;
};

/// A malformed command line (tutti-train exits 2).
struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// Parses argv; throws UsageError naming the flag.
Settings parse_settings(int argc, char** argv);

/// The --help text.
std::string usage();

}  // namespace tutti::train
