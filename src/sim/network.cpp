// Networks: the text format of <tutti/sim.hpp>.
#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <sstream>

#include "tutti/sim.hpp"

namespace tutti::sim {

Network read_network(std::istream& in, const std::string& source) {
  Network network;
  struct Key {
    const char* name;
    double Network::*field;
  };
  static constexpr Key keys[] = {
      {"alpha", &Network::alpha},           {"beta", &Network::beta},   {"intra_alpha", &Network::intra_alpha},
      {"intra_beta", &Network::intra_beta}, {"gamma", &Network::gamma}, {"copy_beta", &Network::copy_beta}};
  std::string text;
  int line = 0;
  while (std::getline(in, text)) {
    ++line;
    std::istringstream fields(text);
    std::string key, extra;
    if (!(fields >> key) || key[0] == '#') continue;
    const Key* found = nullptr;
    for (const auto& k : keys)
      if (key == k.name) found = &k;
    const std::string where = source + ":" + std::to_string(line) + ": ";
    if (!found)
      throw Error(ErrorCode::invalid_argument,
                  where + "unknown key \"" + key + "\" (alpha, beta, intra_alpha, intra_beta, gamma, copy_beta)");
    double value = 0;
    if (!(fields >> value) || !std::isfinite(value) || value < 0)
      throw Error(ErrorCode::invalid_argument, where + key + " must be a finite number >= 0");
    if (fields >> extra && extra[0] != '#')
      throw Error(ErrorCode::invalid_argument, where + "unexpected \"" + extra + "\"");
    network.*(found->field) = value;
  }
  return network;
}

Network read_network_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw Error(ErrorCode::invalid_argument, "cannot open network " + path + ": " + std::strerror(errno));
  return read_network(in, path);
}

}  // namespace tutti::sim
