// tutti-sim: the training-step simulator (docs/scaling.md); its flags are sim/options.hpp's.
//
//   tutti-sim --profile profiles/vgg16.profile --network profiles/aries.network --ranks 64,512,8192 --compare
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "sim/options.hpp"
#include "tutti/sim.hpp"

namespace {

using tutti::sim::Policy;
using tutti::sim::SimulationResult;
using tutti::sim::SimulationSetup;

using Options = tutti::sim::SimOptions;

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
    auto parsed = tutti::sim::parse_options(argc, argv);
    if (!parsed) return 0;  // --help
    o = std::move(*parsed);
  } catch (const std::exception& e) {  // a bad flag, or a profile or network file that does not read
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
