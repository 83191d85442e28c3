// The tools' command line (tutti-bench, tutti-sim, tutti-train): CLI11, with what the three share.
// One size syntax for every size flag; `--opt=value` and `--opt value`; `--config FILE` (TOML or
// INI, the long flag names without their dashes; the command line wins over the file); -h/--help;
// and errors that name the flag, which the tools report in one line and exit 2 on.
#pragma once

#include <CLI/CLI.hpp>
#include <charconv>
#include <cstddef>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>
#include <type_traits>
#include <utility>
#include <vector>

namespace tutti::tools {

/// A malformed command line or config file; the message names the flag.
struct UsageError : std::invalid_argument {
  using std::invalid_argument::invalid_argument;
};

/// "256", "64K", "64KiB", "8m", "1GiB" → bytes: a decimal count of `unit` bytes (1, or 1 MiB for
/// the flags whose plain number has always meant MiB), or of KiB, MiB or GiB with a suffix
/// (K/KiB, M/MiB, G/GiB, any case; powers of 1024). Throws UsageError "FLAG: ..." for anything
/// else: an empty text, a sign, a fraction, another suffix, or a value that does not fit size_t.
std::size_t parse_size(std::string_view text, std::string_view flag, std::size_t unit = 1);

/// Adds a size flag (parse_size's syntax) to `app`; `names` as CLI11 takes them ("-b,--minbytes").
CLI::Option* add_size(CLI::App& app, const std::string& names, std::size_t& target, const std::string& help,
                      std::size_t unit = 1);
/// The same, for a size that is unset unless given.
CLI::Option* add_size(CLI::App& app, const std::string& names, std::optional<std::size_t>& target,
                      const std::string& help, std::size_t unit = 1);

/// `text` as a T: base 10 only, the whole text, in range (std::from_chars); nothing otherwise.
template <class T>
std::optional<T> read_number(std::string_view text) {
  T value{};
  const char* end = text.data() + text.size();
  const auto [last, ec] = std::from_chars(text.data(), end, value);
  if (text.empty() || ec != std::errc() || last != end) return std::nullopt;
  return value;
}

/// A CLI11 check for a numeric flag of type T, read as read_number reads it (CLI11 alone would
/// read 010 as octal and 0x10 as hex, and wrap -1 into an unsigned type).
template <class T>
CLI::Validator number() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        const std::optional<T> value = read_number<T>(text);
        if (!value)
          return std::string(std::is_integral_v<T> ? "expected an integer" : "expected a number") + ", got '" + text +
                 "'";
        if constexpr (std::is_integral_v<T>) text = std::to_string(*value);  // what CLI11 converts again
        return {};
      },
      "");
}

/// Sets `app` up as the tools share it: call before adding the options. -h/--help, --config FILE,
/// unknown config keys refused, a repeated flag's last value wins (as the hand parsers had it).
void configure(CLI::App& app);

/// A short flag a tool gave up: where it is met, the error says which long flag to use instead.
struct Renamed {
  std::string_view flag;
  std::string_view use;
};

/// Parses argv (argv[0] is the program). Returns false after printing the help for -h/--help.
/// Throws UsageError naming the flag: an unknown flag, a missing or malformed value, a bad config file.
bool parse(CLI::App& app, int argc, const char* const* argv, const std::vector<Renamed>& renamed = {});

}  // namespace tutti::tools
