// tutti-train's command line (tools/train/settings.hpp): its size flags in the shared size syntax
// (--device-memory's plain number still MiB), --opt=value, --config, and what it refuses, each
// checked against the settings it yields.
#include <gtest/gtest.h>

#include <cstddef>
#include <string>
#include <vector>

#include "settings.hpp"
#include "tool_options_test.hpp"

namespace {

using tutti::train::Settings;
using tutti::train::UsageError;

constexpr std::size_t MiB = std::size_t{1} << 20;

Settings parse(std::vector<std::string> args) {
  return tutti::testing::parsed("tutti-train", std::move(args), tutti::train::parse_settings);
}

std::string refusal(std::vector<std::string> args) {
  return tutti::testing::refusal<UsageError>("tutti-train", std::move(args), tutti::train::parse_settings);
}

TEST(TrainSettings, Defaults) {
  const Settings s = parse({});
  EXPECT_EQ(s.epochs, 2);
  EXPECT_EQ(s.batch_size, 64);
  EXPECT_EQ(s.fusion_threshold, std::nullopt);
  EXPECT_EQ(s.device_memory, 0u);
  EXPECT_TRUE(s.overlap);
  EXPECT_TRUE(s.progress);
  EXPECT_FALSE(s.help);
}

TEST(TrainSettings, BothFormsAndTheSizeSyntax) {
  const Settings s =
      parse({"--epochs=3", "--batch-size", "32", "--lr=0.1", "--seed=7", "--no-overlap", "--fusion-threshold=4MiB",
             "--train-samples", "512", "--straggler=1:1.5", "--device-memory", "8", "--no-swap", "--log-interval=5"});
  EXPECT_EQ(s.epochs, 3);
  EXPECT_EQ(s.batch_size, 32);
  EXPECT_EQ(s.lr, 0.1);
  EXPECT_EQ(s.seed, 7u);
  EXPECT_FALSE(s.overlap);
  EXPECT_EQ(s.fusion_threshold, 4 * MiB);
  EXPECT_EQ(s.train_samples, 512u);
  ASSERT_TRUE(s.straggler.has_value());
  EXPECT_EQ(s.straggler->rank, 1);
  EXPECT_EQ(s.straggler->factor, 1.5);
  EXPECT_EQ(s.device_memory, 8 * MiB);  // a plain number: MiB, as before
  EXPECT_FALSE(s.swap);
  EXPECT_EQ(s.log_interval, 5);
  EXPECT_EQ(parse({"--fusion-threshold", "65536"}).fusion_threshold, 65536u);
  EXPECT_EQ(parse({"--fusion-threshold", "0"}).fusion_threshold, 0u);
  EXPECT_EQ(parse({"--device-memory=512K"}).device_memory, 512u << 10);
  EXPECT_EQ(parse({"--device-memory=2gib"}).device_memory, 2048 * MiB);
}

TEST(TrainSettings, BadSizesAreRefusedNamingTheFlag) {
  EXPECT_EQ(refusal({"--fusion-threshold", "1.5M"}),
            "--fusion-threshold: expected a size (bytes, or a whole number with K, M, G, KiB, MiB or GiB), got "
            "'1.5M'");
  EXPECT_EQ(refusal({"--fusion-threshold=17179869184G"}),
            "--fusion-threshold: '17179869184G' is too large (at most 18446744073709551615 bytes)");
  EXPECT_EQ(refusal({"--device-memory", "17592186044416"}),
            "--device-memory: '17592186044416' is too large (at most 18446744073709551615 bytes)");
  EXPECT_EQ(refusal({"--device-memory", "0"}), "--device-memory must be at least 1");
  EXPECT_EQ(refusal({"--device-memory", "-8"}),
            "--device-memory: expected a size (bytes, or a whole number with K, M, G, KiB, MiB or GiB), got '-8'");
}

TEST(TrainSettings, ConfigFileAndTheCommandLineOverIt) {
  tutti::testing::TempFile file("train.toml",
                                "epochs = 5\nbatch-size = 128\nfusion-threshold = \"1M\"\nno-overlap = true\n"
                                "compression = \"bf16\"\n");
  const Settings s = parse({"--config", file.path()});
  EXPECT_EQ(s.epochs, 5);
  EXPECT_EQ(s.batch_size, 128);
  EXPECT_EQ(s.fusion_threshold, MiB);
  EXPECT_FALSE(s.overlap);
  EXPECT_EQ(s.compression, "bf16");
  const Settings over = parse({"--config=" + file.path(), "--epochs", "1", "--fusion-threshold=2K"});
  EXPECT_EQ(over.epochs, 1);
  EXPECT_EQ(over.fusion_threshold, 2048u);
  EXPECT_EQ(over.batch_size, 128);
  tutti::testing::TempFile bad("train_bad.toml", "epochs = 1\nepoch = 2\n");
  EXPECT_EQ(refusal({"--config", bad.path()}), "--config: unknown key 'epoch'");
}

TEST(TrainSettings, WhatTheHandParserRefusedIsStillRefused) {
  EXPECT_EQ(refusal({"--bogus"}), "unknown option --bogus (see --help)");
  EXPECT_EQ(refusal({"--epochs", "0"}), "--epochs must be at least 1");
  EXPECT_EQ(refusal({"--epochs=x"}), "--epochs needs a number, not 'x'");
  EXPECT_EQ(refusal({"--epochs", "0x10"}), "--epochs needs a number, not '0x10'");
  EXPECT_EQ(refusal({"--seed", "-1"}), "--seed needs a number, not '-1'");
  EXPECT_EQ(refusal({"--log-interval", "-1"}), "--log-interval must be at least 0");
  EXPECT_EQ(refusal({"--lr", "0"}), "--lr must be positive");
  EXPECT_EQ(refusal({"--zero", "3"}), "--zero takes 1 or 2");
  EXPECT_EQ(refusal({"--schedule", "zigzag", "--pipeline", "2"}), "--schedule takes gpipe or 1f1b, not 'zigzag'");
  EXPECT_EQ(refusal({"--straggler", "1:0.5"}), "--straggler: FACTOR must be a finite number >= 1, not '0.5'");
  EXPECT_EQ(refusal({"--no-swap"}), "--no-swap needs --device-memory MB");
  EXPECT_EQ(refusal({"--micro-batches", "2"}), "--micro-batches needs --pipeline N (N > 1)");
  EXPECT_EQ(refusal({"--epochs"}), "--epochs: 1 required N missing");
}

TEST(TrainSettings, HelpIsPrintedAndSaidSo) {
  ::testing::internal::CaptureStdout();
  EXPECT_TRUE(parse({"--help"}).help);
  const std::string help = ::testing::internal::GetCapturedStdout();
  EXPECT_NE(help.find("--fusion-threshold SIZE"), std::string::npos) << help;
  EXPECT_NE(help.find("--device-memory SIZE"), std::string::npos) << help;
}

}  // namespace
