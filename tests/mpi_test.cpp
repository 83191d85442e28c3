// Tutti over MPI, under mpirun (label `mpi`, run with 1 to 4 processes). Every result is compared,
// element by element, with MPI's own collective on the same inputs (out of place, into a
// separate buffer): Tutti's schedules over the MPI transport with every algorithm, and
// mpi_collective (Algorithm::mpi) in every in-place form, type and op. A failure on any rank fails
// the test on every rank (and mpirun's exit status); rank 0 prints every rank's messages.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdlib>
#include <cstring>
#include <functional>
#include <numeric>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "collective_cases.hpp"
#include "reduce/reduce.hpp"
#include "transport/inproc/inproc.hpp"
#include "transport/mpi/mpi_collective.hpp"
#include "transport/mpi/mpi_transport.hpp"
#include "tutti/mpi.hpp"

namespace tutti::testing {
namespace {

using namespace std::chrono_literals;
using schedule::Collective;
using transport::mpi::MpiTransport;

int comm_rank(MPI_Comm comm) {
  int rank = 0;
  MPI_Comm_rank(comm, &rank);
  return rank;
}

int comm_size(MPI_Comm comm) {
  int size = 0;
  MPI_Comm_size(comm, &size);
  return size;
}

// ---- cases (collective_cases.hpp's Case, p = the communicator's size): one collective call, its
// buffers on this rank, and MPI's reference result ----

// Element extents on this rank (as validate() computes them) and the per-rank counts.
struct Layout {
  std::size_t rank = 0, p = 1, send = 0, recv = 0;
  std::vector<std::size_t> counts, send_counts, recv_counts;  // allgatherv; alltoallv
  std::size_t displacement = 0;                               // allgatherv: of this rank's block
};

Layout layout_of(const Case& c, int rank, int size) {
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
double value(const Case& c, std::size_t rank, std::size_t i) {
  if (is_reduction(c.collective)) return input_value(c.type, c.op, static_cast<int>(rank), i);
  return static_cast<double>((rank * 100003 + i * 7 + 1) % 2000);
}

// The reference's own MPI mapping (independent of the library's); f16/bf16 go through f64.
MPI_Datatype mpi_type_of(DataType type) {
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

MPI_Op mpi_op_of(ReduceOp op) {
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
Bytes reduce_reference(const Case& c, const Layout& l, const Bytes& input, MPI_Comm comm) {
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

std::vector<int> ints(const std::vector<std::size_t>& counts, std::size_t elem) {
  std::vector<int> out;
  for (std::size_t c : counts) out.push_back(static_cast<int>(c * elem));
  return out;
}

std::vector<int> displacements(const std::vector<int>& counts) {
  std::vector<int> out(counts.size());
  std::exclusive_scan(counts.begin(), counts.end(), out.begin(), 0);
  return out;
}

// MPI's own collective on a copy of this rank's input: the output this rank must see.
Bytes reference(const Case& c, const Layout& l, const Bytes& input, MPI_Comm comm) {
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

Placement placement_of(const Case& c, const Layout& l) {
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
std::string run_case(const Case& c, MPI_Comm comm, const Subject& subject) {
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

void call_tutti(Communicator& comm, const Case& c, const void* send, void* recv, const Layout& l) {
  const Options o{c.algorithm, std::chrono::milliseconds(60000)};
  const DataType t = c.type;
  switch (c.collective) {
    case Collective::allreduce:
      return comm.allreduce(send, recv, c.count, t, c.op, o);
    case Collective::reduce:
      return comm.reduce(send, recv, c.count, t, c.op, c.root, o);
    case Collective::reduce_scatter:
      return comm.reduce_scatter(send, recv, c.count, t, c.op, o);
    case Collective::allgather:
      return comm.allgather(send, recv, c.count, t, o);
    case Collective::allgatherv:
      return comm.allgatherv(send, l.counts[l.rank], recv, l.counts, t, o);
    case Collective::broadcast:
      return comm.broadcast(recv, c.count, t, c.root, o);
    case Collective::alltoall:
      return comm.alltoall(send, recv, c.count, t, o);
    case Collective::alltoallv:
      return comm.alltoallv(send, l.send_counts, recv, l.recv_counts, t, o);
    case Collective::gather:
      return comm.gather(send, recv, c.count, t, c.root, o);
    case Collective::scatter:
      return comm.scatter(send, recv, c.count, t, c.root, o);
    case Collective::barrier:
      return comm.barrier(o);
  }
}

// ---- the sweeps ----

// Every collective x algorithm x count x in-place form x root; movement cycles through element
// sizes 1, 2, 4, 8; reductions use i32 sum and f32 max (types x ops have their own sweep).
std::vector<Case> sweep(int p, const std::vector<std::size_t>& counts, bool with_algorithms) {
  constexpr DataType movement_types[] = {DataType::u8, DataType::bf16, DataType::f32, DataType::i64};
  std::vector<Case> out;
  std::vector<Collective> collectives = data_collectives;
  collectives.push_back(Collective::barrier);
  for (Collective coll : collectives) {
    auto algorithms = with_algorithms ? schedule::algorithms_for(coll) : std::vector<Algorithm>{Algorithm::mpi};
    if (with_algorithms) algorithms.push_back(Algorithm::automatic);
    for (Algorithm a : algorithms)
      for (std::size_t k = 0; k < counts.size(); ++k)
        for (int place : places_of(coll))
          for (int root : is_rooted(coll) ? std::vector<int>{0, p - 1} : std::vector<int>{-1}) {
            if (coll == Collective::barrier && k > 0) continue;
            Case c{coll,          a,    movement_types[(k + static_cast<std::size_t>(place)) % 4],
                   ReduceOp::sum, p,    counts[k],
                   place,         root, false};
            if (is_reduction(coll)) c.type = k % 2 ? DataType::f32 : DataType::i32, c.op = k % 2 ? ReduceOp::max : c.op;
            out.push_back(c);
          }
  }
  return out;
}

std::vector<Case> tutti_cases(int p) {
  const auto n = static_cast<std::size_t>(p);
  return sweep(p, {0, 1, n + 1, 1031, 70001}, true);
}

std::vector<Case> mpi_cases(int p) {
  const auto n = static_cast<std::size_t>(p);
  return sweep(p, {0, 1, n + 1, 1031}, false);
}

std::vector<Case> split_cases(int p) { return sweep(p, {1, 67}, true); }

// Every type x op of the reductions, every algorithm (Tutti) or every in-place form (MPI).
std::vector<Case> type_cases(int p, bool tutti) {
  std::vector<Case> out;
  for (Collective coll : {Collective::allreduce, Collective::reduce, Collective::reduce_scatter}) {
    const auto algorithms = tutti ? schedule::algorithms_for(coll) : std::vector<Algorithm>{Algorithm::mpi};
    for (Algorithm a : algorithms)
      for (DataType t : all_types)
        for (ReduceOp op : all_ops)
          for (int place : tutti ? std::vector<int>{0} : places_of(coll))
            out.push_back(Case{coll, a, t, op, p, 67, place, p - 1, false});
  }
  return out;
}

// Every rank's failures, gathered to rank 0 and reported there; every rank fails when any did.
void expect_all_ranks_ok(MPI_Comm comm, const std::string& mine) {
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

// Runs every case (stopping at the first rank's failure, so that ranks stay in step) and reports.
void run_all(MPI_Comm comm, const std::vector<Case>& cases, const Subject& subject) {
  std::string errors;
  for (const Case& c : cases) {
    std::string error;
    try {
      error = run_case(c, comm, subject);
    } catch (const std::exception& e) {
      error = name_of(c) + ": threw " + e.what();
    }
    if (!error.empty()) errors += "rank " + std::to_string(comm_rank(comm)) + ": " + error + "\n";
    const int bad = error.empty() ? 0 : 1;
    int any = 0;
    MPI_Allreduce(&bad, &any, 1, MPI_INT, MPI_MAX, comm);
    if (any) break;
  }
  expect_all_ranks_ok(comm, errors);
}

Subject tutti_subject(Communicator& comm) {
  return [&comm](const Case& c, const void* send, void* recv, const Layout& l) { call_tutti(comm, c, send, recv, l); };
}

Subject mpi_subject(MpiTransport& transport) {
  return [&transport](const Case& c, const void* send, void* recv, const Layout& l) {
    const bool reduction = is_reduction(c.collective);
    const std::size_t count = c.collective == Collective::allgatherv ? l.counts[l.rank] : c.count;
    const std::span<const std::size_t> counts =
        c.collective == Collective::alltoallv ? std::span<const std::size_t>(l.send_counts) : l.counts;
    const bool ran =
        transport::mpi_collective(transport, schedule::to_string(c.collective), send, recv, count, c.type,
                                  reduction ? std::optional(c.op) : std::nullopt, c.root, counts, l.recv_counts);
    if (!ran) throw std::runtime_error("mpi_collective refused an MpiTransport");
  };
}

TEST(FromMpi, RankAndSizeAreMpis) {
  Communicator world = from_mpi(MPI_COMM_WORLD);
  EXPECT_EQ(world.rank(), comm_rank(MPI_COMM_WORLD));
  EXPECT_EQ(world.size(), comm_size(MPI_COMM_WORLD));
  EXPECT_THROW(from_mpi(MPI_COMM_NULL), Error);
}

TEST(TuttiOverMpi, EveryCollectiveAndAlgorithmMatchesMpi) {
  Communicator world = from_mpi(MPI_COMM_WORLD);
  run_all(MPI_COMM_WORLD, tutti_cases(world.size()), tutti_subject(world));
}

TEST(TuttiOverMpi, EveryTypeAndOpMatchesMpi) {
  Communicator world = from_mpi(MPI_COMM_WORLD);
  run_all(MPI_COMM_WORLD, type_cases(world.size(), true), tutti_subject(world));
}

TEST(TuttiOverMpi, OverlappingNonblockingCollectives) {
  Communicator world = from_mpi(MPI_COMM_WORLD);
  const int p = world.size();
  const std::size_t n = 4099;
  std::vector<std::vector<std::int32_t>> data, expected;
  std::vector<Request> requests;
  const Algorithm algorithms[] = {Algorithm::ring, Algorithm::recursive_doubling, Algorithm::rabenseifner,
                                  Algorithm::binomial_tree};
  for (int k = 0; k < 12; ++k) {
    std::vector<std::int32_t> mine(n);
    for (std::size_t i = 0; i < n; ++i) mine[i] = static_cast<std::int32_t>(i * 31 + 7 * k) - world.rank();
    expected.emplace_back(n);
    MPI_Allreduce(mine.data(), expected.back().data(), static_cast<int>(n), MPI_INT32_T, MPI_SUM, MPI_COMM_WORLD);
    data.push_back(std::move(mine));
  }
  std::string errors;
  try {
    for (std::size_t k = 0; k < data.size(); ++k)
      requests.push_back(world.iallreduce(data[k].data(), data[k].data(), n, DataType::i32, ReduceOp::sum,
                                          {algorithms[k % 4], std::chrono::milliseconds(60000)}));
    for (Request& r : requests) r.wait();
    for (std::size_t k = 0; k < data.size(); ++k)
      if (data[k] != expected[k]) errors += "iallreduce #" + std::to_string(k) + " differs from MPI_Allreduce\n";
  } catch (const std::exception& e) {
    errors += std::string("threw ") + e.what() + "\n";
  }
  expect_all_ranks_ok(MPI_COMM_WORLD, errors.empty() ? "" : "rank " + std::to_string(world.rank()) + ": " + errors);
  (void)p;
}

TEST(TuttiOverMpi, SendRecvByTagInOrder) {
  Communicator world = from_mpi(MPI_COMM_WORLD);
  const int p = world.size(), me = world.rank();
  const int next = (me + 1) % p, prev = (me + p - 1) % p;
  // Tag 7 is sent first but received last; the three tag-5 messages must arrive in order.
  const std::size_t sizes[] = {0, 3, 100000};
  std::vector<std::vector<std::int32_t>> out, in;
  for (int k = 0; k < 4; ++k) {
    const std::size_t n = k < 3 ? sizes[k] : 17;
    out.emplace_back(n);
    for (std::size_t i = 0; i < n; ++i) out.back()[i] = static_cast<std::int32_t>(me * 1000000 + k * 100000 + i);
    in.emplace_back(n, -1);
  }
  std::string errors;
  try {
    std::vector<Request> requests;
    requests.push_back(world.isend(out[3].data(), out[3].size(), DataType::i32, next, 7));
    for (int k = 0; k < 3; ++k) requests.push_back(world.isend(out[k].data(), out[k].size(), DataType::i32, next, 5));
    for (int k = 0; k < 3; ++k) requests.push_back(world.irecv(in[k].data(), in[k].size(), DataType::i32, prev, 5));
    requests.push_back(world.irecv(in[3].data(), in[3].size(), DataType::i32, prev, 7));
    for (Request& r : requests) r.wait();
    for (int k = 0; k < 4; ++k)
      for (std::size_t i = 0; i < in[k].size(); ++i)
        if (in[k][i] != static_cast<std::int32_t>(prev * 1000000 + k * 100000 + i)) {
          errors += "rank " + std::to_string(me) + ": message " + std::to_string(k) + " element " + std::to_string(i) +
                    " is wrong\n";
          break;
        }
  } catch (const std::exception& e) {
    errors += "rank " + std::to_string(me) + ": threw " + e.what() + "\n";
  }
  expect_all_ranks_ok(MPI_COMM_WORLD, errors);
}

TEST(TuttiOverMpi, SizeMismatchFailsTheReceiver) {
  if (comm_size(MPI_COMM_WORLD) < 2) GTEST_SKIP() << "needs 2 ranks";
  const int me = comm_rank(MPI_COMM_WORLD);
  std::string errors;
  for (const auto& [sent, expected] : {std::pair<std::size_t, std::size_t>{8, 4}, {4, 8}}) {
    Communicator world = from_mpi(MPI_COMM_WORLD);  // fresh: the failure aborts rank 1's communicator
    std::vector<std::int32_t> buffer(8, 1);
    try {
      if (me == 0) world.send(buffer.data(), sent, DataType::i32, 1, 3);
      if (me == 1) {
        world.recv(buffer.data(), expected, DataType::i32, 0, 3);
        errors += "rank 1: a " + std::to_string(expected) + "-element recv of " + std::to_string(sent) +
                  " elements succeeded\n";
      }
    } catch (const Error& e) {
      if (me != 1 || std::string(e.what()).find("message size mismatch") == std::string::npos)
        errors += "rank " + std::to_string(me) + ": unexpected error: " + e.what() + "\n";
    }
    MPI_Barrier(MPI_COMM_WORLD);
  }
  expect_all_ranks_ok(MPI_COMM_WORLD, errors);
}

TEST(MpiCollective, EveryCollectiveAndInPlaceFormMatchesMpi) {
  MpiTransport transport(MPI_COMM_WORLD);
  run_all(MPI_COMM_WORLD, mpi_cases(transport.size()), mpi_subject(transport));
}

TEST(MpiCollective, EveryTypeAndOpMatchesMpi) {
  MpiTransport transport(MPI_COMM_WORLD);
  run_all(MPI_COMM_WORLD, type_cases(transport.size(), false), mpi_subject(transport));
}

TEST(MpiCollective, RefusesOtherTransportsAndBadArguments) {
  auto group = transport::inproc::make_group(1);
  EXPECT_FALSE(
      transport::mpi_collective(*group[0], "barrier", nullptr, nullptr, 0, DataType::u8, std::nullopt, -1, {}, {}));
  MpiTransport transport(MPI_COMM_WORLD);
  EXPECT_THROW(
      transport::mpi_collective(transport, "allsum", nullptr, nullptr, 0, DataType::u8, std::nullopt, -1, {}, {}),
      Error);
  try {
    transport::mpi_collective(transport, "allreduce", nullptr, nullptr, std::size_t{1} << 31, DataType::f32,
                              ReduceOp::sum, -1, {}, {});
    ADD_FAILURE() << "a count over INT_MAX was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::unsupported) << e.what();
  }
}

// An abort reaches every rank, through the control communicator: each learns the first error.
TEST(MpiTransportTest, AbortReachesEveryRank) {
  MpiTransport transport(MPI_COMM_WORLD);
  const std::uint64_t before = transport.generation();
  std::string errors;
  if (transport.aborted()) errors += "aborted before any abort; ";
  MPI_Barrier(MPI_COMM_WORLD);
  if (transport.rank() == 0) {
    transport.abort(Error(ErrorCode::timeout, "test"), 42);
    transport.abort(Error(ErrorCode::system, "second"), 43);  // the first error wins
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (!transport.aborted() && std::chrono::steady_clock::now() < deadline)
    transport.wait(transport.generation(), std::min(deadline, std::chrono::steady_clock::now() + 10ms));
  if (auto failure = transport.aborted()) {
    if (failure->seq != 42 || failure->error.code() != ErrorCode::timeout ||
        std::string(failure->error.what()) != "test")
      errors += std::string("got seq ") + std::to_string(failure->seq) + ", " + failure->error.what() + "; ";
  } else {
    errors += "rank 0's abort never arrived; ";
  }
  if (transport.generation() == before) errors += "the abort woke no waiter; ";
  expect_all_ranks_ok(MPI_COMM_WORLD, errors.empty() ? "" : "rank " + std::to_string(transport.rank()) + ": " + errors);
}

// A message over INT_MAX bytes travels as one derived-type element. Needs ~4.3 GB: opt-in.
TEST(MpiTransportTest, MessageOverIntMaxBytes) {
  if (std::getenv("TUTTI_TEST_LARGE") == nullptr) GTEST_SKIP() << "set TUTTI_TEST_LARGE=1 (needs ~4.3 GB per rank)";
  MpiTransport transport(MPI_COMM_WORLD);
  const int me = transport.rank();
  const std::size_t bytes = (std::size_t{1} << 31) + 12345;
  std::vector<std::uint8_t> out(bytes), in(bytes, 0);
  for (std::size_t i = 0; i < bytes; i += 4093) out[i] = static_cast<std::uint8_t>(i / 4093 + 1);
  out.back() = 0x5a;
  transport::Completion sent, received;
  const transport::MessageKey key{transport::Channel::point_to_point, 9, 0};
  transport.post_recv(me, key, in.data(), bytes, &received);
  transport.post_send(me, key, out.data(), bytes, &sent);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while ((sent.state() == transport::Completion::posted || received.state() == transport::Completion::posted) &&
         std::chrono::steady_clock::now() < deadline)
    transport.wait(transport.generation(), deadline);
  EXPECT_EQ(sent.state(), transport::Completion::done) << sent.error;
  ASSERT_EQ(received.state(), transport::Completion::done) << received.error;
  EXPECT_TRUE(in == out);
}

TEST(Split, MatchesMpiCommSplit) {
  Communicator world = from_mpi(MPI_COMM_WORLD);
  const int me = world.rank();
  const int color = me % 2, key = -me;  // reversed order inside each color
  Communicator sub = world.split(color, key);
  MPI_Comm reference = MPI_COMM_NULL;
  MPI_Comm_split(MPI_COMM_WORLD, color, key, &reference);
  std::string errors;
  if (sub.rank() != comm_rank(reference) || sub.size() != comm_size(reference))
    errors = "rank " + std::to_string(me) + ": split gave rank " + std::to_string(sub.rank()) + " of " +
             std::to_string(sub.size()) + ", MPI_Comm_split " + std::to_string(comm_rank(reference)) + " of " +
             std::to_string(comm_size(reference)) + "\n";
  expect_all_ranks_ok(MPI_COMM_WORLD, errors);
  if (errors.empty()) {
    run_all(reference, split_cases(sub.size()), tutti_subject(sub));
    MpiTransport sub_transport(reference);
    run_all(reference, split_cases(sub.size()), mpi_subject(sub_transport));
  }
  Communicator none = world.split(me == 0 ? -1 : 0, 0);  // a negative color: no communicator
  EXPECT_EQ(none.size(), me == 0 ? 0 : world.size() - 1);
  MPI_Comm_free(&reference);
}

// ---- faults (MPI_TEST_MODE=fault: ctest's mpi_fault_* entries, apart from the rest because
// they leave behind requests MPI cannot cancel; MPI_Finalize still completes) ----

using steady = std::chrono::steady_clock;

// Every rank's text, in rank order, on every rank.
std::vector<std::string> all_texts(MPI_Comm comm, const std::string& mine) {
  const int p = comm_size(comm), length = static_cast<int>(mine.size());
  std::vector<int> lengths(static_cast<std::size_t>(p)), displacements(static_cast<std::size_t>(p));
  MPI_Allgather(&length, 1, MPI_INT, lengths.data(), 1, MPI_INT, comm);
  std::exclusive_scan(lengths.begin(), lengths.end(), displacements.begin(), 0);
  std::string all(static_cast<std::size_t>(displacements.back() + lengths.back()), '\0');
  MPI_Allgatherv(mine.data(), length, MPI_CHAR, all.data(), lengths.data(), displacements.data(), MPI_CHAR, comm);
  std::vector<std::string> out;
  for (std::size_t r = 0; r < lengths.size(); ++r)
    out.push_back(all.substr(static_cast<std::size_t>(displacements[r]), static_cast<std::size_t>(lengths[r])));
  return out;
}

// What one rank's call gave, and how long it took.
struct Outcome {
  std::optional<ErrorCode> code;
  std::string message;
  double seconds = 0;
  std::string describe() const {
    return (code ? std::string(to_string(*code)) : std::string("no error")) + " after " + std::to_string(seconds) +
           " s: " + message;
  }
};

Outcome outcome_of(const std::function<void()>& fn) {
  const auto start = steady::now();
  Outcome out;
  try {
    fn();
  } catch (const Error& e) {
    out.code = e.code();
    out.message = e.what();
  }
  out.seconds = std::chrono::duration<double>(steady::now() - start).count();
  return out;
}

constexpr auto fault_timeout = 1000ms;  // the operation's deadline in the timeout tests
constexpr auto lateness = 2500ms;       // how late the late rank comes
constexpr double bound_s = 4.0;         // timeout + 3 s: what "by the deadline" allows on a loaded machine

// One rank (the last) passes another count to an allreduce: every rank raises Error(mismatch)
// naming it, at once (the deadline is 20 s), and the communicator is failed for the next call.
void expect_mismatch_on_every_rank(Algorithm algorithm) {
  Communicator world = from_mpi(MPI_COMM_WORLD);
  const int me = world.rank(), odd = world.size() - 1;
  const std::size_t n = me == odd ? 37 : 36;
  std::vector<std::int32_t> in(37, 1), out(37, 0);
  const Outcome o = outcome_of([&] {
    world.allreduce(in.data(), out.data(), n, DataType::i32, ReduceOp::sum, {algorithm, 20s});
  });
  std::string errors;
  if (o.code != ErrorCode::mismatch || o.message.find("rank " + std::to_string(odd)) == std::string::npos ||
      o.seconds > 10)
    errors += "rank " + std::to_string(me) + ": expected Error(mismatch) naming rank " + std::to_string(odd) +
              " at once, got " + o.describe() + "\n";
  const Outcome next = outcome_of([&] { world.barrier({algorithm, 20s}); });
  if (next.code != ErrorCode::aborted)
    errors += "rank " + std::to_string(me) + ": the next call gave " + next.describe() + "\n";
  if (algorithm == Algorithm::mpi) {  // every rank compared the same signatures
    const auto texts = all_texts(MPI_COMM_WORLD, o.message);
    for (const std::string& text : texts)
      if (text != texts[0]) {
        errors +=
            "rank " + std::to_string(me) + ": ranks report different errors: '" + texts[0] + "' and '" + text + "'\n";
        break;
      }
  }
  expect_all_ranks_ok(MPI_COMM_WORLD, errors);
}

TEST(MpiFault, MismatchedCountRaisesOnEveryRankOverMpiCollectives) {
  if (comm_size(MPI_COMM_WORLD) < 2) GTEST_SKIP() << "needs 2 ranks";
  expect_mismatch_on_every_rank(Algorithm::mpi);
}

TEST(MpiFault, MismatchedCountRaisesOnEveryRankOverSchedules) {
  if (comm_size(MPI_COMM_WORLD) < 2) GTEST_SKIP() << "needs 2 ranks";
  expect_mismatch_on_every_rank(Algorithm::ring);
}

// The last rank comes `lateness` late to `call`: the others raise Error(timeout) by their deadline
// (not when it comes). The late rank raises it too: at once when the others' abort reaches it
// (`told`), else (set-up, before there is a communicator to tell) by its own deadline.
void expect_timeout_for_late_rank(const std::function<void()>& call, bool told = true) {
  const int me = comm_rank(MPI_COMM_WORLD), late = comm_size(MPI_COMM_WORLD) - 1;
  MPI_Barrier(MPI_COMM_WORLD);
  if (me == late) std::this_thread::sleep_for(lateness);
  const Outcome o = outcome_of(call);
  const double deadline_s = std::chrono::duration<double>(fault_timeout).count();
  const double least = me == late ? 0 : deadline_s - 0.05, most = me == late && told ? deadline_s / 2 : bound_s;
  std::string errors;
  if (o.code != ErrorCode::timeout || o.seconds < least || o.seconds > most)
    errors = "rank " + std::to_string(me) + (me == late ? " (late)" : "") + ": expected Error(timeout) within [" +
             std::to_string(least) + ", " + std::to_string(most) + "] s, got " + o.describe() + "\n";
  expect_all_ranks_ok(MPI_COMM_WORLD, errors);
}

TEST(MpiFault, LateRankTimesOutByTheDeadlineOverMpiCollectives) {
  if (comm_size(MPI_COMM_WORLD) < 2) GTEST_SKIP() << "needs 2 ranks";
  Communicator world = from_mpi(MPI_COMM_WORLD);
  std::vector<std::int32_t> in(64, 1), out(64, 0);
  expect_timeout_for_late_rank([&] {
    world.allreduce(in.data(), out.data(), in.size(), DataType::i32, ReduceOp::sum, {Algorithm::mpi, fault_timeout});
  });
}

TEST(MpiFault, LateRankTimesOutByTheDeadlineOverSchedules) {
  if (comm_size(MPI_COMM_WORLD) < 2) GTEST_SKIP() << "needs 2 ranks";
  Communicator world = from_mpi(MPI_COMM_WORLD);
  std::vector<std::int32_t> in(64, 1), out(64, 0);
  expect_timeout_for_late_rank([&] {
    world.allreduce(in.data(), out.data(), in.size(), DataType::i32, ReduceOp::sum, {Algorithm::ring, fault_timeout});
  });
}

// Sets TUTTI_TIMEOUT_MS (the deadline of set-up and split) for one scope.
struct DefaultTimeout {
  explicit DefaultTimeout(std::chrono::milliseconds ms) {
    setenv("TUTTI_TIMEOUT_MS", std::to_string(ms.count()).c_str(), 1);
  }
  ~DefaultTimeout() { unsetenv("TUTTI_TIMEOUT_MS"); }
};

TEST(MpiFault, FromMpiWithLateRankTimesOut) {
  if (comm_size(MPI_COMM_WORLD) < 2) GTEST_SKIP() << "needs 2 ranks";
  DefaultTimeout scope(fault_timeout);
  expect_timeout_for_late_rank([] { Communicator world = from_mpi(MPI_COMM_WORLD); }, false);
}

TEST(MpiFault, SplitWithLateMemberTimesOut) {
  if (comm_size(MPI_COMM_WORLD) < 2) GTEST_SKIP() << "needs 2 ranks";
  MpiTransport parent(MPI_COMM_WORLD, fault_timeout);
  const int p = parent.size(), me = parent.rank();
  std::vector<int> ranks(static_cast<std::size_t>(p));
  std::iota(ranks.rbegin(), ranks.rend(), 0);  // every rank, in reverse order
  // Straight to the transport: Communicator::split's allgather would catch the late rank first.
  expect_timeout_for_late_rank([&] { parent.split(77, ranks, p - 1 - me); });
  // The parent is aborted on every rank: the first error reached all.
  const auto deadline = steady::now() + 5s;
  while (!parent.aborted() && steady::now() < deadline) parent.wait(parent.generation(), steady::now() + 10ms);
  const auto failure = parent.aborted();
  expect_all_ranks_ok(MPI_COMM_WORLD,
                      failure && failure->error.code() == ErrorCode::timeout
                          ? ""
                          : "rank " + std::to_string(me) + ": the parent is not aborted by a timeout\n");
}

TEST(MpiFault, CommunicatorSplitWithLateRankTimesOut) {
  if (comm_size(MPI_COMM_WORLD) < 2) GTEST_SKIP() << "needs 2 ranks";
  DefaultTimeout scope(fault_timeout);
  Communicator world = from_mpi(MPI_COMM_WORLD);
  expect_timeout_for_late_rank([&] { world.split(0, world.rank()); });
}

// Only rank 0 prints gtest's report; the others print their failed assertions, prefixed.
class RankFailurePrinter : public ::testing::EmptyTestEventListener {
 public:
  explicit RankFailurePrinter(int rank) : rank_(rank) {}
  void OnTestPartResult(const ::testing::TestPartResult& result) override {
    if (result.failed())
      std::fprintf(stderr, "[rank %d] %s:%d: %s\n", rank_, result.file_name() ? result.file_name() : "?",
                   result.line_number(), result.summary());
  }

 private:
  int rank_;
};

}  // namespace
}  // namespace tutti::testing

int main(int argc, char** argv) {
  // MPI_TEST_THREAD_LEVEL=serialized covers the path where Tutti serializes every MPI call itself.
  const char* level = std::getenv("MPI_TEST_THREAD_LEVEL");
  const bool serialized = level != nullptr && std::string(level) == "serialized";
  int provided = 0;
  MPI_Init_thread(&argc, &argv, serialized ? MPI_THREAD_SERIALIZED : MPI_THREAD_MULTIPLE, &provided);
  ::testing::InitGoogleTest(&argc, argv);
  // MPI_TEST_MODE=fault runs the fault tests alone (they leave requests MPI cannot cancel).
  const char* mode = std::getenv("MPI_TEST_MODE");
  const bool fault = mode != nullptr && std::string(mode) == "fault";
  if (GTEST_FLAG_GET(filter) == "*") GTEST_FLAG_SET(filter, fault ? "MpiFault.*" : "-MpiFault.*");
  const int rank = tutti::testing::comm_rank(MPI_COMM_WORLD);
  if (rank != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new tutti::testing::RankFailurePrinter(rank));
  }
  const int result = RUN_ALL_TESTS();
  int worst = 0;
  MPI_Allreduce(&result, &worst, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  MPI_Finalize();
  return worst;
}
