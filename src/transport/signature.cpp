#include <string>

#include "transport/transport.hpp"

namespace tutti::transport {

std::string Signature::describe() const {
  std::string out(kind);
  out += "(#" + std::to_string(seq) + ", count=" + std::to_string(count) + ", " + std::string(to_string(type));
  if (op) out += ", " + std::string(to_string(*op));
  if (root >= 0) out += ", root=" + std::to_string(root);
  if (!algorithm.empty()) out += ", " + std::string(algorithm);
  if (counts_hash != 0) out += ", counts hash " + std::to_string(counts_hash % 1000003);
  return out + ")";
}

}  // namespace tutti::transport
