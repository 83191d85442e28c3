#include <limits>
#include <numeric>
#include <string>

#include "comm/comm_impl.hpp"
#include "core/names.hpp"
#include "transport/in_place.hpp"

namespace tutti::comm {

namespace {

[[noreturn]] void invalid(const Call& call, const std::string& message) {
  throw Error(ErrorCode::invalid_argument, std::string(to_string(call.collective)) + ": " + message);
}

std::size_t checked_mul(const Call& call, std::size_t a, std::size_t b, const char* what) {
  return checked_product(to_string(call.collective), a, b, what);
}

std::size_t checked_sum(const Call& call, std::span<const std::size_t> counts, const char* what) {
  std::size_t total = 0;
  for (std::size_t c : counts) {
    if (c > std::numeric_limits<std::size_t>::max() - total) invalid(call, std::string(what) + " sum overflows");
    total += c;
  }
  return total;
}

void check_enums(const Call& call) {
  const auto type = static_cast<int>(call.type);
  if (type < static_cast<int>(DataType::i8) || type > static_cast<int>(DataType::f64))
    invalid(call, "type is not a valid DataType (" + std::to_string(type) + ")");
  if (call.op) {
    const auto op = static_cast<int>(*call.op);
    if (op < static_cast<int>(ReduceOp::sum) || op > static_cast<int>(ReduceOp::avg))
      invalid(call, "op is not a valid ReduceOp (" + std::to_string(op) + ")");
  }
  const auto algorithm = static_cast<int>(call.options.algorithm);
  if (algorithm < static_cast<int>(Algorithm::automatic) || algorithm > static_cast<int>(Algorithm::mpi))
    invalid(call, "options.algorithm is not a valid Algorithm (" + std::to_string(algorithm) + ")");
  if (call.options.timeout.count() < 0) invalid(call, "options.timeout is negative");
}

Extents extents_of(const Call& call, int rank, int size) {
  const auto p = static_cast<std::size_t>(size);
  const std::size_t c = call.count;
  const bool is_root = rank == call.root;
  switch (call.collective) {
    case Collective::allreduce:
      return {c, c};
    case Collective::reduce:
      return {c, is_root ? c : 0};
    case Collective::reduce_scatter:
      return {checked_mul(call, p, c, "size() * recv_count"), c};
    case Collective::allgather:
      return {c, checked_mul(call, p, c, "size() * send_count")};
    case Collective::allgatherv:
      return {c, checked_sum(call, call.counts, "recv_counts")};
    case Collective::broadcast:
      return {0, c};
    case Collective::alltoall: {
      const std::size_t total = checked_mul(call, p, c, "size() * count_per_rank");
      return {total, total};
    }
    case Collective::alltoallv:
      return {checked_sum(call, call.counts, "send_counts"), checked_sum(call, call.recv_counts, "recv_counts")};
    case Collective::gather: {  // checked on every rank, not only where the buffer is: all must refuse alike
      const std::size_t total = checked_mul(call, p, c, "size() * send_count");
      return {c, is_root ? total : 0};
    }
    case Collective::scatter: {
      const std::size_t total = checked_mul(call, p, c, "size() * recv_count");
      return {is_root ? total : 0, c};
    }
    case Collective::barrier:
      return {0, 0};
  }
  return {};
}

void check_counts_spans(const Call& call, int rank, int size) {
  const auto p = static_cast<std::size_t>(size);
  if (call.collective == Collective::allgatherv) {
    if (call.counts.size() != p)
      invalid(call, "recv_counts has " + std::to_string(call.counts.size()) +
                        " entries, expected size() = " + std::to_string(p));
    if (call.counts[static_cast<std::size_t>(rank)] != call.count)
      invalid(call, "send_count (" + std::to_string(call.count) + ") differs from recv_counts[rank] (" +
                        std::to_string(call.counts[static_cast<std::size_t>(rank)]) + ")");
  }
  if (call.collective == Collective::alltoallv) {
    if (call.counts.size() != p)
      invalid(call, "send_counts has " + std::to_string(call.counts.size()) +
                        " entries, expected size() = " + std::to_string(p));
    if (call.recv_counts.size() != p)
      invalid(call, "recv_counts has " + std::to_string(call.recv_counts.size()) +
                        " entries, expected size() = " + std::to_string(p));
    if (call.counts[static_cast<std::size_t>(rank)] != call.recv_counts[static_cast<std::size_t>(rank)])
      invalid(call, "send_counts[rank] differs from recv_counts[rank] (a rank's block to itself)");
  }
}

}  // namespace

std::size_t checked_product(std::string_view operation, std::size_t a, std::size_t b, std::string_view what) {
  constexpr std::size_t max = std::numeric_limits<std::size_t>::max();
  if (b != 0 && a > max / b)
    throw Error(ErrorCode::invalid_argument, std::string(operation) + ": " + std::string(what) + " overflows (" +
                                                 std::to_string(a) + " * " + std::to_string(b) + " exceeds " +
                                                 std::to_string(max) + ")");
  return a * b;
}

std::size_t checked_bytes(std::string_view operation, std::size_t count, DataType type) {
  return checked_product(operation, count, size_of(type), "count * element size");
}

void validate_point_to_point(bool is_send, const void* data, std::size_t count, DataType type, int peer, int tag,
                             int size) {
  const std::string name = is_send ? "send" : "recv";
  const auto t = static_cast<int>(type);
  if (t < static_cast<int>(DataType::i8) || t > static_cast<int>(DataType::f64))
    throw Error(ErrorCode::invalid_argument, name + ": type is not a valid DataType");
  if (peer < 0 || peer >= size)
    throw Error(ErrorCode::invalid_argument,
                name + ": peer " + std::to_string(peer) + " is out of range [0, " + std::to_string(size) + ")");
  if (tag < 0) throw Error(ErrorCode::invalid_argument, name + ": tag must be non-negative");
  if (data == nullptr && count > 0)
    throw Error(ErrorCode::invalid_argument, name + ": data is null but count is " + std::to_string(count));
  checked_bytes(name, count, type);
}

Extents validate(const Call& call, int rank, int size) {
  if (size <= 0) invalid(call, "the communicator is empty (split with a negative color)");
  check_enums(call);
  if (core::has_root(call.collective) && (call.root < 0 || call.root >= size))
    invalid(call, "root " + std::to_string(call.root) + " is out of range [0, " + std::to_string(size) + ")");
  check_counts_spans(call, rank, size);
  const Extents e = extents_of(call, rank, size);
  const std::size_t elem = size_of(call.type);
  checked_mul(call, std::max(e.send, e.recv), elem, "count * element size");
  if (call.collective == Collective::gather || call.collective == Collective::scatter)
    checked_mul(call, static_cast<std::size_t>(size) * call.count, elem, "size() * count * element size");
  const bool has_send_buffer = call.collective != Collective::broadcast;
  if (has_send_buffer && e.send > 0 && call.send == nullptr)
    invalid(call, "send is null but " + std::to_string(e.send) + " elements are to be sent");
  if (e.recv > 0 && call.recv == nullptr)
    invalid(call, (call.collective == Collective::broadcast ? std::string("buffer") : std::string("recv")) +
                      " is null but " + std::to_string(e.recv) + " elements are to be received");
  if (has_send_buffer && e.send > 0 && e.recv > 0) {
    const auto s = reinterpret_cast<std::uintptr_t>(call.send);
    const auto r = reinterpret_cast<std::uintptr_t>(call.recv);
    const bool overlap = s < r + e.recv * elem && r < s + e.send * elem;
    if (overlap && !transport::is_in_place_form(call, rank))
      invalid(call, "send and recv overlap but are not in place (see the in-place forms in tutti.hpp)");
  }
  return e;
}

bool plainly_valid(const Call& call, int rank, int size) {
  const Collective c = call.collective;
  const bool reduces = c == Collective::allreduce || c == Collective::reduce_scatter || c == Collective::reduce;
  const bool rooted =
      c == Collective::broadcast || c == Collective::gather || c == Collective::scatter || c == Collective::reduce;
  if (!reduces && !rooted && c != Collective::allgather && c != Collective::alltoall && c != Collective::barrier)
    return false;
  if (call.count > plain_count_limit || size <= 0) return false;
  const auto type = static_cast<int>(call.type);
  if (type < static_cast<int>(DataType::i8) || type > static_cast<int>(DataType::f64)) return false;
  if (reduces != call.op.has_value()) return false;
  if (reduces && (*call.op < ReduceOp::sum || *call.op > ReduceOp::avg)) return false;
  const Algorithm algorithm = call.options.algorithm;
  if ((algorithm != Algorithm::automatic && algorithm != Algorithm::direct) || call.options.timeout.count() < 0)
    return false;
  if (rooted && (call.root < 0 || call.root >= size)) return false;
  if (c == Collective::barrier) return call.count == 0;
  if (call.count == 0) return true;  // no buffer is touched
  // The buffers this rank uses: a gather's root's recv, a scatter's root's send.
  const bool root = rank == call.root;
  const bool uses_send = c != Collective::broadcast && (c != Collective::scatter || root);
  const bool uses_recv = (c != Collective::gather && c != Collective::reduce) || root;
  if ((uses_recv && call.recv == nullptr) || (uses_send && call.send == nullptr)) return false;
  if (!uses_send || !uses_recv) return true;
  // The buffers must not overlap, unless in one of the in-place forms validate takes (the MPI
  // forms, send == recv, and NCCL's, where this rank's block of the larger buffer is the other).
  const std::size_t elem = size_of(call.type), p = static_cast<std::size_t>(size);
  const bool p_in = c == Collective::reduce_scatter || c == Collective::alltoall || c == Collective::scatter;
  const bool p_out = c == Collective::allgather || c == Collective::alltoall || c == Collective::gather;
  const std::size_t send = (p_in ? p : 1) * call.count * elem, recv = (p_out ? p : 1) * call.count * elem;
  const auto s = reinterpret_cast<std::uintptr_t>(call.send), r = reinterpret_cast<std::uintptr_t>(call.recv);
  return s + send <= r || r + recv <= s || transport::is_in_place_form(call, rank);
}

}  // namespace tutti::comm
