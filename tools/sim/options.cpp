#include "sim/options.hpp"

#include <chrono>
#include <cstdlib>
#include <sstream>
#include <string>

#include "common/cli.hpp"

namespace tutti::sim {

namespace {

using tools::UsageError;

double number(const std::string& text, const char* flag) {
  char* end = nullptr;
  const double v = std::strtod(text.c_str(), &end);
  if (text.empty() || *end != '\0' || !(v >= 0)) throw UsageError(std::string(flag) + ": expected a number >= 0");
  return v;
}

int integer(const std::string& text, const char* flag, int least) {
  char* end = nullptr;
  const long v = std::strtol(text.c_str(), &end, 10);
  if (text.empty() || *end != '\0' || v < least || v > (1 << 24))
    throw UsageError(std::string(flag) + ": expected an integer >= " + std::to_string(least));
  return static_cast<int>(v);
}

// The flags read as text (numbers checked with the messages above, lists, files), as given.
struct Text {
  std::string profile, network, ranks, overlap, cycle_time, jitter, seed, steps, global_batch, ranks_per_host;
  std::vector<std::string> stragglers;
  struct Override {
    const char* flag;
    double Network::*field;
    std::string value;
  };
  std::vector<Override> overrides = {{"--alpha", &Network::alpha, {}},
                                     {"--beta", &Network::beta, {}},
                                     {"--intra-alpha", &Network::intra_alpha, {}},
                                     {"--intra-beta", &Network::intra_beta, {}},
                                     {"--gamma", &Network::gamma, {}}};
};

void add_flags(CLI::App& app, SimOptions& o, Text& t) {
  app.add_option("--profile", t.profile, "model profile (tutti-train --profile, or profiles/*.profile); required")
      ->type_name("FILE");
  app.add_option("--network", t.network, "network (alpha, beta, intra_alpha, intra_beta, gamma, copy_beta)")
      ->type_name("FILE");
  const char* const override_help[] = {
      "across hosts: seconds per message (overrides the file)", "across hosts: seconds per byte (overrides the file)",
      "within a host: seconds per message", "within a host: seconds per byte", "seconds per reduced byte"};
  for (std::size_t i = 0; i < t.overrides.size(); ++i)
    app.add_option(t.overrides[i].flag, t.overrides[i].value, override_help[i])->type_name("S");
  app.add_option("--ranks", t.ranks, "ranks, or a comma list to sweep (default 1)")->type_name("LIST");
  app.add_option("--ranks-per-host", t.ranks_per_host, "(default 1; must divide every entry of --ranks)")
      ->type_name("R");
  app.add_option("--overlap", t.overlap,
                 "on|off: enqueue each gradient when ready (on, default) or all after backward");
  app.add_option("--cycle-time-ms", t.cycle_time, "negotiation cycle (default 1)")->type_name("X");
  tools::add_size(app, "--fusion-threshold", o.setup.policy.fusion_threshold,
                  "largest fused allreduce (default 64M; 0: no fusion)");
  tools::add_size(app, "--first-bucket", o.setup.policy.first_bucket_bytes,
                  "cap of a step's first fused call (default 1M)");
  app.add_flag("--fp16", o.setup.policy.fp16, "gradients travel as f16");
  app.add_option("--straggler", t.stragglers, "RANK:FACTOR: that rank computes FACTOR times slower (repeatable)")
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll)
      ->allow_extra_args(false);
  app.add_option("--jitter", t.jitter,
                 "each rank's compute in each step varies by a log-normal factor of mean 1 and this standard "
                 "deviation (default: the profile's jitter)")
      ->type_name("CV");
  app.add_option("--seed", t.seed, "of the jitter's draws (default 1)")->type_name("N");
  app.add_option("--steps", t.steps, "simulated steps, the first a warm-up (default 4)")->type_name("N");
  app.add_option("--timeline", o.setup.timeline_path, "Chrome trace of rank 0 (\"{rank}\": one per compute speed)")
      ->type_name("FILE");
  app.add_flag("--compare", o.compare,
               "three policies side by side: (a) allreduce after backward, no fusion; (b) overlapped, no fusion; "
               "(c) overlapped with fusion");
  app.add_option("--global-batch", t.global_batch,
                 "strong scaling: N samples per step over all ranks, each rank's compute scaled from the "
                 "profile's batch linearly (default: the profile's batch on every rank, weak scaling)")
      ->type_name("N");
  app.add_flag("--algorithms", o.algorithms, "under each row, how each distinct call size was run");
  app.add_flag("--json", o.json, "one JSON object per line instead of the table");
}

void read_policy(const CLI::App& app, const Text& t, SimOptions& o) {
  if (app.count("--ranks") > 0) {
    o.ranks.clear();
    std::stringstream list(t.ranks);
    for (std::string item; std::getline(list, item, ',');) o.ranks.push_back(integer(item, "--ranks", 1));
  }
  if (app.count("--ranks-per-host") > 0) o.setup.ranks_per_host = integer(t.ranks_per_host, "--ranks-per-host", 1);
  if (app.count("--overlap") > 0) {
    if (t.overlap != "on" && t.overlap != "off") throw UsageError("--overlap: expected on or off");
    o.setup.policy.overlap = t.overlap == "on";
  }
  if (app.count("--cycle-time-ms") > 0)
    o.setup.policy.cycle_time =
        std::chrono::microseconds(static_cast<long long>(number(t.cycle_time, "--cycle-time-ms") * 1000.0 + 0.5));
  for (const std::string& v : t.stragglers) {
    const auto colon = v.find(':');
    if (colon == std::string::npos) throw UsageError("--straggler: expected RANK:FACTOR");
    const double factor = number(v.substr(colon + 1), "--straggler");
    if (factor < 1) throw UsageError("--straggler: FACTOR must be >= 1");
    o.setup.stragglers.push_back({integer(v.substr(0, colon), "--straggler", 0), factor});
  }
  if (app.count("--jitter") > 0) o.setup.jitter = number(t.jitter, "--jitter");
  if (app.count("--seed") > 0) o.setup.seed = static_cast<std::uint64_t>(integer(t.seed, "--seed", 0));
  if (app.count("--steps") > 0) o.setup.steps = integer(t.steps, "--steps", 2);
  if (app.count("--global-batch") > 0) o.global_batch = integer(t.global_batch, "--global-batch", 1);
}

}  // namespace

std::optional<SimOptions> parse_options(int argc, char** argv) {
  SimOptions o;
  Text t;
  CLI::App app("Simulates training steps of Tutti's engine under an alpha-beta network model (docs/scaling.md).",
               "tutti-sim");
  tools::configure(app);
  add_flags(app, o, t);
  app.footer("Sizes: bytes, or a whole number with K, M, G, KiB, MiB or GiB (powers of 1024, any case).");
  if (!tools::parse(app, argc, argv)) return std::nullopt;
  read_policy(app, t, o);
  if (t.profile.empty()) throw UsageError("--profile is required");
  o.setup.profile = read_profile_file(t.profile);
  if (!t.network.empty()) o.setup.network = read_network_file(t.network);
  for (const auto& x : t.overrides)
    if (!x.value.empty()) o.setup.network.*(x.field) = number(x.value, x.flag);
  for (int p : o.ranks)
    if (p % o.setup.ranks_per_host != 0 && p != 1)
      throw UsageError("--ranks-per-host " + std::to_string(o.setup.ranks_per_host) + " does not divide " +
                       std::to_string(p));
  return o;
}

}  // namespace tutti::sim
