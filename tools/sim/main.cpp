// tutti-sim: the training-step simulator's command line (docs/scaling.md).
//
//   tutti-sim --profile profiles/vgg16.profile --network profiles/aries.network --ranks 64,512,8192 --compare
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "tutti/sim.hpp"

namespace {

using tutti::sim::Policy;
using tutti::sim::SimulationResult;
using tutti::sim::SimulationSetup;

struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

const char* const usage_text = R"(usage: tutti-sim --profile FILE [options]
Simulates training steps of Tutti's engine under an alpha-beta network model (docs/scaling.md).
  --profile FILE          model profile (tutti-train --profile, or profiles/*.profile)
  --network FILE          network (alpha, beta, intra_alpha, intra_beta, gamma, copy_beta)
  --alpha S --beta S      across hosts: seconds per message, per byte (override the file)
  --intra-alpha S --intra-beta S --gamma S
  --ranks LIST            ranks, or a comma list to sweep (default 1)
  --ranks-per-host R      (default 1; must divide every entry of --ranks)
  --overlap on|off        enqueue each gradient when ready (on, default) or all after backward
  --cycle-time-ms X       negotiation cycle (default 1)
  --fusion-threshold B    bytes, K/M/G suffixes (default 64M; 0: no fusion)
  --first-bucket B        cap of a step's first fused call (default 1M)
  --fp16                  gradients travel as f16
  --straggler RANK:FACTOR that rank computes FACTOR times slower (repeatable)
  --jitter CV             each rank's compute in each step varies by a log-normal factor of
                          mean 1 and this standard deviation (default: the profile's jitter)
  --seed N                of the jitter's draws (default 1)
  --steps N               simulated steps, the first a warm-up (default 4)
  --timeline FILE         Chrome trace of rank 0 ("{rank}": one per compute speed)
  --compare               three policies side by side: (a) allreduce after backward, no
                          fusion; (b) overlapped, no fusion; (c) overlapped with fusion
  --global-batch N        strong scaling: N samples per step over all ranks, each rank's compute
                          scaled from the profile's batch linearly (N/p per rank; default: the
                          profile's batch on every rank, weak scaling)
  --algorithms            under each row, how each distinct call size was run
  --json                  one JSON object per line instead of the table
)";

double number(const std::string& text, const char* flag) {
  char* end = nullptr;
  const double v = std::strtod(text.c_str(), &end);
  if (text.empty() || *end != '\0' || !(v >= 0)) throw UsageError(std::string(flag) + ": expected a number >= 0");
  return v;
}

std::size_t bytes(const std::string& text, const char* flag) {
  if (text.empty()) throw UsageError(std::string(flag) + ": expected a size");
  std::string digits = text;
  std::size_t unit = 1;
  const char last = text.back();
  if (last == 'K' || last == 'M' || last == 'G') {
    unit = std::size_t{1} << (last == 'K' ? 10 : last == 'M' ? 20 : 30);
    digits.pop_back();
  }
  char* end = nullptr;
  const unsigned long long v = std::strtoull(digits.c_str(), &end, 10);
  if (digits.empty() || *end != '\0' || digits[0] == '-') throw UsageError(std::string(flag) + ": expected a size");
  return static_cast<std::size_t>(v) * unit;
}

int integer(const std::string& text, const char* flag, int least) {
  char* end = nullptr;
  const long v = std::strtol(text.c_str(), &end, 10);
  if (text.empty() || *end != '\0' || v < least || v > (1 << 24))
    throw UsageError(std::string(flag) + ": expected an integer >= " + std::to_string(least));
  return static_cast<int>(v);
}

struct Options {
  SimulationSetup setup;
  std::vector<int> ranks{1};
  bool compare = false, json = false, algorithms = false;
  std::int64_t global_batch = 0;  // strong scaling: this many samples per step over all ranks
};

Options parse(int argc, char** argv) {
  Options o;
  std::string profile, network;
  struct Override {
    const char* flag;
    double tutti::sim::Network::*field;
    std::string value;
  };
  std::vector<Override> overrides = {{"--alpha", &tutti::sim::Network::alpha, {}},
                                     {"--beta", &tutti::sim::Network::beta, {}},
                                     {"--intra-alpha", &tutti::sim::Network::intra_alpha, {}},
                                     {"--intra-beta", &tutti::sim::Network::intra_beta, {}},
                                     {"--gamma", &tutti::sim::Network::gamma, {}}};
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) throw UsageError(flag + " needs a value");
      return argv[++i];
    };
    bool matched = false;
    for (auto& x : overrides)
      if (flag == x.flag) x.value = value(), matched = true;
    if (matched) continue;
    if (flag == "--help" || flag == "-h") {
      std::cout << usage_text;
      std::exit(0);
    } else if (flag == "--profile") {
      profile = value();
    } else if (flag == "--network") {
      network = value();
    } else if (flag == "--ranks") {
      o.ranks.clear();
      std::stringstream list(value());
      for (std::string item; std::getline(list, item, ',');) o.ranks.push_back(integer(item, "--ranks", 1));
    } else if (flag == "--ranks-per-host") {
      o.setup.ranks_per_host = integer(value(), "--ranks-per-host", 1);
    } else if (flag == "--overlap") {
      const std::string v = value();
      if (v != "on" && v != "off") throw UsageError("--overlap: expected on or off");
      o.setup.policy.overlap = v == "on";
    } else if (flag == "--cycle-time-ms") {
      o.setup.policy.cycle_time =
          std::chrono::microseconds(static_cast<long long>(number(value(), "--cycle-time-ms") * 1000.0 + 0.5));
    } else if (flag == "--fusion-threshold") {
      o.setup.policy.fusion_threshold = bytes(value(), "--fusion-threshold");
    } else if (flag == "--first-bucket") {
      o.setup.policy.first_bucket_bytes = bytes(value(), "--first-bucket");
    } else if (flag == "--fp16") {
      o.setup.policy.fp16 = true;
    } else if (flag == "--straggler") {
      const std::string v = value();
      const auto colon = v.find(':');
      if (colon == std::string::npos) throw UsageError("--straggler: expected RANK:FACTOR");
      const double factor = number(v.substr(colon + 1), "--straggler");
      if (factor < 1) throw UsageError("--straggler: FACTOR must be >= 1");
      o.setup.stragglers.push_back({integer(v.substr(0, colon), "--straggler", 0), factor});
    } else if (flag == "--jitter") {
      o.setup.jitter = number(value(), "--jitter");
    } else if (flag == "--seed") {
      o.setup.seed = static_cast<std::uint64_t>(integer(value(), "--seed", 0));
    } else if (flag == "--steps") {
      o.setup.steps = integer(value(), "--steps", 2);
    } else if (flag == "--timeline") {
      o.setup.timeline_path = value();
    } else if (flag == "--compare") {
      o.compare = true;
    } else if (flag == "--global-batch") {
      o.global_batch = integer(value(), "--global-batch", 1);
    } else if (flag == "--algorithms") {
      o.algorithms = true;
    } else if (flag == "--json") {
      o.json = true;
    } else {
      throw UsageError("unknown option " + flag);
    }
  }
  if (profile.empty()) throw UsageError("--profile is required");
  o.setup.profile = tutti::sim::read_profile_file(profile);
  if (!network.empty()) o.setup.network = tutti::sim::read_network_file(network);
  for (const auto& x : overrides)
    if (!x.value.empty()) o.setup.network.*(x.field) = number(x.value, x.flag);
  for (int p : o.ranks)
    if (p % o.setup.ranks_per_host != 0 && p != 1)
      throw UsageError("--ranks-per-host " + std::to_string(o.setup.ranks_per_host) + " does not divide " +
                       std::to_string(p));
  return o;
}

struct Variant {
  const char* name;
  Policy policy;
};

std::vector<Variant> variants(const Options& o) {
  if (!o.compare) return {{"as given", o.setup.policy}};
  Policy after = o.setup.policy, overlapped = o.setup.policy, fused = o.setup.policy;
  after.overlap = false;
  after.fusion_threshold = 0;
  overlapped.fusion_threshold = 0;
  return {{"(a) after backward", after}, {"(b) overlapped", overlapped}, {"(c) overlapped+fusion", fused}};
}

SimulationResult run(const Options& o, const Policy& policy, int ranks) {
  SimulationSetup s = o.setup;
  if (o.global_batch > 0) {
    // Forward and backward linear in the batch (each rank's share of the global batch); the
    // update's work is the parameters', whatever the batch.
    const double factor = static_cast<double>(o.global_batch) / ranks / static_cast<double>(s.profile.batch_size);
    s.profile.forward_seconds *= factor;
    for (auto& g : s.profile.gradients) g.backward_seconds *= factor;
    s.profile.batch_size = std::max<std::int64_t>(1, o.global_batch / ranks);
  }
  s.policy = policy;
  s.ranks = ranks;
  s.ranks_per_host = ranks == 1 ? 1 : s.ranks_per_host;
  std::vector<tutti::sim::Straggler> inside;
  for (const auto& x : s.stragglers)
    if (x.rank < ranks) inside.push_back(x);
  s.stragglers = inside;
  return tutti::sim::simulate(s);
}

void print(const Options& o, const char* variant, int ranks, const SimulationResult& r, double base) {
  // Weak scaling: samples per second against one rank's; strong scaling (--global-batch): the
  // same global batch's step time against one rank's.
  const double work = o.global_batch > 0 ? 1.0 : static_cast<double>(ranks);
  const double speedup = r.step_seconds > 0 ? work * base / r.step_seconds : 0;
  if (o.json) {
    std::printf(
        "{\"variant\": \"%s\", \"ranks\": %d, \"ranks_per_host\": %d, \"step_s\": %.9g, \"compute_s\": %.9g, "
        "\"exposed_s\": %.9g, \"allreduce_s\": %.9g, \"negotiation_s\": %.9g, \"hidden\": %.6f, "
        "\"calls\": %.3f, \"cycles\": %.3f, \"wait_s\": %.9g, \"speedup\": %.6g}\n",
        variant, ranks, ranks == 1 ? 1 : o.setup.ranks_per_host, r.step_seconds, r.compute_seconds, r.exposed_seconds,
        r.allreduce_seconds, r.negotiation_seconds, r.hidden_fraction, r.collectives, r.cycles, r.wait_seconds,
        speedup);
    return;
  }
  std::printf("%-22s %7d %10.3f %10.3f %10.3f %7.1f %10.3f %10.3f %7.1f %7.1f %10.1f\n", variant, ranks,
              r.step_seconds * 1e3, r.compute_seconds * 1e3, r.exposed_seconds * 1e3, 100 * r.hidden_fraction,
              r.allreduce_seconds * 1e3, r.negotiation_seconds * 1e3, r.collectives, r.cycles, speedup);
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  try {
    o = parse(argc, argv);
  } catch (const UsageError& e) {
    std::fprintf(stderr, "tutti-sim: %s\n%s", e.what(), usage_text);
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tutti-sim: %s\n", e.what());
    return 2;
  }
  try {
    if (!o.json)
      std::printf("%-22s %7s %10s %10s %10s %7s %10s %10s %7s %7s %10s\n", "policy", "ranks", "step_ms", "compute_ms",
                  "exposed_ms", "hidden%", "reduce_ms", "negot_ms", "calls", "cycles", "speedup");
    for (const auto& v : variants(o)) {
      const double base = run(o, v.policy, 1).step_seconds;
      for (int p : o.ranks) {
        const auto r = run(o, v.policy, p);
        print(o, v.name, p, r, base);
        if (!o.json && o.algorithms)
          for (const auto& a : r.algorithms) std::printf("%24s%s\n", "", a.c_str());
      }
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tutti-sim: %s\n", e.what());
    return 1;
  }
  return 0;
}
