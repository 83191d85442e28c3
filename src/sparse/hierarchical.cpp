// Algorithm::hierarchical: the sparse allreduce in two levels, so that a host's link carries the
// union of its ranks' pairs once instead of every rank's pairs. With H hosts of L ranks each:
//
//   inside the host   sparse reduce-scatter of L index ranges (local rank l keeps range l, the
//                     host's union of it)
//   across hosts      range l reduced among the H ranks of local index l, by the flat algorithm
//                     the cost model picks for it (the range seen as a vector of its own length)
//   inside the host   allgather of the L ranges, as pairs or, once the result is dense, as blocks
//
// Hosts with unequal numbers of ranks go through one leader each instead: the host's union on
// every rank of it (split_allgather), the leaders' allreduce across hosts, the leader's result
// broadcast inside the host.
//
// The pieces that cross hosts travel as pairs unless the result is dense whatever the overlap
// (the form is dense, or one rank alone passes the threshold): a range that went dense on its own
// would no longer say which of its indices the union holds, and a sparse result must give exactly
// the union. Where one rank's pairs alone outweigh the dense vector, sparse_allreduce runs the
// dense allreduce instead (dense_allreduce, whose allreduce is itself hierarchical across hosts
// where the topology is known): every way of moving pairs then moves more bytes than the dense
// vector, and handles millions of pairs besides (at 50% density of 16M values on 2 x 2 hosts this
// path took 2.0 s a call against the dense allreduce's 0.8). The communicators are the
// caller-thread pair of CommImpl::caller_hierarchy, split at the first hierarchical call. A step
// that fails on one rank fails the pair and the communicator for every rank.
#include <string>

#include "comm/access.hpp"
#include "comm/comm_impl.hpp"
#include "sparse/algorithms.hpp"

namespace tutti::sparse::detail {

namespace {

using Hierarchy = tutti::comm::CommImpl::Hierarchy;

// A context on `comm` (part of ctx.comm) with ctx's op, deadline and element types.
Context part_of(const Context& ctx, tutti::Communicator& comm, const Layout& layout, Form form, const char* operation) {
  Context part(comm);
  part.rank = comm.rank();
  part.size = comm.size();
  part.layout = layout;
  part.op = ctx.op;
  part.form = form;
  part.collective_options = ctx.collective_options;
  part.operation = operation;
  return part;
}

// Moves a sparse piece's indices by `delta` (a range to a vector of its own and back).
void shift(Piece& piece, std::int64_t delta) {
  if (piece.dense) return;
  for (std::uint64_t& i : piece.indices) i = static_cast<std::uint64_t>(static_cast<std::int64_t>(i) + delta);
}

// The allreduce among `inter` (one rank per host) of this rank's pairs in [lo, hi), as a vector of
// hi - lo: the merged range with indices in [lo, hi), or a dense block of hi - lo values. `sharing`
// ranks of the host cross its link at once: each sees 1/sharing of its rate.
Piece across_hosts(const Context& ctx, tutti::Communicator& inter, Piece range, std::uint64_t lo, std::uint64_t hi,
                   CostParams cost, int sharing) {
  cost.beta *= sharing;
  if (inter.size() == 1) return range;
  const bool dense_allowed = ctx.form == Form::dense || surely_dense(ctx.form, ctx.layout, ctx.largest_nnz());
  Context part =
      part_of(ctx, inter, layout_of(hi - lo, ctx.layout.index_type, ctx.layout.value_type),
              dense_allowed ? Form::automatic : Form::sparse, "sparse_allreduce (hierarchical, across hosts)");
  std::uint64_t n = range.nnz();
  std::vector<std::uint64_t> counts(static_cast<std::size_t>(part.size));
  inter.allgather(&n, counts.data(), 1, DataType::u64, part.collective_options);
  for (int r = 0; r < part.size; ++r) {
    if (counts[r] > hi - lo)
      throw Error(ErrorCode::invalid_argument, std::string(part.operation) + ": rank " + std::to_string(r) +
                                                   " of the hosts' ranks announced " + std::to_string(counts[r]) +
                                                   " pairs for a range of " + std::to_string(hi - lo));
    part.nnz.push_back(static_cast<std::size_t>(counts[r]));
  }
  shift(range, -static_cast<std::int64_t>(lo));
  Piece merged = run_flat(part, choose_flat(part, cost), std::move(range));
  shift(merged, static_cast<std::int64_t>(lo));
  return merged;
}

Piece by_ranges(Context& ctx, Hierarchy& h, Piece mine, const CostParams& cost) {
  Context local = part_of(ctx, h.intra, ctx.layout, ctx.form, "sparse_allreduce (hierarchical, inside the host)");
  if (local.size == 1) return across_hosts(ctx, h.inter, std::move(mine), 0, ctx.layout.dim, cost, 1);
  Piece range = reduce_scatter(local, mine);
  const std::uint64_t lo = range_begin(ctx.layout.dim, local.rank, local.size);
  const std::uint64_t hi = range_begin(ctx.layout.dim, local.rank + 1, local.size);
  return allgather_ranges(local, across_hosts(ctx, h.inter, std::move(range), lo, hi, cost, local.size), true);
}

Piece by_leaders(Context& ctx, Hierarchy& h, Piece mine, const CostParams& cost) {
  Context local = part_of(ctx, h.intra, ctx.layout, Form::sparse, "sparse_allreduce (hierarchical, inside the host)");
  Piece host = local.size > 1 ? split_allgather(local, std::move(mine), false) : std::move(mine);
  Piece merged;
  if (local.rank == 0) merged = across_hosts(ctx, h.inter, std::move(host), 0, ctx.layout.dim, cost, 1);
  if (local.size == 1) return merged;
  // The leader's result to the host: its header, then its values or its packed pairs.
  local.form = ctx.form;
  std::uint64_t header = merged.dense ? piece_mark : merged.nnz();
  h.intra.broadcast(&header, 1, DataType::u64, 0, local.collective_options);
  if (local.rank == 0) {
    std::vector<std::byte> packed;
    if (!merged.dense) pack(merged, 0, merged.nnz(), ctx.layout, packed);
    std::vector<std::byte>& out = merged.dense ? merged.values : packed;
    h.intra.broadcast(out.data(), out.size(), DataType::u8, 0, local.collective_options);
    return merged;
  }
  std::vector<std::byte> bytes(bytes_announced(local, header, 0));
  h.intra.broadcast(bytes.data(), bytes.size(), DataType::u8, 0, local.collective_options);
  return piece_of(local, header, std::move(bytes), 0);
}

}  // namespace

Piece hierarchical(Context& ctx, Piece mine, const CostParams& cost) {
  tutti::comm::CommImpl& impl = *tutti::comm::Access::impl(ctx.comm);
  const bool uniform = impl.topology().uniform();
  Hierarchy& h = impl.caller_hierarchy();
  try {
    return uniform ? by_ranges(ctx, h, std::move(mine), cost) : by_leaders(ctx, h, std::move(mine), cost);
  } catch (const Error& error) {
    // A step failed here, where this rank's host peers may wait for it in a step of their own (the
    // host's allgather while this rank's step across hosts failed): the pair and the communicator
    // fail on every rank, at once rather than at each waiting rank's timeout.
    h.abort(error);
    impl.abort_transport(error);
    throw;
  }
}

}  // namespace tutti::sparse::detail
