#include <iterator>
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

namespace {

// Names as schedule::to_string(Collective) and tutti::to_string(Algorithm) spell them.
constexpr std::string_view kinds[] = {"allreduce",  "reduce",    "reduce_scatter", "allgather",
                                      "allgatherv", "broadcast", "alltoall",       "alltoallv",
                                      "gather",     "scatter",   "barrier"};
constexpr std::string_view algorithms[] = {
    "automatic", "ring",   "recursive_doubling", "rabenseifner", "binomial_tree", "bruck", "pairwise",
    "linear",    "direct", "hierarchical",       "mpi"};

template <std::size_t N>
std::uint8_t index_of(const std::string_view (&names)[N], std::string_view name) {
  for (std::size_t i = 0; i < N; ++i)
    if (names[i] == name) return static_cast<std::uint8_t>(i);
  return 0xff;
}

}  // namespace

WireSignature to_wire(const Signature& s) {
  WireSignature w;
  w.seq = s.seq;
  w.count = s.count;
  w.counts_hash = s.counts_hash;
  w.root = s.root;
  w.kind = index_of(kinds, s.kind);
  w.algorithm = index_of(algorithms, s.algorithm);
  w.type = static_cast<std::uint8_t>(s.type);
  w.op = s.op ? static_cast<std::int8_t>(*s.op) : std::int8_t{-1};
  return w;
}

Signature from_wire(const WireSignature& w) {
  Signature s;
  s.seq = w.seq;
  s.count = w.count;
  s.counts_hash = w.counts_hash;
  s.root = w.root;
  if (w.kind < std::size(kinds)) s.kind = kinds[w.kind];
  if (w.algorithm < std::size(algorithms)) s.algorithm = algorithms[w.algorithm];
  s.type = static_cast<DataType>(w.type);
  if (w.op >= 0) s.op = static_cast<ReduceOp>(w.op);
  return s;
}

}  // namespace tutti::transport
