#include "transport/mpi/mpi_collective.hpp"

#include <climits>
#include <cstring>
#include <vector>

#include "reduce/reduce.hpp"
#include "transport/mpi/mpi_support.hpp"
#include "transport/mpi/mpi_transport.hpp"

namespace tutti::transport {

namespace {

using mpi::check;
using mpi::serialize;

// One call's arguments, with the MPI side resolved once.
struct Args {
  MPI_Comm comm = MPI_COMM_NULL;
  int rank = 0;
  int size = 0;
  const std::byte* send = nullptr;
  std::byte* recv = nullptr;
  std::size_t count = 0;
  DataType type = DataType::u8;
  std::size_t elem = 1;
  MPI_Datatype mpi_type = MPI_BYTE;
  std::optional<ReduceOp> op;
  int root = -1;
  std::span<const std::size_t> counts, recv_counts;
  std::size_t block(int rank) const { return static_cast<std::size_t>(rank) * count * elem; }  // bytes
  bool is_root() const { return rank == root; }
};

int to_int(std::size_t n, const char* what) {
  if (n > static_cast<std::size_t>(INT_MAX))
    throw Error(ErrorCode::unsupported, std::string("Algorithm::mpi: ") + what + " of " + std::to_string(n) +
                                            " exceeds INT_MAX, MPI's count limit; use one of Tutti's algorithms");
  return static_cast<int>(n);
}

// MPI's counts and packed displacements of per-rank counts.
struct Layout {
  std::vector<int> counts, displacements;
  std::size_t total = 0;
};

Layout layout(std::span<const std::size_t> counts, const char* what) {
  Layout out;
  for (std::size_t c : counts) {
    out.counts.push_back(to_int(c, what));
    out.displacements.push_back(to_int(out.total, "displacement"));
    out.total += c;
  }
  return out;
}

MPI_Op op_of(const Args& a) { return mpi::reduction(a.op.value_or(ReduceOp::sum), a.type); }

void finish_average(const Args& a, void* result, std::size_t n) {
  if (a.op == ReduceOp::avg && n > 0) reduce::divide(a.type, result, n, a.size);
}

void run_allreduce(const Args& a) {
  const int n = to_int(a.count, "count");
  const void* send = a.send == a.recv ? MPI_IN_PLACE : a.send;
  {
    auto lock = serialize();
    check(MPI_Allreduce(send, a.recv, n, a.mpi_type, op_of(a), a.comm), "MPI_Allreduce");
  }
  finish_average(a, a.recv, a.count);
}

void run_reduce(const Args& a) {
  const int n = to_int(a.count, "count");
  const void* send = a.is_root() && a.send == a.recv ? MPI_IN_PLACE : a.send;
  {
    auto lock = serialize();
    check(MPI_Reduce(send, a.is_root() ? a.recv : nullptr, n, a.mpi_type, op_of(a), a.root, a.comm), "MPI_Reduce");
  }
  if (a.is_root()) finish_average(a, a.recv, a.count);
}

void run_reduce_scatter(const Args& a) {
  const int n = to_int(a.count, "recv_count");
  to_int(a.count * static_cast<std::size_t>(a.size), "send count");
  // NCCL's in-place form (recv is this rank's block of send) has no MPI spelling: MPI's in-place
  // form puts the result at the start of the buffer. Reduce into a separate block, then copy.
  const bool nccl_in_place = a.send != a.recv && a.recv == a.send + a.block(a.rank) && a.count > 0;
  std::vector<std::byte> result(nccl_in_place ? a.count * a.elem : 0);
  const void* send = a.send == a.recv ? MPI_IN_PLACE : a.send;
  void* recv = nccl_in_place ? result.data() : a.recv;
  {
    auto lock = serialize();
    check(MPI_Reduce_scatter_block(send, recv, n, a.mpi_type, op_of(a), a.comm), "MPI_Reduce_scatter_block");
  }
  if (nccl_in_place) std::memcpy(a.recv, result.data(), result.size());
  finish_average(a, a.recv, a.count);
}

void run_allgather(const Args& a) {
  const int n = to_int(a.count, "send_count");
  to_int(a.count * static_cast<std::size_t>(a.size), "recv count");
  const bool in_place = a.send == a.recv || a.send == a.recv + a.block(a.rank);
  auto lock = serialize();
  if (in_place)
    check(MPI_Allgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, a.recv, n, a.mpi_type, a.comm), "MPI_Allgather");
  else
    check(MPI_Allgather(a.send, n, a.mpi_type, a.recv, n, a.mpi_type, a.comm), "MPI_Allgather");
}

void run_allgatherv(const Args& a) {
  const Layout recv = layout(a.counts, "recv_counts");
  const auto mine = static_cast<std::size_t>(a.rank);
  const bool in_place =
      a.send == a.recv || a.send == a.recv + static_cast<std::size_t>(recv.displacements[mine]) * a.elem;
  const void* send = in_place ? MPI_IN_PLACE : a.send;
  auto lock = serialize();
  check(MPI_Allgatherv(send, to_int(a.count, "send_count"), a.mpi_type, a.recv, recv.counts.data(),
                       recv.displacements.data(), a.mpi_type, a.comm),
        "MPI_Allgatherv");
}

void run_broadcast(const Args& a) {
  void* buffer = a.recv != nullptr ? static_cast<void*>(a.recv) : const_cast<std::byte*>(a.send);
  const int n = to_int(a.count, "count");
  auto lock = serialize();
  check(MPI_Bcast(buffer, n, a.mpi_type, a.root, a.comm), "MPI_Bcast");
}

void run_alltoall(const Args& a) {
  const int n = to_int(a.count, "count_per_rank");
  to_int(a.count * static_cast<std::size_t>(a.size), "send count");
  auto lock = serialize();
  if (a.send == a.recv)
    check(MPI_Alltoall(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, a.recv, n, a.mpi_type, a.comm), "MPI_Alltoall");
  else
    check(MPI_Alltoall(a.send, n, a.mpi_type, a.recv, n, a.mpi_type, a.comm), "MPI_Alltoall");
}

void run_alltoallv(const Args& a) {
  const Layout send = layout(a.counts, "send_counts");
  const Layout recv = layout(a.recv_counts, "recv_counts");
  // MPI's in-place form sends from the receive layout; Tutti's sends from the packed send
  // layout. They agree when the counts do; otherwise snapshot the input.
  const bool same_layout = send.counts == recv.counts;
  std::vector<std::byte> snapshot;
  const void* send_buffer = a.send;
  if (a.send == a.recv && same_layout) {
    send_buffer = MPI_IN_PLACE;
  } else if (a.send == a.recv) {
    snapshot.assign(a.send, a.send + send.total * a.elem);
    send_buffer = snapshot.data();
  }
  auto lock = serialize();
  check(MPI_Alltoallv(send_buffer, send.counts.data(), send.displacements.data(), a.mpi_type, a.recv,
                      recv.counts.data(), recv.displacements.data(), a.mpi_type, a.comm),
        "MPI_Alltoallv");
}

void run_gather(const Args& a) {
  const int n = to_int(a.count, "send_count");
  to_int(a.count * static_cast<std::size_t>(a.size), "recv count");
  const bool in_place = a.is_root() && a.send == a.recv + a.block(a.root);
  auto lock = serialize();
  if (in_place)
    check(MPI_Gather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, a.recv, n, a.mpi_type, a.root, a.comm), "MPI_Gather");
  else
    check(MPI_Gather(a.send, n, a.mpi_type, a.is_root() ? a.recv : nullptr, n, a.mpi_type, a.root, a.comm),
          "MPI_Gather");
}

void run_scatter(const Args& a) {
  const int n = to_int(a.count, "recv_count");
  to_int(a.count * static_cast<std::size_t>(a.size), "send count");
  const bool in_place = a.is_root() && a.recv == a.send + a.block(a.root);
  void* recv = in_place ? MPI_IN_PLACE : a.recv;
  auto lock = serialize();
  check(MPI_Scatter(a.is_root() ? a.send : nullptr, n, a.mpi_type, recv, n, a.mpi_type, a.root, a.comm), "MPI_Scatter");
}

void run_barrier(const Args& a) {
  auto lock = serialize();
  check(MPI_Barrier(a.comm), "MPI_Barrier");
}

struct Entry {
  std::string_view kind;
  void (*run)(const Args&);
};

constexpr Entry kCollectives[] = {
    {"allreduce", run_allreduce}, {"reduce", run_reduce},         {"reduce_scatter", run_reduce_scatter},
    {"allgather", run_allgather}, {"allgatherv", run_allgatherv}, {"broadcast", run_broadcast},
    {"alltoall", run_alltoall},   {"alltoallv", run_alltoallv},   {"gather", run_gather},
    {"scatter", run_scatter},     {"barrier", run_barrier},
};

}  // namespace

bool mpi_collective(Transport& t, std::string_view kind, const void* send, void* recv, std::size_t count, DataType type,
                    std::optional<ReduceOp> op, int root, std::span<const std::size_t> counts,
                    std::span<const std::size_t> recv_counts) {
  auto* transport = dynamic_cast<mpi::MpiTransport*>(&t);
  if (transport == nullptr) return false;
  for (const Entry& entry : kCollectives) {
    if (entry.kind != kind) continue;
    Args a;
    a.comm = transport->collective_comm();
    a.rank = transport->rank();
    a.size = transport->size();
    a.send = static_cast<const std::byte*>(send);
    a.recv = static_cast<std::byte*>(recv);
    a.count = count;
    a.type = type;
    a.elem = size_of(type);
    a.mpi_type = mpi::datatype(type);
    a.op = op;
    a.root = root;
    a.counts = counts;
    a.recv_counts = recv_counts;
    entry.run(a);
    return true;
  }
  throw Error(ErrorCode::invalid_argument, "Algorithm::mpi: unknown collective '" + std::string(kind) + "'");
}

}  // namespace tutti::transport
