// tutti-sim's command line (tools/sim/options.hpp): its size flags in the shared size syntax,
// --opt=value, --config, and what it refuses, each checked against the setup it yields.
#include <gtest/gtest.h>

#include <chrono>
#include <cstddef>
#include <stdexcept>
#include <string>
#include <vector>

#include "sim/options.hpp"
#include "tool_options_test.hpp"

namespace {

using tutti::sim::SimOptions;

const std::string vgg16 = std::string(TUTTI_PROFILES_DIR) + "/vgg16.profile";
const std::string aries = std::string(TUTTI_PROFILES_DIR) + "/aries.network";

SimOptions parse_sim(std::vector<std::string> args) {
  return tutti::testing::parsed("tutti-sim", std::move(args), tutti::sim::parse_options);
}

std::string sim_refusal(std::vector<std::string> args) {
  return tutti::testing::refusal<std::exception>("tutti-sim", std::move(args), tutti::sim::parse_options);
}

TEST(SimOptions, Defaults) {
  const SimOptions o = parse_sim({"--profile", vgg16});
  EXPECT_EQ(o.ranks, std::vector<int>{1});
  EXPECT_EQ(o.setup.policy.fusion_threshold, std::size_t{64} << 20);
  EXPECT_EQ(o.setup.policy.first_bucket_bytes, std::size_t{1} << 20);
  EXPECT_EQ(o.setup.steps, 4);
  EXPECT_EQ(o.setup.profile.model, "vgg16");
}

TEST(SimOptions, BothFormsAndTheSizeSyntax) {
  const SimOptions o =
      parse_sim({"--profile=" + vgg16, "--network", aries, "--ranks=64,512", "--ranks-per-host", "4",
                 "--fusion-threshold=32MiB", "--first-bucket", "512k", "--cycle-time-ms=2.5", "--straggler", "1:2",
                 "--straggler=3:1.5", "--steps=3", "--alpha=2e-6", "--overlap=off", "--fp16", "--global-batch=1024"});
  EXPECT_EQ(o.ranks, (std::vector<int>{64, 512}));
  EXPECT_EQ(o.setup.ranks_per_host, 4);
  EXPECT_EQ(o.setup.policy.fusion_threshold, std::size_t{32} << 20);
  EXPECT_EQ(o.setup.policy.first_bucket_bytes, std::size_t{512} << 10);
  EXPECT_EQ(o.setup.policy.cycle_time, std::chrono::microseconds(2500));
  ASSERT_EQ(o.setup.stragglers.size(), 2u);
  EXPECT_EQ(o.setup.stragglers[0].rank, 1);
  EXPECT_EQ(o.setup.stragglers[0].factor, 2.0);
  EXPECT_EQ(o.setup.stragglers[1].rank, 3);
  EXPECT_EQ(o.setup.stragglers[1].factor, 1.5);
  EXPECT_EQ(o.setup.steps, 3);
  EXPECT_EQ(o.setup.network.alpha, 2e-6);
  EXPECT_FALSE(o.setup.policy.overlap);
  EXPECT_TRUE(o.setup.policy.fp16);
  EXPECT_EQ(o.global_batch, 1024);
  EXPECT_EQ(parse_sim({"--profile", vgg16, "--fusion-threshold", "0"}).setup.policy.fusion_threshold, 0u);
  EXPECT_EQ(parse_sim({"--profile", vgg16, "--fusion-threshold", "1G"}).setup.policy.fusion_threshold, 1u << 30);
}

TEST(SimOptions, BadSizesAreRefusedNamingTheFlag) {
  EXPECT_EQ(sim_refusal({"--profile", vgg16, "--fusion-threshold", "1.5M"}),
            "--fusion-threshold: expected a size (bytes, or a whole number with K, M, G, KiB, MiB or GiB), got '1.5M'");
  EXPECT_EQ(sim_refusal({"--profile", vgg16, "--first-bucket=-1"}),
            "--first-bucket: expected a size (bytes, or a whole number with K, M, G, KiB, MiB or GiB), got '-1'");
  EXPECT_EQ(sim_refusal({"--profile", vgg16, "--first-bucket=17179869184G"}),
            "--first-bucket: '17179869184G' is too large (at most 18446744073709551615 bytes)");
}

TEST(SimOptions, ConfigFileAndTheCommandLineOverIt) {
  tutti::testing::TempFile file("sim.toml", "profile = \"" + vgg16 + "\"\nranks = \"8,16\"\nranks-per-host = 2\n" +
                                                "fusion-threshold = \"16M\"\ncompare = true\n");
  const SimOptions o = parse_sim({"--config", file.path()});
  EXPECT_EQ(o.ranks, (std::vector<int>{8, 16}));
  EXPECT_EQ(o.setup.ranks_per_host, 2);
  EXPECT_EQ(o.setup.policy.fusion_threshold, std::size_t{16} << 20);
  EXPECT_TRUE(o.compare);
  const SimOptions over = parse_sim({"--config", file.path(), "--fusion-threshold=4K", "--ranks", "4"});
  EXPECT_EQ(over.setup.policy.fusion_threshold, 4096u);
  EXPECT_EQ(over.ranks, std::vector<int>{4});
  EXPECT_EQ(over.setup.ranks_per_host, 2);
}

TEST(SimOptions, WhatTheHandParserRefusedIsStillRefused) {
  EXPECT_EQ(sim_refusal({"--ranks", "4"}), "--profile is required");
  EXPECT_EQ(sim_refusal({"--profile", vgg16, "--bogus"}), "unknown option --bogus (see --help)");
  EXPECT_EQ(sim_refusal({"--profile", vgg16, "--ranks", "8", "--ranks-per-host", "3"}),
            "--ranks-per-host 3 does not divide 8");
  EXPECT_EQ(sim_refusal({"--profile", vgg16, "--straggler", "1:0.5"}), "--straggler: FACTOR must be >= 1");
  EXPECT_EQ(sim_refusal({"--profile", vgg16, "--straggler", "1"}), "--straggler: expected RANK:FACTOR");
  EXPECT_EQ(sim_refusal({"--profile", vgg16, "--overlap", "maybe"}), "--overlap: expected on or off");
  EXPECT_EQ(sim_refusal({"--profile", vgg16, "--steps", "1"}), "--steps: expected an integer >= 2");
  EXPECT_EQ(sim_refusal({"--profile", vgg16, "--alpha", "-1"}), "--alpha: expected a number >= 0");
  EXPECT_EQ(sim_refusal({"--profile", vgg16, "--ranks", "4,x"}), "--ranks: expected an integer >= 1");
  EXPECT_EQ(sim_refusal({"--profile", vgg16, "--jitter"}), "--jitter: 1 required CV missing");
}

}  // namespace
