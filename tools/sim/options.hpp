// tutti-sim's command line (docs/scaling.md): the simulation's setup and what to print.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "tutti/sim.hpp"

namespace tutti::sim {

struct SimOptions {
  SimulationSetup setup;
  std::vector<int> ranks{1};
  bool compare = false, json = false, algorithms = false;
  std::int64_t global_batch = 0;  // strong scaling: this many samples per step over all ranks
};

/// Parses argv (flags, or --config FILE) and reads the profile and network files it names.
/// Throws std::invalid_argument naming the flag on a malformed command line, and what
/// read_profile_file and read_network_file throw. Returns nullopt after printing the help for -h/--help.
std::optional<SimOptions> parse_options(int argc, char** argv);

}  // namespace tutti::sim
