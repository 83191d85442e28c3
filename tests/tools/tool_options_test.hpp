// Helpers of the tools' command-line tests: argv from strings, a temporary config file, the
// message of a refused command line.
#pragma once

#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>
#include <vector>

#include <unistd.h>

namespace tutti::testing {

/// argv for a parser: the program, then `args`; the strings live as long as this.
class Argv {
 public:
  Argv(const char* program, std::vector<std::string> args) : strings_(std::move(args)) {
    strings_.insert(strings_.begin(), program);
    for (std::string& s : strings_) pointers_.push_back(s.data());
  }
  int argc() const { return static_cast<int>(pointers_.size()); }
  char** argv() { return pointers_.data(); }

 private:
  std::vector<std::string> strings_;
  std::vector<char*> pointers_;
};

/// A file holding `text`, removed with this.
class TempFile {
 public:
  TempFile(const std::string& name, const std::string& text)
      : path_(std::filesystem::temp_directory_path() / (std::to_string(::getpid()) + "-" + name)) {
    std::ofstream(path_) << text;
  }
  ~TempFile() { std::filesystem::remove(path_); }
  std::string path() const { return path_.string(); }

 private:
  std::filesystem::path path_;
};

/// What `parse` (a callable taking argc, argv) returns for `args`: the options themselves, or, from
/// a parser that returns them as an optional, the value (std::logic_error if it printed the help).
template <class Parse>
auto parsed(const char* program, std::vector<std::string> args, Parse parse) {
  Argv a(program, std::move(args));
  auto result = parse(a.argc(), a.argv());
  if constexpr (requires { result.has_value(); }) {
    if (!result) throw std::logic_error("help printed");
    return *std::move(result);
  } else {
    return result;
  }
}

/// What `parse` (a callable taking argc, argv) throws, as text; "accepted" when it throws nothing.
template <class Exception, class Parse>
std::string refusal(const char* program, std::vector<std::string> args, Parse parse) {
  Argv a(program, std::move(args));
  try {
    parse(a.argc(), a.argv());
  } catch (const Exception& e) {
    return e.what();
  }
  return "accepted";
}

}  // namespace tutti::testing
