// The training-step simulator's inputs and outputs: model profiles, networks, engine policies.
//
// A model profile is what one rank's training step computes and communicates: forward time,
// each gradient in the order backward produces it (its size and the backward time until it is
// ready), and the optimizer's time. `tutti-train --profile FILE` records one from a real run;
// one can also be written by hand. The file is line-oriented text:
//
//   tutti-profile 1
//   model vgg16
//   batch 32                          # samples per rank and step
//   forward 0.1234                    # seconds
//   optimizer 0.0100                  # seconds
//   note measured on ..., scaled by ...   (free text, any number of lines)
//   grad classifier.6.bias 1000 f32 0.0012    # name, elements, type, backward seconds since
//   grad classifier.6.weight 4096000 f32 0.0 #   the previous gradient (or backward's start)
//   backward_tail 0.0003              # optional: backward's time after its last gradient
//   jitter 0.08                       # optional: a rank's step compute varies by this much from
//                                     #   step to step (standard deviation over mean)
//
// Blank lines and text after '#' are ignored; names contain no spaces.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <iosfwd>
#include <string>
#include <vector>

#include "tutti/types.hpp"

namespace tutti::sim {

struct GradientProfile {
  std::string name;
  std::size_t count = 0;  ///< elements
  DataType type = DataType::f32;
  double backward_seconds = 0;  ///< compute between the previous gradient (or backward's start) and this one
};

struct ModelProfile {
  std::string model;
  std::int64_t batch_size = 0;  ///< samples per rank and step
  double forward_seconds = 0;
  double optimizer_seconds = 0;
  double backward_tail_seconds = 0;        ///< backward's time after its last gradient is ready
  double jitter = 0;                       ///< step-to-step variation of a rank's compute (std / mean)
  std::vector<GradientProfile> gradients;  ///< in the order backward produces them
  std::vector<std::string> notes;          ///< provenance, one line each

  double backward_seconds() const;  ///< the gradients' segments and the tail
  std::size_t gradient_bytes() const;
  /// Forward + backward + optimizer: the step without communication.
  double compute_seconds() const { return forward_seconds + backward_seconds() + optimizer_seconds; }
};

/// Parses the format above. Throws Error(invalid_argument) naming `source` and the line on a
/// malformed or missing field, an unknown type, a negative time or a duplicate gradient name.
ModelProfile read_profile(std::istream& in, const std::string& source = "profile");
/// Reads `path`; Error(invalid_argument) naming it when it cannot be opened.
ModelProfile read_profile_file(const std::string& path);
/// Writes `profile` in the format read_profile reads (times with 9 significant digits).
void write_profile(std::ostream& out, const ModelProfile& profile);
/// Writes to `path` atomically (a temporary file renamed); Error(system) on failure.
void write_profile_file(const std::string& path, const ModelProfile& profile);

/// A two-level network: ranks of one host talk over its local path, hosts over links, one per
/// host, that the host's ranks share. Times in seconds; β per byte, γ per reduced element.
/// The defaults are the library's compiled-in costs of shared memory (inside a host) and TCP.
///
/// File format (`tutti-sim --network FILE`): lines `KEY VALUE` with the keys below, '#' comments:
///   alpha 2e-6        # across hosts: s per message       beta 1e-10    # across hosts: s per byte
///   intra_alpha 3e-6  # inside a host                     intra_beta 3e-10
///   gamma 2e-10       # s per reduced element             copy_beta 1e-10  # s per byte of a memcpy
struct Network {
  double alpha = 50.0e-6, beta = 6.5e-10;
  double intra_alpha = 3.0e-6, intra_beta = 3.0e-10;
  double gamma = 2.0e-10;
  double copy_beta = 1.0e-10;  ///< the engine's copies into and out of its fusion buffer
};

/// Parses the format above (keys not given keep their defaults). Error(invalid_argument) naming
/// `source` and the line for an unknown key or a value that is not a finite number >= 0.
Network read_network(std::istream& in, const std::string& source = "network");
Network read_network_file(const std::string& path);

/// The engine's policy, as EngineOptions and DistributedOptimizer set it.
struct Policy {
  bool overlap = true;  ///< enqueue each gradient when backward produces it (else all after backward)
  std::chrono::microseconds cycle_time{1000};
  std::size_t fusion_threshold = 64u << 20;
  std::size_t first_bucket_bytes = 1u << 20;
  bool fp16 = false;  ///< gradients travel as f16 (half the bytes; the codec's time is not modelled)
};

/// A rank whose compute (forward, backward, optimizer) takes `factor` times as long.
struct Straggler {
  int rank = 0;
  double factor = 1;
};

struct SimulationSetup {
  ModelProfile profile;
  Network network;
  int ranks = 1;
  int ranks_per_host = 1;  ///< must divide `ranks`
  Policy policy;
  std::vector<Straggler> stragglers;
  /// Each rank's compute in each step is multiplied by a draw of a log-normal factor of mean 1
  /// and this standard deviation (0: none; < 0: the profile's `jitter`). Every rank is then
  /// simulated on its own (at most 4,096 ranks).
  double jitter = -1;
  std::uint64_t seed = 1;     ///< of the jitter's draws
  int steps = 4;              ///< simulated steps; the first is a warm-up (names not yet cached)
  std::string timeline_path;  ///< Chrome trace of rank 0 ("{rank}": of one rank per distinct compute speed)
};

/// A simulated job's steady state: means over the steps after the first.
struct SimulationResult {
  double step_seconds = 0;         ///< from one step's start to the next, on the slowest rank
  double compute_seconds = 0;      ///< forward + backward + optimizer of the slowest rank
  double exposed_seconds = 0;      ///< step - compute: communication that compute did not hide
  double allreduce_seconds = 0;    ///< time in the engine's collective calls per step
  double negotiation_seconds = 0;  ///< time in negotiation rounds per step
  double hidden_fraction = 0;      ///< 1 - exposed / (allreduce + negotiation), in [0, 1]
  double collectives = 0;          ///< collective calls per step
  double cycles = 0;               ///< negotiation rounds per step
  double bytes = 0;                ///< bytes reduced per step (per rank)
  /// Idle time per step on the slowest rank between its weight update and its next compute
  /// (0 in this model: the next forward starts at once) and, on the fastest rank, waiting in
  /// step() for the slowest (the straggler's delay others see).
  double wait_seconds = 0;
  std::vector<std::string> algorithms;  ///< how each distinct call size was run, e.g. "25.0 MB: ring"
};

/// Simulates `setup.steps` training steps of the engine under the α-β model (docs/scaling.md):
/// the profile's compute, the engine's negotiation rounds (the engine's own Table) and fusion
/// plan (the engine's own plan_fusion), each collective call timed by the critical path of
/// Tutti's own schedules on the two-level network, with hosts' links shared. Error(invalid_argument)
/// for ranks < 1, ranks_per_host not dividing ranks, a straggler rank outside the job or a factor < 1.
SimulationResult simulate(const SimulationSetup& setup);

}  // namespace tutti::sim
