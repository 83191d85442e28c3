// One collective call under mpirun: its buffers on this rank (collective_cases.hpp's Case, p = the
// communicator's size) and MPI's own result on the same inputs, the reference every result is
// compared with element by element; and the reporting that fails every rank when any failed.
#pragma once

#include <mpi.h>

#include <cstring>
#include <functional>
#include <numeric>
#include <string>
#include <vector>

#include "collective_cases.hpp"
#include "reduce/reduce.hpp"

namespace tutti::testing {

inline int comm_rank(MPI_Comm comm) {
  int rank = 0;
  MPI_Comm_rank(comm, &rank);
  return rank;
}

inline int comm_size(MPI_Comm comm) {
  int size = 0;
  MPI_Comm_size(comm, &size);
  return size;
}

// Every rank's failures, gathered to rank 0 and reported there; every rank fails when any did.
inline void expect_all_ranks_ok(MPI_Comm comm, const std::string& mine) {
  const int bad = mine.empty() ? 0 : 1;
  int any = 0;
  MPI_Allreduce(&bad, &any, 1, MPI_INT, MPI_MAX, comm);
  if (!any) return;
  const int p = comm_size(comm), length = static_cast<int>(mine.size());
  std::vector<int> lengths(static_cast<std::size_t>(p)), displacements(static_cast<std::size_t>(p));
  MPI_Gather(&length, 1, MPI_INT, lengths.data(), 1, MPI_INT, 0, comm);
  std::exclusive_scan(lengths.begin(), lengths.end(), displacements.begin(), 0);
  std::string all(static_cast<std::size_t>(displacements.back() + lengths.back()), '\0');
  MPI_Gatherv(mine.data(), length, MPI_CHAR, all.data(), lengths.data(), displacements.data(), MPI_CHAR, 0, comm);
  if (comm_rank(comm) == 0)
    ADD_FAILURE() << all;
  else
    ADD_FAILURE() << "failed on some rank (see rank 0's output)";
}

// Element extents on this rank (as validate() computes them) and the per-rank counts.
struct Layout {
  std::size_t rank = 0, p = 1, send = 0, recv = 0;
  std::vector<std::size_t> counts, send_counts, recv_counts;  // allgatherv; alltoallv
  std::size_t displacement = 0;                               // allgatherv: of this rank's block
};

inline Layout layout_of(const Case& c, int rank, int size) {
  Layout l;
  l.rank = static_cast<std::size_t>(rank);
  l.p = static_cast<std::size_t>(size);
  const std::size_t n = c.count, p = l.p;
  const bool root = rank == c.root;
  for (int j = 0; j < size; ++j) {
    l.counts.push_back(v_count(n, j, 0));
    l.send_counts.push_back(v_count(n, rank, j));
    l.recv_counts.push_back(v_count(n, j, rank));
  }
  l.displacement = std::accumulate(l.counts.begin(), l.counts.begin() + rank, std::size_t{0});
  const std::size_t v_total = std::accumulate(l.counts.begin(), l.counts.end(), std::size_t{0});
  switch (c.collective) {
    case Collective::allreduce:
      l.send = l.recv = n;
      break;
    case Collective::reduce:
      l.send = n, l.recv = root ? n : 0;
      break;
    case Collective::reduce_scatter:
      l.send = p * n, l.recv = n;
      break;
    case Collective::allgather:
      l.send = n, l.recv = p * n;
      break;
    case Collective::allgatherv:
      l.send = l.counts[l.rank], l.recv = v_total;
      break;
    case Collective::broadcast:
      l.send = l.recv = n;
      break;
    case Collective::alltoall:
      l.send = l.recv = p * n;
      break;
    case Collective::alltoallv:
      l.send = std::accumulate(l.send_counts.begin(), l.send_counts.end(), std::size_t{0});
      l.recv = std::accumulate(l.recv_counts.begin(), l.recv_counts.end(), std::size_t{0});
      break;
    case Collective::gather:
      l.send = n, l.recv = root ? p * n : 0;
      break;
    case Collective::scatter:
      l.send = root ? p * n : 0, l.recv = n;
      break;
    case Collective::barrier:
      break;
  }
  return l;
}

// Inputs: harness.hpp's small integers for reductions (exact in every type, products too), a
// rank-and-index pattern for data movement (so that a misplaced element shows).
inline double value(const Case& c, std::size_t rank, std::size_t i) {
  if (is_reduction(c.collective)) return input_value(c.type, c.op, static_cast<int>(rank), i);
  return static_cast<double>((rank * 100003 + i * 7 + 1) % 2000);
}

// The reference's own MPI mapping (independent of the library's); f16/bf16 go through f64.
inline MPI_Datatype mpi_type_of(DataType type) {
  switch (type) {
    case DataType::i8:
      return MPI_INT8_T;
    case DataType::u8:
      return MPI_UINT8_T;
    case DataType::i32:
      return MPI_INT32_T;
    case DataType::u32:
      return MPI_UINT32_T;
    case DataType::i64:
      return MPI_INT64_T;
    case DataType::u64:
      return MPI_UINT64_T;
    case DataType::f32:
      return MPI_FLOAT;
    default:
      return MPI_DOUBLE;
  }
}

inline MPI_Op mpi_op_of(ReduceOp op) {
  switch (op) {
    case ReduceOp::prod:
      return MPI_PROD;
    case ReduceOp::min:
      return MPI_MIN;
    case ReduceOp::max:
      return MPI_MAX;
    default:
      return MPI_SUM;
  }
}

using Bytes = std::vector<std::byte>;

// MPI's own reduction, out of place; f16/bf16 through f64 (exact for these inputs).
inline Bytes reduce_reference(const Case& c, const Layout& l, const Bytes& input, MPI_Comm comm) {
  const bool half = c.type == DataType::f16 || c.type == DataType::bf16;
  const std::size_t elem = size_of(c.type), width = half ? sizeof(double) : elem;
  Bytes in(std::max<std::size_t>(l.send, 1) * width), out(std::max(l.send, l.recv) * width + width);
  if (half)
    for (std::size_t i = 0; i < l.send; ++i) store(DataType::f64, &in[i * width], load(c.type, &input[i * elem]));
  else
    std::copy(input.begin(), input.end(), in.begin());
  const MPI_Datatype t = half ? MPI_DOUBLE : mpi_type_of(c.type);
  const int n = static_cast<int>(c.count);
  if (c.collective == Collective::allreduce) MPI_Allreduce(in.data(), out.data(), n, t, mpi_op_of(c.op), comm);
  if (c.collective == Collective::reduce) MPI_Reduce(in.data(), out.data(), n, t, mpi_op_of(c.op), c.root, comm);
  if (c.collective == Collective::reduce_scatter)
    MPI_Reduce_scatter_block(in.data(), out.data(), n, t, mpi_op_of(c.op), comm);
  Bytes result(l.recv * elem);
  for (std::size_t i = 0; i < l.recv; ++i) {
    if (half)
      store(c.type, &result[i * elem], load(DataType::f64, &out[i * width]));
    else
      std::memcpy(&result[i * elem], &out[i * width], elem);
  }
  if (c.op == ReduceOp::avg && l.recv > 0) reduce::divide(c.type, result.data(), l.recv, static_cast<int>(l.p));
  return result;
}

inline std::vector<int> ints(const std::vector<std::size_t>& counts, std::size_t elem) {
  std::vector<int> out;
  for (std::size_t c : counts) out.push_back(static_cast<int>(c * elem));
  return out;
}

inline std::vector<int> displacements(const std::vector<int>& counts) {
  std::vector<int> out(counts.size());
  std::exclusive_scan(counts.begin(), counts.end(), out.begin(), 0);
  return out;
}

// MPI's own collective on a copy of this rank's input: the output this rank must see.
inline Bytes reference(const Case& c, const Layout& l, const Bytes& input, MPI_Comm comm) {
  if (is_reduction(c.collective)) return reduce_reference(c, l, input, comm);
  const std::size_t elem = size_of(c.type);
  const int block = static_cast<int>(c.count * elem);
  Bytes out(l.recv * elem + 1), in = input;
  in.resize(in.size() + 1);
  switch (c.collective) {
    case Collective::allgather:
      MPI_Allgather(in.data(), block, MPI_BYTE, out.data(), block, MPI_BYTE, comm);
      break;
    case Collective::allgatherv: {
      const auto counts = ints(l.counts, elem);
      MPI_Allgatherv(in.data(), counts[l.rank], MPI_BYTE, out.data(), counts.data(), displacements(counts).data(),
                     MPI_BYTE, comm);
      break;
    }
    case Collective::broadcast:
      std::copy(input.begin(), input.end(), out.begin());
      MPI_Bcast(out.data(), block, MPI_BYTE, c.root, comm);
      break;
    case Collective::alltoall:
      MPI_Alltoall(in.data(), block, MPI_BYTE, out.data(), block, MPI_BYTE, comm);
      break;
    case Collective::alltoallv: {
      const auto s = ints(l.send_counts, elem), r = ints(l.recv_counts, elem);
      MPI_Alltoallv(in.data(), s.data(), displacements(s).data(), MPI_BYTE, out.data(), r.data(),
                    displacements(r).data(), MPI_BYTE, comm);
      break;
    }
    case Collective::gather:
      MPI_Gather(in.data(), block, MPI_BYTE, out.data(), block, MPI_BYTE, c.root, comm);
      break;
    case Collective::scatter:
      MPI_Scatter(in.data(), block, MPI_BYTE, out.data(), block, MPI_BYTE, c.root, comm);
      break;
    default:
      MPI_Barrier(comm);
      break;
  }
  out.resize(l.recv * elem);
  return out;
}

using Subject = std::function<void(const Case&, const void* send, void* recv, const Layout&)>;

// Where the input goes and where send/recv point, in elements of one buffer (in place) or two.
struct Placement {
  bool in_place = false;
  std::size_t input_at = 0, send_at = 0, recv_at = 0;
  bool null_send = false, null_recv = false;
};

inline Placement placement_of(const Case& c, const Layout& l) {
  Placement pl;
  const bool root = l.rank == static_cast<std::size_t>(c.root);
  pl.null_recv = (c.collective == Collective::reduce || c.collective == Collective::gather) && !root;
  pl.null_send = c.collective == Collective::scatter && !root;
  if (c.place == 0 || (is_rooted(c.collective) && !root)) return pl;
  pl.in_place = true;
  const std::size_t mine = l.rank * c.count;
  switch (c.collective) {
    case Collective::reduce_scatter:
      pl.recv_at = c.place == 1 ? mine : 0;
      break;
    case Collective::allgather:
      pl.input_at = mine, pl.send_at = c.place == 1 ? mine : 0;
      break;
    case Collective::allgatherv:
      pl.input_at = l.displacement, pl.send_at = c.place == 1 ? l.displacement : 0;
      break;
    case Collective::gather:
      pl.input_at = pl.send_at = mine;
      break;
    case Collective::scatter:
      pl.recv_at = mine;
      break;
    default:
      break;
  }
  return pl;
}

// Runs one case on this rank: "" or what differs from MPI's result.
inline std::string run_case(const Case& c, MPI_Comm comm, const Subject& subject) {
  const Layout l = layout_of(c, comm_rank(comm), comm_size(comm));
  const std::size_t elem = size_of(c.type);
  Bytes input(l.send * elem);
  for (std::size_t i = 0; i < l.send; ++i) store(c.type, &input[i * elem], value(c, l.rank, i));
  const Bytes expected = reference(c, l, input, comm);
  const Placement pl = placement_of(c, l);
  Bytes a = input, b(std::max(l.send, l.recv) * elem + elem, std::byte{poison});
  if (c.collective == Collective::broadcast && l.rank == static_cast<std::size_t>(c.root))
    std::copy(input.begin(), input.end(), b.begin());
  if (pl.in_place) std::copy(input.begin(), input.end(), b.begin() + static_cast<std::ptrdiff_t>(pl.input_at * elem));
  std::byte* recv = pl.null_recv ? nullptr : b.data() + pl.recv_at * elem;
  const std::byte* send = pl.in_place ? b.data() + pl.send_at * elem : a.data();
  if (c.collective == Collective::broadcast) send = recv;
  subject(c, pl.null_send ? nullptr : send, recv, l);
  if (pl.null_recv) return "";
  for (std::size_t i = 0; i < l.recv; ++i)
    if (std::memcmp(recv + i * elem, &expected[i * elem], elem) != 0)
      return name_of(c) + ": element " + std::to_string(i) + " is " + std::to_string(load(c.type, recv + i * elem)) +
             ", MPI says " + std::to_string(load(c.type, &expected[i * elem]));
  return "";
}

}  // namespace tutti::testing
