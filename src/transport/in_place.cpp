#include "transport/in_place.hpp"

#include <numeric>

namespace tutti::transport {

namespace {

// Bytes before this rank's block of the larger buffer: rank · count elements, or for allgatherv
// the counts of the ranks before it.
std::size_t block_offset(const NativeCall& call, int rank) {
  const std::size_t elem = size_of(call.type);
  if (call.collective == Collective::allgatherv)
    return std::accumulate(call.counts.begin(), call.counts.begin() + rank, std::size_t{0}) * elem;
  return static_cast<std::size_t>(rank) * call.count * elem;
}

}  // namespace

InPlace map_in_place(const NativeCall& call, int rank) {
  const auto* send = static_cast<const std::byte*>(call.send);
  const auto* recv = static_cast<const std::byte*>(call.recv);
  InPlace mapped{.input = send};
  if (send != recv) return mapped;
  switch (call.collective) {
    case Collective::allgather:
    case Collective::allgatherv:
      mapped.input = recv + block_offset(call, rank);
      break;
    case Collective::alltoall:
    case Collective::alltoallv:
      mapped.snapshot_input = true;
      break;
    case Collective::reduce_scatter:
      mapped.stage_output = rank > 0 && call.count > 0;
      break;
    default:
      break;
  }
  return mapped;
}

bool is_in_place_form(const NativeCall& call, int rank) {
  const auto* s = static_cast<const std::byte*>(call.send);
  const auto* r = static_cast<const std::byte*>(call.recv);
  const std::size_t block = block_offset(call, rank);
  switch (call.collective) {
    case Collective::allreduce:
    case Collective::reduce:
    case Collective::alltoall:
    case Collective::alltoallv:
      return s == r;
    case Collective::reduce_scatter:
      return s == r || r == s + block;
    case Collective::allgather:
    case Collective::allgatherv:
      return s == r || s == r + block;
    case Collective::gather:
      return s == r + block;
    case Collective::scatter:
      return r == s + block;
    default:
      return false;
  }
}

}  // namespace tutti::transport
