#include "common/cli.hpp"

#include <cctype>
#include <cstdint>
#include <cstdio>
#include <limits>

namespace tutti::tools {

namespace {

std::string lower(std::string_view text) {
  std::string out(text);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

// parse_size without the flag: the bytes in `bytes`, or why not.
std::string size_error(std::string_view text, std::size_t unit, std::size_t& bytes) {
  const std::string expected =
      "expected a size (bytes, or a whole number with K, M, G, KiB, MiB or GiB), got '" + std::string(text) + "'";
  std::size_t digits = 0;
  while (digits < text.size() && std::isdigit(static_cast<unsigned char>(text[digits]))) ++digits;
  if (digits == 0) return expected;
  const std::string suffix = lower(text.substr(digits));
  std::size_t multiplier = unit;
  if (suffix == "k" || suffix == "kib")
    multiplier = std::size_t{1} << 10;
  else if (suffix == "m" || suffix == "mib")
    multiplier = std::size_t{1} << 20;
  else if (suffix == "g" || suffix == "gib")
    multiplier = std::size_t{1} << 30;
  else if (!suffix.empty())
    return expected;
  std::size_t count = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + digits, count);
  if (ec == std::errc::result_out_of_range || count > std::numeric_limits<std::size_t>::max() / multiplier)
    return "'" + std::string(text) + "' is too large (at most " +
           std::to_string(std::numeric_limits<std::size_t>::max()) + " bytes)";
  bytes = count * multiplier;
  return {};
}

// CLI11's transform for a size flag: the text becomes the bytes, in decimal, which CLI11 converts.
CLI::Validator size_validator(std::size_t unit) {
  return CLI::Validator(
      [unit](std::string& text) {
        std::size_t bytes = 0;
        std::string why = size_error(text, unit, bytes);
        if (why.empty()) text = std::to_string(bytes);
        return why;
      },
      "");
}

// An argument nothing took: which, and what to use instead if it is a short flag a tool gave up.
std::string unknown_message(const std::string& arg, const std::vector<Renamed>& renamed) {
  const bool flag = arg.size() > 1 && arg[0] == '-' && !std::isdigit(static_cast<unsigned char>(arg[1]));
  if (!flag) return "unexpected argument '" + arg + "' (see --help)";
  const std::string name = arg.substr(0, arg.find('='));
  for (const Renamed& r : renamed)
    if (name == r.flag || (r.flag.size() == 2 && name.rfind(r.flag, 0) == 0))
      return "unknown option " + name + " (use " + std::string(r.use) + ")";
  return "unknown option " + name + " (see --help)";
}

}  // namespace

std::size_t parse_size(std::string_view text, std::string_view flag, std::size_t unit) {
  std::size_t bytes = 0;
  const std::string why = size_error(text, unit, bytes);
  if (!why.empty()) throw UsageError(std::string(flag) + ": " + why);
  return bytes;
}

CLI::Option* add_size(CLI::App& app, const std::string& names, std::size_t& target, const std::string& help,
                      std::size_t unit) {
  return app.add_option(names, target, help)->type_name("SIZE")->transform(size_validator(unit));
}

CLI::Option* add_size(CLI::App& app, const std::string& names, std::optional<std::size_t>& target,
                      const std::string& help, std::size_t unit) {
  return app
      .add_option_function<std::size_t>(
          names, [&target](const std::size_t& bytes) { target = bytes; }, help)
      ->type_name("SIZE")
      ->transform(size_validator(unit));
}

void configure(CLI::App& app) {
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  app.allow_extras();  // parse() names them itself
  app.allow_config_extras(CLI::config_extras_mode::error);
  app.set_config("--config", "",
                 "read flags from FILE (TOML or INI): one `name = value` a line, the long flag without its "
                 "dashes (maxbytes = \"64M\"); the command line wins over the file")
      ->type_name("FILE");
  app.get_formatter()->column_width(34);
}

bool parse(CLI::App& app, int argc, const char* const* argv, const std::vector<Renamed>& renamed) {
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp&) {
    std::fputs(app.help().c_str(), stdout);
    return false;
  } catch (const CLI::ConfigError& e) {
    const std::string what = e.what();
    const std::string extra = "INI was not able to parse ";
    if (what.rfind(extra, 0) == 0) {
      std::string key = what.substr(extra.size());
      const std::string section = ".++";  // how CLI11 names a [section] line: the tools have none
      if (key.size() > section.size() && key.ends_with(section))
        throw UsageError("--config: unknown section [" + key.substr(0, key.size() - section.size()) + "]");
      throw UsageError("--config: unknown key '" + key + "'");
    }
    throw UsageError("--config: " + what);
  } catch (const CLI::FileError& e) {
    throw UsageError(std::string("--config: ") + e.what());
  } catch (const CLI::ParseError& e) {
    throw UsageError(e.what());
  }
  const std::vector<std::string> extras = app.remaining();
  if (!extras.empty()) throw UsageError(unknown_message(extras.front(), renamed));
  return true;
}

}  // namespace tutti::tools
