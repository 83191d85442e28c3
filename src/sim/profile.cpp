// Model profiles: the text format of <tutti/sim.hpp>.
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iomanip>
#include <set>
#include <sstream>

#include "tutti/sim.hpp"

namespace tutti::sim {

namespace {

[[noreturn]] void malformed(const std::string& source, int line, const std::string& what) {
  throw Error(ErrorCode::invalid_argument, source + ":" + std::to_string(line) + ": " + what);
}

double seconds_field(std::istringstream& fields, const std::string& source, int line, const char* what) {
  double value = 0;
  if (!(fields >> value) || !std::isfinite(value) || value < 0)
    malformed(source, line, std::string(what) + " must be a finite number of seconds >= 0");
  return value;
}

}  // namespace

double ModelProfile::backward_seconds() const {
  double total = backward_tail_seconds;
  for (const auto& g : gradients) total += g.backward_seconds;
  return total;
}

std::size_t ModelProfile::gradient_bytes() const {
  std::size_t total = 0;
  for (const auto& g : gradients) total += g.count * size_of(g.type);
  return total;
}

ModelProfile read_profile(std::istream& in, const std::string& source) {
  ModelProfile profile;
  std::set<std::string> names;
  std::string text;
  int line = 0;
  bool header = false;
  while (std::getline(in, text)) {
    ++line;
    std::istringstream fields(text);
    std::string key;
    if (!(fields >> key) || key[0] == '#') continue;
    if (!header) {
      int version = 0;
      if (key != "tutti-profile" || !(fields >> version) || version != 1)
        malformed(source, line, "expected the header \"tutti-profile 1\"");
      header = true;
    } else if (key == "note") {
      std::string rest;
      std::getline(fields >> std::ws, rest);
      profile.notes.push_back(rest);
      continue;
    } else if (key == "model") {
      if (!(fields >> profile.model)) malformed(source, line, "model needs a name");
    } else if (key == "batch") {
      if (!(fields >> profile.batch_size) || profile.batch_size < 1) malformed(source, line, "batch must be >= 1");
    } else if (key == "forward") {
      profile.forward_seconds = seconds_field(fields, source, line, "forward");
    } else if (key == "optimizer") {
      profile.optimizer_seconds = seconds_field(fields, source, line, "optimizer");
    } else if (key == "backward_tail") {
      profile.backward_tail_seconds = seconds_field(fields, source, line, "backward_tail");
    } else if (key == "jitter") {
      profile.jitter = seconds_field(fields, source, line, "jitter");
    } else if (key == "grad") {
      GradientProfile g;
      std::string type;
      long long count = -1;
      if (!(fields >> g.name >> count >> type) || count < 1)
        malformed(source, line, "grad needs a name, a count >= 1, a type and backward seconds");
      g.count = static_cast<std::size_t>(count);
      const auto known = data_type_from_name(type);
      if (!known) malformed(source, line, "unknown type \"" + type + "\"");
      g.type = *known;
      g.backward_seconds = seconds_field(fields, source, line, "a gradient's backward time");
      if (!names.insert(g.name).second) malformed(source, line, "gradient \"" + g.name + "\" appears twice");
      profile.gradients.push_back(std::move(g));
    } else {
      malformed(source, line, "unknown field \"" + key + "\"");
    }
    std::string extra;
    if (fields >> extra && extra[0] != '#') malformed(source, line, "unexpected \"" + extra + "\"");
  }
  if (!header) malformed(source, line, "empty: expected the header \"tutti-profile 1\"");
  if (profile.gradients.empty()) malformed(source, line, "no gradients (\"grad\" lines)");
  if (profile.batch_size < 1) malformed(source, line, "no \"batch\" line");
  return profile;
}

ModelProfile read_profile_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw Error(ErrorCode::invalid_argument, "cannot open profile " + path + ": " + std::strerror(errno));
  return read_profile(in, path);
}

void write_profile(std::ostream& out, const ModelProfile& p) {
  out << "tutti-profile 1\nmodel " << (p.model.empty() ? "unnamed" : p.model) << "\nbatch " << p.batch_size
      << std::setprecision(9) << "\nforward " << p.forward_seconds << "\noptimizer " << p.optimizer_seconds << '\n';
  if (p.backward_tail_seconds > 0) out << "backward_tail " << p.backward_tail_seconds << '\n';
  if (p.jitter > 0) out << "jitter " << p.jitter << '\n';
  for (const auto& n : p.notes) out << "note " << n << '\n';
  for (const auto& g : p.gradients)
    out << "grad " << g.name << ' ' << g.count << ' ' << to_string(g.type) << ' ' << g.backward_seconds << '\n';
}

void write_profile_file(const std::string& path, const ModelProfile& profile) {
  const std::string temporary = path + ".tmp";
  {
    std::ofstream out(temporary, std::ios::trunc);
    write_profile(out, profile);
    out.flush();
    if (!out) throw Error(ErrorCode::system, "cannot write profile " + temporary);
  }
  if (std::rename(temporary.c_str(), path.c_str()) != 0)
    throw Error(ErrorCode::system, "cannot rename " + temporary + " to " + path + ": " + std::strerror(errno));
}

}  // namespace tutti::sim
