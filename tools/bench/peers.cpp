// The peers tutti-bench times beside Tutti: OpenMPI's own collectives and Gloo's.
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <stdexcept>
#include <vector>

#include "bench/gloo_peer.hpp"
#include "bench/runner.hpp"

#ifdef TUTTI_WITH_MPI
#include <mpi.h>

#include "tutti/mpi.hpp"
#endif

namespace tutti::bench {

namespace {

#ifdef TUTTI_WITH_MPI
class MpiPeer final : public Peer {
 public:
  MpiPeer() {  // (MPI is initialized: make_mpi_peer)
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &size_);
  }
  std::string name() const override { return "mpi"; }

  bool supports(const Case& c) const override {
    // No MPI datatype (Tutti's own f16/bf16 types would time Tutti's kernels, not MPI's).
    if (c.type == DataType::f16 || c.type == DataType::bf16) return false;
    // In place: MPI_IN_PLACE where the buffers mean what Tutti's in-place form means (MPI's
    // reduce_scatter in place leaves the result at the start of the buffer, not at the rank's block).
    if (c.in_place && c.kind != Collective::broadcast && c.kind != Collective::allreduce &&
        c.kind != Collective::allgather && c.kind != Collective::alltoall && c.kind != Collective::reduce)
      return false;
    return !reduces(c.kind) || c.op != ReduceOp::avg;
  }

  void run(const Case& c, Buffers& b) override {
    const MPI_Datatype type = mpi_datatype(c.type);
    const MPI_Op op = mpi_op(c.op, c.type);
    const int n = static_cast<int>(c.count);
    const void* send = b.send();
    void* recv = b.recv();
    // A reduce's in place is the root's alone.
    if (c.in_place && c.kind != Collective::broadcast && (c.kind != Collective::reduce || rank_ == c.root))
      send = MPI_IN_PLACE;
    if (c.kind == sendrecv) {
      MPI_Sendrecv(send, n, type, (rank_ + 1) % size_, 0, recv, n, type, (rank_ + size_ - 1) % size_, 0, MPI_COMM_WORLD,
                   MPI_STATUS_IGNORE);
      return;
    }
    switch (*c.kind) {
      case Collective::allreduce:
        MPI_Allreduce(send, recv, n, type, op, MPI_COMM_WORLD);
        break;
      case Collective::reduce_scatter:
        MPI_Reduce_scatter_block(send, recv, n, type, op, MPI_COMM_WORLD);
        break;
      case Collective::allgather:
        MPI_Allgather(send, n, type, recv, n, type, MPI_COMM_WORLD);
        break;
      case Collective::broadcast:
        MPI_Bcast(recv, n, type, c.root, MPI_COMM_WORLD);
        break;
      case Collective::reduce:
        MPI_Reduce(send, recv, n, type, op, c.root, MPI_COMM_WORLD);
        break;
      case Collective::alltoall:
        MPI_Alltoall(send, n, type, recv, n, type, MPI_COMM_WORLD);
        break;
      case Collective::allgatherv: {
        const Layout& l = layout(b);
        MPI_Allgatherv(send, l.send[0], type, recv, l.recv.data(), l.recv_displs.data(), type, MPI_COMM_WORLD);
        break;
      }
      case Collective::alltoallv: {
        const Layout& l = layout(b);
        MPI_Alltoallv(send, l.send.data(), l.send_displs.data(), type, recv, l.recv.data(), l.recv_displs.data(), type,
                      MPI_COMM_WORLD);
        break;
      }
      case Collective::gather:
        MPI_Gather(send, n, type, recv, n, type, c.root, MPI_COMM_WORLD);
        break;
      case Collective::scatter:
        MPI_Scatter(send, n, type, recv, n, type, c.root, MPI_COMM_WORLD);
        break;
      case Collective::barrier:
        MPI_Barrier(MPI_COMM_WORLD);
        break;
    }
  }

 private:
  // The v-forms' counts and displacements as MPI takes them (int), converted again only when the
  // counts change (a new size), so that no allocation is timed.
  struct Layout {
    std::vector<int> send, send_displs, recv, recv_displs;
  };
  static bool same(std::span<const std::size_t> counts, const std::vector<int>& ints) {
    return std::equal(counts.begin(), counts.end(), ints.begin(), ints.end(),
                      [](std::size_t a, int b) { return a == static_cast<std::size_t>(b); });
  }
  static void to_mpi(std::span<const std::size_t> counts, std::vector<int>& out, std::vector<int>& displs) {
    out.clear(), displs.clear();
    int at = 0;
    for (std::size_t n : counts) out.push_back(static_cast<int>(n)), displs.push_back(at), at += static_cast<int>(n);
  }
  const Layout& layout(const Buffers& b) {
    if (!same(b.send_counts(), layout_.send) || !same(b.recv_counts(), layout_.recv)) {
      to_mpi(b.send_counts(), layout_.send, layout_.send_displs);
      to_mpi(b.recv_counts(), layout_.recv, layout_.recv_displs);
    }
    return layout_;
  }
  Layout layout_;
  int rank_ = 0, size_ = 1;  // in MPI_COMM_WORLD, asked once: not inside the timed calls
};
#endif

class GlooAdapter final : public Peer {
 public:
  GlooAdapter(int rank, int size, const std::string& directory)
      : gloo_(rank, size, directory, std::chrono::seconds(60)) {}
  std::string name() const override { return "gloo"; }
  bool supports(const Case& c) const override {
    if (c.kind != Collective::allreduce && c.kind != Collective::allgather && c.kind != Collective::broadcast)
      return false;
    if (c.in_place != (c.kind == Collective::broadcast)) return false;  // the primary form only
    return gloo_.supports(to_string(c.kind), c.type, c.op);
  }
  void run(const Case& c, Buffers& b) override {
    gloo_.run(to_string(c.kind), b.send(), b.recv(), c.count, c.type, c.op, c.root);
  }

 private:
  GlooPeer gloo_;
};

}  // namespace

std::unique_ptr<Peer> make_mpi_peer(std::string& why) {
#ifdef TUTTI_WITH_MPI
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (initialized) return std::make_unique<MpiPeer>();
  why = "not launched by mpirun (run tutti-bench under mpirun to time MPI beside Tutti)";
#else
  why = "this build of Tutti has no MPI (install libopenmpi-dev and rebuild)";
#endif
  return nullptr;
}

std::unique_ptr<Peer> make_gloo_peer(Communicator& world, std::string& why) {
  if (!GlooPeer::available()) {
    why = "this build has no Gloo (install libgloo-dev and rebuild)";
    return nullptr;
  }
  // Rank 0 makes the rendezvous directory and tells the others where it is (one host).
  char path[256] = {};
  if (world.rank() == 0) {
    std::string tmpl = (std::filesystem::temp_directory_path() / "tutti-gloo-XXXXXX").string();
    if (::mkdtemp(tmpl.data()) != nullptr) std::strncpy(path, tmpl.c_str(), sizeof(path) - 1);
  }
  world.broadcast(path, sizeof(path), DataType::u8, 0);
  if (path[0] == '\0') {
    why = "could not create a rendezvous directory";
    return nullptr;
  }
  std::unique_ptr<Peer> peer;
  try {
    peer = std::make_unique<GlooAdapter>(world.rank(), world.size(), path);
  } catch (const std::exception& e) {
    why = std::string("Gloo failed to connect: ") + e.what();
  }
  world.barrier();  // everyone connected (or failed) before the directory goes
  if (world.rank() == 0) std::filesystem::remove_all(path);
  int ok = peer ? 1 : 0;
  world.allreduce(std::span<int>(&ok, 1), ReduceOp::min);
  if (!ok) {
    if (why.empty()) why = "Gloo failed to connect on another rank";
    return nullptr;
  }
  return peer;
}

}  // namespace tutti::bench
