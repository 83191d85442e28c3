// The tools' shared command-line piece (tools/common/cli.hpp): the size syntax, exactly, with its
// errors and overflow; --opt=value, --config and unknown flags on a small CLI11 app.
#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>

#include "common/cli.hpp"
#include "tool_options_test.hpp"

namespace {

using tutti::tools::parse_size;
using tutti::tools::UsageError;

constexpr std::size_t KiB = std::size_t{1} << 10, MiB = std::size_t{1} << 20, GiB = std::size_t{1} << 30;

TEST(ToolCli, SizesArePowersOf1024InAnyCase) {
  const std::pair<const char*, std::size_t> cases[] = {{"0", 0},
                                                       {"1", 1},
                                                       {"256", 256},
                                                       {"007", 7},
                                                       {"64K", 64 * KiB},
                                                       {"64k", 64 * KiB},
                                                       {"64KiB", 64 * KiB},
                                                       {"64kib", 64 * KiB},
                                                       {"64KIB", 64 * KiB},
                                                       {"8M", 8 * MiB},
                                                       {"8m", 8 * MiB},
                                                       {"8MiB", 8 * MiB},
                                                       {"8mib", 8 * MiB},
                                                       {"1G", GiB},
                                                       {"1g", GiB},
                                                       {"1GiB", GiB},
                                                       {"3gib", 3 * GiB},
                                                       {"0K", 0},
                                                       {"1024M", GiB}};
  for (const auto& [text, bytes] : cases) EXPECT_EQ(parse_size(text, "--size"), bytes) << text;
  EXPECT_EQ(parse_size("18446744073709551615", "--size"), std::numeric_limits<std::size_t>::max());
  EXPECT_EQ(parse_size("17179869183G", "--size"), std::numeric_limits<std::size_t>::max() - GiB + 1);
}

TEST(ToolCli, APlainNumberCountsTheFlagsUnit) {
  EXPECT_EQ(parse_size("8", "--device-memory", MiB), 8 * MiB);
  EXPECT_EQ(parse_size("8K", "--device-memory", MiB), 8 * KiB);
  EXPECT_EQ(parse_size("2G", "--device-memory", MiB), 2 * GiB);
}

std::string size_error(const std::string& text, std::size_t unit = 1) {
  try {
    parse_size(text, "--fusion-threshold", unit);
  } catch (const UsageError& e) {
    return e.what();
  }
  return "accepted";
}

TEST(ToolCli, BadSizesAreRefusedNamingTheFlag) {
  for (const char* text : {"", "K", "KiB", "-1", "+1", "1.5K", "1e6", "0x10", "64KB", "64B", "12X", " 1", "1 K", "1K ",
                           "1Ki", "1kibs", "MiB8"})
    EXPECT_EQ(size_error(text),
              std::string("--fusion-threshold: expected a size (bytes, or a whole number with K, M, G, "
                          "KiB, MiB or GiB), got '") +
                  text + "'")
        << text;
}

TEST(ToolCli, SizesThatDoNotFitAreRefused) {
  const std::string too_large = "' is too large (at most 18446744073709551615 bytes)";
  for (const char* text :
       {"18446744073709551616", "99999999999999999999999", "17179869184G", "17592186044416M", "18014398509481984K"})
    EXPECT_EQ(size_error(text), "--fusion-threshold: '" + std::string(text) + too_large) << text;
  EXPECT_EQ(size_error("17592186044416", MiB), "--fusion-threshold: '17592186044416" + too_large);
}

// A small app as the tools build theirs.
struct App {
  CLI::App app{"test", "tool"};
  std::size_t bytes = 8;
  std::optional<std::size_t> maybe;
  int count = 1;
  double ratio = 0.5;
  bool flag = false;
  App() {
    tutti::tools::configure(app);
    tutti::tools::add_size(app, "-b,--bytes", bytes, "a size");
    tutti::tools::add_size(app, "--maybe", maybe, "an optional size", MiB);
    app.add_option("-n,--count", count, "a count")->transform(tutti::tools::number<int>());
    app.add_option("--ratio", ratio, "a number")->transform(tutti::tools::number<double>());
    app.add_flag("--flag", flag, "a flag");
  }
  // parse(), or its error's message.
  std::string parse(std::vector<std::string> args) {
    tutti::testing::Argv a("tool", std::move(args));
    try {
      return tutti::tools::parse(app, a.argc(), a.argv(), {{"-t", "--thing"}}) ? "parsed" : "help";
    } catch (const UsageError& e) {
      return e.what();
    }
  }
};

TEST(ToolCli, BothFormsOfALongFlag) {
  App a;
  ASSERT_EQ(a.parse({"--bytes=64KiB", "--maybe", "3", "--count=12", "--ratio", "0.25", "--flag"}), "parsed");
  EXPECT_EQ(a.bytes, 64 * KiB);
  EXPECT_EQ(a.maybe, 3 * MiB);
  EXPECT_EQ(a.count, 12);
  EXPECT_EQ(a.ratio, 0.25);
  EXPECT_TRUE(a.flag);
  App b;
  ASSERT_EQ(b.parse({"-b", "2M", "-n", "3", "-b", "1K"}), "parsed");  // the last of a repeated flag wins
  EXPECT_EQ(b.bytes, KiB);
  EXPECT_EQ(b.maybe, std::nullopt);
  EXPECT_EQ(b.count, 3);
}

TEST(ToolCli, NumbersAreBaseTenAndWhole) {
  EXPECT_EQ(App().parse({"-n", "010"}), "parsed");
  App a;
  a.parse({"--count=010"});
  EXPECT_EQ(a.count, 10);  // not octal
  EXPECT_EQ(App().parse({"-n", "0x10"}), "--count: expected an integer, got '0x10'");
  EXPECT_EQ(App().parse({"-n", "1.5"}), "--count: expected an integer, got '1.5'");
  EXPECT_EQ(App().parse({"-n", "99999999999"}), "--count: expected an integer, got '99999999999'");
  EXPECT_EQ(App().parse({"--ratio", "x"}), "--ratio: expected a number, got 'x'");
  EXPECT_EQ(App().parse({"--bytes=1.5K"}),
            "--bytes: expected a size (bytes, or a whole number with K, M, G, KiB, MiB or GiB), got '1.5K'");
  EXPECT_EQ(App().parse({"--maybe", "17592186044416"}),
            "--maybe: '17592186044416' is too large (at most 18446744073709551615 bytes)");
}

TEST(ToolCli, UnknownFlagsAndArgumentsAreNamed) {
  EXPECT_EQ(App().parse({"--frobnicate"}), "unknown option --frobnicate (see --help)");
  EXPECT_EQ(App().parse({"--frobnicate=3"}), "unknown option --frobnicate (see --help)");
  EXPECT_EQ(App().parse({"-t", "all"}), "unknown option -t (use --thing)");
  EXPECT_EQ(App().parse({"-b", "1K", "stray"}), "unexpected argument 'stray' (see --help)");
  EXPECT_EQ(App().parse({"--bytes"}), "--bytes: 1 required SIZE missing");
}

TEST(ToolCli, ConfigFileValuesAndTheCommandLineWins) {
  tutti::testing::TempFile file("tool_cli.toml", "bytes = \"4KiB\"\nmaybe = 2\ncount = 5\nflag = true\n");
  App a;
  ASSERT_EQ(a.parse({"--config", file.path()}), "parsed");
  EXPECT_EQ(a.bytes, 4 * KiB);
  EXPECT_EQ(a.maybe, 2 * MiB);
  EXPECT_EQ(a.count, 5);
  EXPECT_TRUE(a.flag);
  App b;
  ASSERT_EQ(b.parse({"--count=7", "--config=" + file.path(), "-b", "1G"}), "parsed");
  EXPECT_EQ(b.bytes, GiB);
  EXPECT_EQ(b.count, 7);
  EXPECT_EQ(b.maybe, 2 * MiB);
  tutti::testing::TempFile ini("tool_cli.ini", "bytes=1M\ncount=2\n");
  App c;
  ASSERT_EQ(c.parse({"--config", ini.path()}), "parsed");
  EXPECT_EQ(c.bytes, MiB);
  EXPECT_EQ(c.count, 2);
}

TEST(ToolCli, BadConfigFilesAreRefused) {
  tutti::testing::TempFile unknown("tool_cli_unknown.toml", "bytes = 1\nbogus = 2\n");
  EXPECT_EQ(App().parse({"--config", unknown.path()}), "--config: unknown key 'bogus'");
  tutti::testing::TempFile section("tool_cli_section.toml", "[run]\nbytes = 1\n");
  EXPECT_EQ(App().parse({"--config", section.path()}), "--config: unknown section [run]");
  tutti::testing::TempFile bad("tool_cli_bad.toml", "bytes = \"1.5K\"\n");
  EXPECT_EQ(App().parse({"--config", bad.path()}),
            "--bytes: expected a size (bytes, or a whole number with K, M, G, KiB, MiB or GiB), got '1.5K'");
  EXPECT_EQ(App().parse({"--config", "/nonexistent/tool.toml"}),
            "--config: /nonexistent/tool.toml was not readable (missing?)");
}

TEST(ToolCli, HelpIsPrintedNotParsed) {
  ::testing::internal::CaptureStdout();
  EXPECT_EQ(App().parse({"--help"}), "help");
  const std::string help = ::testing::internal::GetCapturedStdout();
  EXPECT_NE(help.find("-b,--bytes SIZE"), std::string::npos) << help;
  EXPECT_NE(help.find("--config FILE"), std::string::npos) << help;
}

}  // namespace
