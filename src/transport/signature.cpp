#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include "transport/transport.hpp"
#include "tutti/types.hpp"

namespace tutti::transport {

namespace {

std::uint64_t hash_counts(std::span<const std::size_t> counts) {
  return counts.empty() ? 0 : tutti::detail::fnv1a(counts.data(), counts.size_bytes()) | 1;
}

}  // namespace

Signature Signature::of(const NativeCall& call, Algorithm algorithm) {
  Signature signature;
  signature.collective = call.collective;
  const bool per_rank_counts = call.collective == Collective::alltoallv || call.collective == Collective::allgatherv;
  signature.count = per_rank_counts ? 0 : call.count;
  signature.type = call.type;
  signature.op = call.op;
  signature.root = call.root;
  signature.algorithm = algorithm;
  signature.counts_hash = call.collective == Collective::allgatherv ? hash_counts(call.counts) : 0;
  return signature;
}

std::string Signature::describe() const {
  std::string out(to_string(collective));
  out += "(#" + std::to_string(seq) + ", count=" + std::to_string(count) + ", " + std::string(to_string(type));
  if (op) out += ", " + std::string(to_string(*op));
  if (root >= 0) out += ", root=" + std::to_string(root);
  if (algorithm != Algorithm::automatic) out += ", " + std::string(to_string(algorithm));
  if (counts_hash != 0) out += ", counts hash " + std::to_string(counts_hash % 1000003);
  return out + ")";
}

WireSignature to_wire(const Signature& s) {
  WireSignature w;
  w.seq = s.seq;
  w.count = s.count;
  w.counts_hash = s.counts_hash;
  w.root = s.root;
  w.collective = static_cast<std::uint8_t>(s.collective);
  w.algorithm = static_cast<std::uint8_t>(s.algorithm);
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
  // Out-of-range values stay as they are: they compare unequal to every real signature, and
  // to_string names them "invalid" in the mismatch report.
  s.collective = static_cast<Collective>(w.collective);
  s.algorithm = static_cast<Algorithm>(w.algorithm);
  s.type = static_cast<DataType>(w.type);
  if (w.op >= 0) s.op = static_cast<ReduceOp>(w.op);
  return s;
}

}  // namespace tutti::transport
