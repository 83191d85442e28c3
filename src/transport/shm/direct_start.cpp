// The entry points of the direct collectives: start_direct (arguments checked, in-place forms
// mapped onto what DirectRun takes), the shm transport's native collectives, and
// their price for the cost model (direct_price).
#include "transport/in_place.hpp"
#include "transport/shm/direct_run.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>

namespace tutti::transport::shm {

namespace {

ReduceOp required_op(Collective kind, std::optional<ReduceOp> op) {
  if (!op)
    throw Error(ErrorCode::invalid_argument,
                "shm direct " + std::string(to_string(kind)) + ": a reduction needs an op");
  return *op;
}

}  // namespace

std::unique_ptr<DirectCollective> start_direct(Transport& transport, const NativeCall& call,
                                               std::chrono::milliseconds timeout) {
  const Collective kind = call.collective;
  const std::size_t count = call.count;
  const DataType type = call.type;
  const int root = call.root;
  if (!is_shm(transport)) return nullptr;
  auto* shm = static_cast<ShmTransport*>(&transport);
  if (!serves(kind))
    throw Error(ErrorCode::unsupported, "shm direct: no direct algorithm for " + std::string(to_string(kind)));
  // A rank's part of a data set must hold one element of each of the p blocks.
  if (input_blocks(kind) && shm->segment().layout().direct_chunk / size_of(type) < std::size_t(shm->size()))
    throw Error(ErrorCode::unsupported,
                "shm direct " + std::string(to_string(kind)) + ": too many ranks for the data area");
  if ((kind == Collective::broadcast || kind == Collective::gather || kind == Collective::scatter ||
       kind == Collective::reduce) &&
      (root < 0 || root >= shm->size()))
    throw Error(ErrorCode::invalid_argument, "shm direct " + std::string(to_string(kind)) + ": root " +
                                                 std::to_string(root) + " is out of range for size " +
                                                 std::to_string(shm->size()));
  if (kind == Collective::alltoallv && !shm->segment().single_copy())
    throw Error(ErrorCode::unsupported,
                "shm direct alltoallv: needs single copy (process_vm_readv), which this "
                "segment does not allow");
  if ((kind == Collective::alltoallv && (call.counts.size() != static_cast<std::size_t>(shm->size()) ||
                                         call.recv_counts.size() != call.counts.size())) ||
      (kind == Collective::allgatherv && call.counts.size() != static_cast<std::size_t>(shm->size())))
    throw Error(ErrorCode::invalid_argument, "shm direct allgatherv: " + std::to_string(call.counts.size()) +
                                                 " counts for size " + std::to_string(shm->size()));
  const bool reduces =
      kind == Collective::allreduce || kind == Collective::reduce_scatter || kind == Collective::reduce;
  const ReduceOp reduce_op = reduces ? required_op(kind, call.op) : ReduceOp::sum;
  // The in-place forms, mapped onto the forms DirectRun takes.
  const InPlace in_place = map_in_place(call, shm->rank());
  const std::byte* in = in_place.input;
  auto* out = static_cast<std::byte*>(call.recv);
  Scratch staging;
  if (in_place.stage_output) {
    staging = Scratch(count * size_of(type));
    out = staging.data();
  }
  // Alltoallv in place: the input, before it is overwritten (its blocks and results lie anywhere
  // in the buffer). An alltoall's blocks and results share their places: only its single copy
  // needs a snapshot, of the blocks for its peers (DirectRun::snapshot_blocks).
  Scratch snapshot;
  if (in_place.snapshot_input && kind == Collective::alltoallv) {
    const std::size_t input_bytes =
        std::accumulate(call.counts.begin(), call.counts.end(), std::size_t{0}) * size_of(type);
    snapshot = Scratch(input_bytes);
    if (input_bytes > 0) core::copy(snapshot.data(), in, input_bytes);  // an empty call may pass null
    in = snapshot.data();
  }
  auto run = std::make_unique<DirectRun>(*shm, kind, in, out, count, call.counts, call.recv_counts, type, reduce_op,
                                         root, timeout);
  if (staging) run->deliver_to(static_cast<std::byte*>(call.recv), std::move(staging));
  if (snapshot) run->keep_input(std::move(snapshot));
  return run;
}

bool ShmTransport::serves_natively(Algorithm algorithm, Collective collective) const {
  return algorithm == Algorithm::direct && serves(collective) &&
         (collective != Collective::alltoallv || segment_->single_copy());
}

std::unique_ptr<NativeCollective> ShmTransport::start_native(Algorithm algorithm, const NativeCall& call,
                                                             std::chrono::milliseconds timeout) {
  if (!serves_natively(algorithm, call.collective)) return Transport::start_native(algorithm, call, timeout);
  return start_direct(*this, call, timeout);
}

// By kind, not dynamic_cast: this is on every direct call's path.
bool is_shm(const Transport& transport) { return transport.kind() == Kind::shm; }

// ---- the price of the direct algorithms (transport/cost.hpp asks) ----

namespace {

// The model's element: f32 (the choice depends on bytes, not on the type), and bytes per rank
// per step (direct.cpp's chunk, which also bounds the one-step allreduce).
constexpr std::size_t price_elem_size = 4;
constexpr double direct_chunk = 256.0 * 1024;
// A direct copy is one memcpy into or out of the shared data area; a shared-memory message, which
// β prices, is two (into the ring slot, out of it) plus its chunking, acknowledgements and
// doorbells: a direct byte costs a fifth of a message byte, and a byte copied out with streaming
// stores (streaming_bytes), which skip reading the destination line first, an eighth. The
// measurements behind these shares: docs/performance.md, "Where the shared-memory thresholds
// come from".
constexpr double direct_copy_share = 0.2;
constexpr double direct_streamed_share = 0.125;
// A direct barrier is one store and a poll of p flags (an 8-byte inline allreduce is one such
// exchange); a message round, which α prices at 3 µs for shm, also fills a
// ring slot, rings a doorbell and returns an acknowledgement.
constexpr double direct_barrier_share = 0.1;

}  // namespace

// Barriers (each ≈ α/10), copied bytes and reduced elements on one rank's path; ranks run alike.
double direct_price(Collective c, int p, std::size_t bytes, const CostParams& cost) {
  // Bytes per rank: `bytes` is the total over ranks for reduce_scatter, allgather and alltoall.
  const bool blocks = input_blocks(c) || output_blocks(c) || c == Collective::allgatherv || c == Collective::gather ||
                      c == Collective::scatter;
  const std::size_t parts = blocks ? static_cast<std::size_t>(p) : 1;
  const std::size_t count = (bytes + price_elem_size * parts - 1) / (price_elem_size * parts);
  const double n = static_cast<double>(count) * price_elem_size;
  const double up = static_cast<double>(p), elements = n / price_elem_size;
  const double copy = cost.beta * direct_copy_share, barrier = cost.alpha * direct_barrier_share;
  // Copying results out: streamed from streaming_bytes of them on all ranks (`bytes` is one
  // rank's here).
  const double copy_out =
      cost.beta * (bytes * static_cast<std::size_t>(p) >= streaming_bytes ? direct_streamed_share : direct_copy_share);
  const auto steps = [](double data, double per_step) { return std::max(1.0, std::ceil(data / per_step)); };
  switch (c) {
    case Collective::allreduce:
      // Small: copy in, barrier, every rank reduces all p parts into its output.
      if (bytes <= small_allreduce_bytes)
        return barrier + copy * n * (p == 1 ? 2 : 1) + cost.gamma * (up - 1) * elements;
      // Per chunk: copy in the others' slices, barrier, reduce my 1/p slice into my output and
      // publish it, barrier, copy the others' slices out.
      return 2 * steps(n, direct_chunk) * barrier + copy * n + copy_out * n * (up - 1) / up +
             cost.gamma * (up - 1) / up * elements;
    case Collective::reduce_scatter:
      // Per chunk: copy my chunk of the others' p - 1 blocks in, barrier, reduce my block from
      // my input and the others' parts.
      return steps(n, direct_chunk / up) * barrier + copy * n * (up - 1) + cost.gamma * (up - 1) * elements;
    case Collective::allgather:
    case Collective::allgatherv:  // n: the average block
    case Collective::gather:      // the root's path: copying the p blocks out
      // Per chunk: copy my block in, barrier, copy the p blocks out.
      return steps(n, direct_chunk) * barrier + copy * n + copy_out * n * up;
    case Collective::scatter:
      // Per chunk of the p blocks: the root copies the p - 1 others' in, barrier, each copies its out.
      return steps(n, direct_chunk) * barrier + copy * n * (up - 1) + copy_out * n;
    case Collective::reduce:
      // Per chunk: the others copy their input in, barrier, the root reduces the p parts.
      return steps(n, direct_chunk) * barrier + copy * n + cost.gamma * (up - 1) * elements;
    case Collective::barrier:  // one exchange of signatures
      return barrier;
    case Collective::broadcast:
      // Per chunk of p slots: the root copies in, barrier, the others copy out.
      return steps(n, direct_chunk * up) * barrier + copy * n + copy_out * n;
    case Collective::alltoall:
    case Collective::alltoallv:  // (priced as alltoall: its size is not known alike on every rank)
      // n: one block. Per chunk of the p blocks: copy the p - 1 blocks the peers take in, barrier,
      // copy the p - 1 blocks from the peers out; this rank's own block once, from its input.
      return steps(n * up, direct_chunk) * barrier + copy * n * (up - 1) + copy_out * n * (up - 1) + copy * n;
    default:
      throw Error(ErrorCode::unsupported, "cost model: direct does not serve " + std::string(to_string(c)));
  }
}

}  // namespace tutti::transport::shm
