#include "transport/mpi/mpi_collective.hpp"

#include <chrono>
#include <climits>
#include <cstring>
#include <vector>

#include "reduce/reduce.hpp"
#include "transport/matching.hpp"
#include "transport/mpi/mpi_support.hpp"
#include "transport/mpi/mpi_transport.hpp"

namespace tutti::transport {

namespace {

// One call's arguments, with the MPI side resolved once.
struct Args {
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
  std::size_t block(int rank) const { return static_cast<std::size_t>(rank) * count * elem; }  // bytes
  bool is_root() const { return rank == root; }
  MPI_Op mpi_op() const { return mpi::reduction(op.value_or(ReduceOp::sum), type); }
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

// What MPI reads or writes besides the caller's buffers, for as long as it holds a request of
// the call: shared with the transport, which keeps it while MPI does.
struct State {
  Completion done;
  WireSignature mine;
  std::vector<WireSignature> signatures;  // every rank's, rank order
  int n = 0;                              // MPI's count
  Layout send, recv;                      // v-collectives
  std::vector<std::byte> staging;         // reduce_scatter's NCCL in-place result; alltoallv's snapshot
};

// Each collective: `prepare` checks the counts against MPI's int limits (nothing is sent yet),
// `start` makes the nonblocking call once the signatures agree.
using Prepare = void (*)(const Args&, State&);
using Start = int (*)(const Args&, State&, MPI_Comm, MPI_Request*);

const void* in_place_or(const void* send, bool in_place) { return in_place ? MPI_IN_PLACE : send; }

void prepare_count(const Args& a, State& s) { s.n = to_int(a.count, "count"); }
void prepare_blocks(const Args& a, State& s) {
  s.n = to_int(a.count, "count");
  to_int(a.count * static_cast<std::size_t>(a.size), "total count");
}

int start_allreduce(const Args& a, State& s, MPI_Comm comm, MPI_Request* r) {
  return MPI_Iallreduce(in_place_or(a.send, a.send == a.recv), a.recv, s.n, a.mpi_type, a.mpi_op(), comm, r);
}

int start_reduce(const Args& a, State& s, MPI_Comm comm, MPI_Request* r) {
  return MPI_Ireduce(in_place_or(a.send, a.is_root() && a.send == a.recv), a.is_root() ? a.recv : nullptr, s.n,
                     a.mpi_type, a.mpi_op(), a.root, comm, r);
}

// NCCL's in-place form (recv is this rank's block of send) has no MPI spelling: MPI's in-place
// form puts the result at the start of the buffer. Reduce into a separate block, then copy.
bool nccl_in_place(const Args& a) { return a.send != a.recv && a.recv == a.send + a.block(a.rank) && a.count > 0; }

int start_reduce_scatter(const Args& a, State& s, MPI_Comm comm, MPI_Request* r) {
  s.staging.resize(nccl_in_place(a) ? a.count * a.elem : 0);
  void* recv = s.staging.empty() ? static_cast<void*>(a.recv) : s.staging.data();
  return MPI_Ireduce_scatter_block(in_place_or(a.send, a.send == a.recv), recv, s.n, a.mpi_type, a.mpi_op(), comm, r);
}

int start_allgather(const Args& a, State& s, MPI_Comm comm, MPI_Request* r) {
  if (a.send == a.recv || a.send == a.recv + a.block(a.rank))
    return MPI_Iallgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, a.recv, s.n, a.mpi_type, comm, r);
  return MPI_Iallgather(a.send, s.n, a.mpi_type, a.recv, s.n, a.mpi_type, comm, r);
}

void prepare_allgatherv(const Args& a, State& s, std::span<const std::size_t> counts) {
  s.recv = layout(counts, "recv_counts");
  s.n = to_int(a.count, "send_count");
}

int start_allgatherv(const Args& a, State& s, MPI_Comm comm, MPI_Request* r) {
  const auto offset = static_cast<std::size_t>(s.recv.displacements[static_cast<std::size_t>(a.rank)]) * a.elem;
  const bool in_place = a.send == a.recv || a.send == a.recv + offset;
  return MPI_Iallgatherv(in_place_or(a.send, in_place), s.n, a.mpi_type, a.recv, s.recv.counts.data(),
                         s.recv.displacements.data(), a.mpi_type, comm, r);
}

int start_broadcast(const Args& a, State& s, MPI_Comm comm, MPI_Request* r) {
  void* buffer = a.recv != nullptr ? static_cast<void*>(a.recv) : const_cast<std::byte*>(a.send);
  return MPI_Ibcast(buffer, s.n, a.mpi_type, a.root, comm, r);
}

int start_alltoall(const Args& a, State& s, MPI_Comm comm, MPI_Request* r) {
  if (a.send == a.recv) return MPI_Ialltoall(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, a.recv, s.n, a.mpi_type, comm, r);
  return MPI_Ialltoall(a.send, s.n, a.mpi_type, a.recv, s.n, a.mpi_type, comm, r);
}

void prepare_alltoallv(State& s, std::span<const std::size_t> send_counts, std::span<const std::size_t> recv_counts) {
  s.send = layout(send_counts, "send_counts");
  s.recv = layout(recv_counts, "recv_counts");
}

int start_alltoallv(const Args& a, State& s, MPI_Comm comm, MPI_Request* r) {
  // MPI's in-place form sends from the receive layout; Tutti's sends from the packed send
  // layout. They agree when the counts do; otherwise snapshot the input (now: earlier
  // collectives may have written it).
  const void* send = a.send;
  if (a.send == a.recv && s.send.counts == s.recv.counts) {
    send = MPI_IN_PLACE;
  } else if (a.send == a.recv) {
    s.staging.assign(a.send, a.send + s.send.total * a.elem);
    send = s.staging.data();
  }
  return MPI_Ialltoallv(send, s.send.counts.data(), s.send.displacements.data(), a.mpi_type, a.recv,
                        s.recv.counts.data(), s.recv.displacements.data(), a.mpi_type, comm, r);
}

int start_gather(const Args& a, State& s, MPI_Comm comm, MPI_Request* r) {
  if (a.is_root() && a.send == a.recv + a.block(a.root))
    return MPI_Igather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, a.recv, s.n, a.mpi_type, a.root, comm, r);
  return MPI_Igather(a.send, s.n, a.mpi_type, a.is_root() ? a.recv : nullptr, s.n, a.mpi_type, a.root, comm, r);
}

int start_scatter(const Args& a, State& s, MPI_Comm comm, MPI_Request* r) {
  const bool in_place = a.is_root() && a.recv == a.send + a.block(a.root);
  void* recv = in_place ? MPI_IN_PLACE : a.recv;
  return MPI_Iscatter(a.is_root() ? a.send : nullptr, s.n, a.mpi_type, recv, s.n, a.mpi_type, a.root, comm, r);
}

int start_barrier(const Args&, State&, MPI_Comm comm, MPI_Request* r) { return MPI_Ibarrier(comm, r); }

struct Entry {
  Collective kind;
  Prepare prepare;  // nullptr: the v-collectives, prepared with their counts
  Start start;
  const char* function;
};

constexpr Entry kCollectives[] = {
    {Collective::allreduce, prepare_count, start_allreduce, "MPI_Iallreduce"},
    {Collective::reduce, prepare_count, start_reduce, "MPI_Ireduce"},
    {Collective::reduce_scatter, prepare_blocks, start_reduce_scatter, "MPI_Ireduce_scatter_block"},
    {Collective::allgather, prepare_blocks, start_allgather, "MPI_Iallgather"},
    {Collective::allgatherv, nullptr, start_allgatherv, "MPI_Iallgatherv"},
    {Collective::broadcast, prepare_count, start_broadcast, "MPI_Ibcast"},
    {Collective::alltoall, prepare_blocks, start_alltoall, "MPI_Ialltoall"},
    {Collective::alltoallv, nullptr, start_alltoallv, "MPI_Ialltoallv"},
    {Collective::gather, prepare_blocks, start_gather, "MPI_Igather"},
    {Collective::scatter, prepare_blocks, start_scatter, "MPI_Iscatter"},
    {Collective::barrier, prepare_count, start_barrier, "MPI_Ibarrier"},
};

class Run final : public MpiCollective {
 public:
  Run(mpi::MpiTransport& transport, const Entry& entry, const Args& args)
      : transport_(transport), entry_(entry), args_(args), state_(std::make_shared<State>()) {}
  State& state() { return *state_; }

  void bind(const Signature& signature) override { signature_ = signature; }

  bool progress() override {
    switch (phase_) {
      case Phase::ready:
        if (args_.size == 1) return start_collective();
        state_->mine = to_wire(signature_);
        state_->signatures.resize(static_cast<std::size_t>(args_.size));
        transport_.post_collective(
            [state = state_.get()](MPI_Comm comm, MPI_Request* r) {
              return MPI_Iallgather(&state->mine, sizeof(WireSignature), MPI_BYTE, state->signatures.data(),
                                    sizeof(WireSignature), MPI_BYTE, comm, r);
            },
            "MPI_Iallgather (signatures)", &state_->done, state_);
        phase_ = Phase::checking;
        [[fallthrough]];
      case Phase::checking:
        if (!finished()) return false;
        check_signatures();
        // A rank that came late may complete the exchange with ranks that already gave up: their
        // abort reached it first, so it must not start a collective nobody else will join.
        if (auto failure = transport_.aborted()) throw failure->error;
        return start_collective();
      case Phase::running:
        if (!finished()) return false;
        finish_result();
        phase_ = Phase::done;
        return true;
      case Phase::done:
        return true;
    }
    return false;
  }

 private:
  enum class Phase { ready, checking, running, done };

  bool finished() const {
    const auto state = state_->done.state();
    if (state == Completion::posted) return false;
    if (state == Completion::failed) throw Error(ErrorCode::system, "Algorithm::mpi: " + state_->done.error);
    return true;
  }

  // Compared with rank 0's, so that every rank names the same first disagreement.
  void check_signatures() const {
    const auto& all = state_->signatures;
    for (std::size_t r = 1; r < all.size(); ++r) {
      if (all[r] == all[0]) continue;
      throw collective_mismatch(0, from_wire(all[0]), static_cast<int>(r), from_wire(all[r]));
    }
  }

  bool start_collective() {
    State* state = state_.get();
    const Args& a = args_;
    const Entry& entry = entry_;
    transport_.post_collective([&](MPI_Comm comm, MPI_Request* r) { return entry.start(a, *state, comm, r); },
                               entry.function, &state->done, state_);
    phase_ = Phase::running;
    return progress();
  }

  void finish_result() {
    const Args& a = args_;
    State& s = *state_;
    if (!s.staging.empty() && entry_.kind == Collective::reduce_scatter)
      std::memcpy(a.recv, s.staging.data(), s.staging.size());
    const bool has_result = entry_.kind == Collective::allreduce || entry_.kind == Collective::reduce_scatter ||
                            (entry_.kind == Collective::reduce && a.is_root());
    if (has_result && a.op == ReduceOp::avg && a.count > 0) reduce::divide(a.type, a.recv, a.count, a.size);
  }

  mpi::MpiTransport& transport_;
  const Entry& entry_;
  Args args_;
  std::shared_ptr<State> state_;
  Signature signature_;
  Phase phase_ = Phase::ready;
};

}  // namespace

std::unique_ptr<MpiCollective> prepare_mpi_collective(Transport& t, Collective kind, const void* send, void* recv,
                                                      std::size_t count, DataType type, std::optional<ReduceOp> op,
                                                      int root, std::span<const std::size_t> counts,
                                                      std::span<const std::size_t> recv_counts) {
  auto* transport = dynamic_cast<mpi::MpiTransport*>(&t);
  if (transport == nullptr) return nullptr;
  for (const Entry& entry : kCollectives) {
    if (entry.kind != kind) continue;
    Args a;
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
    auto run = std::make_unique<Run>(*transport, entry, a);
    if (entry.kind == Collective::allgatherv)
      prepare_allgatherv(a, run->state(), counts);
    else if (entry.kind == Collective::alltoallv)
      prepare_alltoallv(run->state(), counts, recv_counts);
    else
      entry.prepare(a, run->state());
    return run;
  }
  throw Error(ErrorCode::invalid_argument,
              "Algorithm::mpi: unknown collective " + std::to_string(static_cast<int>(kind)));
}

bool mpi_collective(Transport& t, Collective kind, const void* send, void* recv, std::size_t count, DataType type,
                    std::optional<ReduceOp> op, int root, std::span<const std::size_t> counts,
                    std::span<const std::size_t> recv_counts) {
  auto run = prepare_mpi_collective(t, kind, send, recv, count, type, op, root, counts, recv_counts);
  if (!run) return false;
  Signature signature;
  signature.collective = kind;
  const bool per_rank_counts = kind == Collective::allgatherv || kind == Collective::alltoallv;
  signature.count = per_rank_counts ? 0 : count;
  signature.type = type;
  signature.op = op;
  signature.root = root;
  signature.algorithm = Algorithm::mpi;
  run->bind(signature);
  const auto timeout = static_cast<mpi::MpiTransport&>(t).timeout();
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    const std::uint64_t seen = t.generation();
    try {
      if (run->progress()) return true;
    } catch (const Error& error) {
      t.abort(error, no_seq);  // the first error wins, on every rank
      throw;
    }
    if (std::chrono::steady_clock::now() >= deadline) {
      Error error(ErrorCode::timeout, "rank " + std::to_string(t.rank()) + ": " + std::string(to_string(kind)) +
                                          " (Algorithm::mpi) timed out after " + std::to_string(timeout.count()) +
                                          " ms");
      t.abort(error, no_seq);
      throw error;
    }
    t.wait(seen, deadline);
  }
}

std::unique_ptr<NativeCollective> mpi::MpiTransport::start_native(Algorithm algorithm, const NativeCall& call,
                                                                  std::chrono::milliseconds timeout) {
  if (!serves_natively(algorithm, call.collective)) return Transport::start_native(algorithm, call, timeout);
  // The queue's deadline covers it (the operation's timeout); MPI's requests carry none.
  return prepare_mpi_collective(*this, call.collective, call.send, call.recv, call.count, call.type, call.op, call.root,
                                call.counts, call.recv_counts);
}

}  // namespace tutti::transport
