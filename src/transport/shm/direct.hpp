// Shared-memory ("direct") collectives: the ranks of a communicator exchange data through the
// segment's data area and meet at barriers, instead of sending messages. They are resumable, so
// that the progress engine runs them like any other operation, without blocking.
#pragma once

#include <chrono>
#include <cstddef>
#include <memory>
#include <optional>
#include <string_view>
#include <vector>

#include "transport/cost.hpp"
#include "transport/transport.hpp"

namespace tutti::transport::shm {

/// The shape of the direct algorithms, which direct_price prices: an
/// allreduce of at most `small_allreduce_bytes` runs in one step (every rank reduces all parts);
/// from `streaming_bytes` of results on all ranks together (about a last-level cache), an
/// out-of-place allreduce or allgather and a broadcast's receivers write them with stores that
/// bypass the cache (sparing a read of every destination line before it is written); below, where
/// results stay in the cache, ordinary stores are faster. Where each threshold here comes from:
/// docs/performance.md, "Where the shared-memory thresholds come from".
inline constexpr std::size_t small_allreduce_bytes = 16 * 1024;
/// An allgather, alltoall, gather or scatter block and a broadcast of at least this many bytes
/// are read by each rank straight from the peers' buffers (process_vm_readv), where the segment
/// allows it (Segment::single_copy), into the result (one copy instead of two), only where the
/// segment's probe found that faster than the data sets, where every rank copies in and out at
/// once, chunk after chunk (Segment::single_copy_collectives: which wins depends on the machine,
/// docs/performance.md); then an allgather in place at every size and out of place while its
/// result is under single_copy_allgather_limit (from which the data sets' streaming stores win),
/// the others always (a broadcast whose root does not push a share, which only a run outside a
/// communicator does, under single_copy_broadcast_limit, from which the data sets' pipelining
/// wins). Where ranks outnumber cores (Segment::crowded), only an alltoall, and a scatter
/// block from crowded_scatter_bytes: the others measured slower read straight from the peers there.
/// (A reduce_scatter reads no peer's buffer: reading 16-64 KiB blocks into a scratch piece to
/// reduce from measured 1.2-1.55x slower than the data sets once there were four of them,
/// docs/performance.md, 2026-12-05.)
inline constexpr std::size_t single_copy_bytes = 16 * 1024;
inline constexpr std::size_t crowded_scatter_bytes = 128 * 1024;
/// A reduce's root whose chunk holds at most this many bytes copies each peer's part of the data
/// set into a scratch piece before it reduces from it: reducing straight from the lines a peer
/// has just written measured slower there (0.63-0.74 of OpenMPI at 32 and 64 KiB against
/// 0.81-0.90 staged), and faster beyond (docs/performance.md).
inline constexpr std::size_t staged_reduce_bytes = 64 * 1024;
/// An alltoall that every rank runs in place reads straight from the peers (single copy) only from
/// this much input per rank, and where ranks have a core each: single copy must first copy aside
/// the blocks its peers still read (snapshot_blocks), and the two copies through the data sets
/// measured faster below (p = 2: 32 KiB-8 MiB of input, 1.3-2.2 times; four ranks on two cores:
/// 256 KiB-16 MiB, 1.3-2 times; docs/performance.md, 2026-12-07, night).
inline constexpr std::size_t in_place_alltoall_single_copy_bytes = std::size_t{16} << 20;
/// (512 KiB: with four data sets a broadcast through them measured 1.6x faster there than single
/// copy read whole by the receiver at p = 2, level at 256 KiB, slower below; docs/performance.md,
/// 2026-12-05, later. With the root writing a share while the receivers read the rest, single
/// copy measured 1.5-4x faster than the sets at every size from 256 KiB to 16 MiB: 2026-12-07.)
inline constexpr std::size_t single_copy_broadcast_limit = 512 * 1024;
/// A broadcast by single copy of at least this many bytes has its root write a 1/p share of the
/// buffer into every receiver while they read the rest (each rank moves (p - 1)/p of it, at once);
/// below, the receivers read it whole: at p = 2 the two halves' copies measured slower at 16 KiB
/// (2.7-2.9 against 2.3 us), level at 32 KiB and faster from 64 KiB (docs/performance.md,
/// 2026-12-07, late night).
inline constexpr std::size_t shared_broadcast_bytes = 64 * 1024;
/// (64 MiB of result per rank: at p = 2 single copy measured 1.3x faster than the data sets at 32
/// MiB, level at 64 and the sets 1.3x faster at 128, where they write results with streaming
/// stores; in place the sets write without them, and single copy measured 1.2-2x faster at every
/// size from 16 to 128 MiB; docs/performance.md, 2026-12-07, late night.)
inline constexpr std::size_t single_copy_allgather_limit = std::size_t{64} << 20;
inline constexpr std::size_t streaming_bytes = std::size_t{32} << 20;
/// A collective of at least this many bytes (its input or its result, whichever is larger)
/// whose buffers that peers read are SharedBuffer memory on every rank runs zero copy, where the
/// segment allows single copy (the same permission to reach a peer's memory): an allreduce reduces
/// each rank's slice straight from every input into its result, then copies the other slices
/// from the peers' results (three barriers, no data set); a reduce_scatter reduces its block from
/// every input, an allgather copies every peer's block from its input, a broadcast the root's
/// buffer (two barriers). Nothing is copied into the segment and out again. Below 16 KiB the small
/// and inline paths are faster.
inline constexpr std::size_t zero_copy_bytes = 16 * 1024;

/// Whether the input of collective `kind` holds p blocks, one per rank (reduce_scatter, alltoall),
/// rather than one.
inline bool input_blocks(Collective kind) { return kind == Collective::reduce_scatter || kind == Collective::alltoall; }

/// Whether the result of collective `kind` holds p blocks, one per rank (allgather, alltoall),
/// rather than one. (A gather's root's and an allgatherv's result hold p blocks too, but gathered
/// apart: see DirectRun.)
inline bool output_blocks(Collective kind) { return kind == Collective::allgather || kind == Collective::alltoall; }

/// Whether rank `r`'s direct collective reads what rank `q` (another rank) published: a barrier
/// every rank's signature, though it carries no bytes; otherwise nothing for a call of no
/// elements (`elements`: the call's on all ranks together), a broadcast's or a scatter's
/// receivers only the root's input, a gather and a reduce only at the root (every rank's), the
/// others every rank's.
inline bool reads_from(Collective kind, int q, int r, int root, std::size_t elements) {
  if (kind == Collective::barrier) return true;
  if (elements == 0) return false;
  if (kind == Collective::broadcast || kind == Collective::scatter) return q == root && r != root;
  if (kind == Collective::gather || kind == Collective::reduce) return r == root;
  return true;
}

/// Whether rank `r` of `p` reads any other rank's publication (reads_from for some q != r).
inline bool reads_any(Collective kind, int r, int root, std::size_t elements, int p) {
  if (p < 2) return false;
  if (kind == Collective::broadcast || kind == Collective::scatter) return elements > 0 && r != root;
  return reads_from(kind, r == 0 ? 1 : 0, r, root, elements);  // the others read every peer or none
}

/// One direct collective in progress on this rank. `progress` runs every step whose barrier all
/// ranks have reached, without blocking; it throws Error(timeout) naming the ranks still awaited
/// once it has waited its timeout (counted from its first wait), Error(peer_failure) if one of them died, or the
/// communicator's error if it was aborted; every error aborts the communicator first, so that the other ranks wake and
/// fail too. At most one runs per communicator at a time, in issue order.
using DirectCollective = NativeCollective;

/// Prepares collective `kind` over the shared-memory segment of `transport` (nothing moves until
/// the first `progress`). Returns null if `transport` is not a shared-memory transport.
/// Kinds, with counts in elements of `type` (in place: the forms of NativeCall, transport/in_place.hpp):
///   allreduce       send, recv: count elements; op required (avg = sum / size)
///   reduce          send: count; recv (root only): count, the reduction; op required
///   reduce_scatter  send: size * count, recv: count (block `rank`); op required
///   allgather       send: count, recv: size * count
///   allgatherv      send: count (= counts[rank]), recv: the sum of counts, blocks packed in rank order
///   alltoall        send, recv: size * count (block q of send goes to rank q's block `rank`)
///   alltoallv       send: counts[q] elements for rank q, recv: recv_counts[q] from rank q, packed
///                   in rank order (single-copy segments only)
///   broadcast       recv (== send) of `root`, count elements, to every rank
///   gather          send: count; recv (root only): size * count
///   scatter         send (root only): size * count; recv: count (block `rank` of the root's)
///   barrier         no buffers: returns once every rank has started it
/// Every rank must start the same collectives in the same order with the same arguments.
/// Errors: Error(unsupported) for another kind or too many ranks for the data area;
/// Error(invalid_argument) for a missing op or a bad root.
std::unique_ptr<DirectCollective> start_direct(Transport& transport, const NativeCall& call,
                                               std::chrono::milliseconds timeout);

/// Whether the direct algorithms serve collective `kind` (every collective; alltoallv only where
/// the segment allows single copy: ShmTransport::serves_natively). Inline: every small direct call asks.
inline bool serves(Collective /*kind*/) { return true; }

/// Predicted seconds of the direct algorithm for `collective` (one it serves) on `p` ranks, for a
/// call of `bytes` (the total over ranks where the call has a block per rank: comm's
/// bytes_are_total), from its copies, barriers and reductions under `cost` (transport/cost.hpp's
/// native_price asks).
double direct_price(Collective collective, int p, std::size_t bytes, const CostParams& cost);

/// Whether `transport` is a shared-memory transport (the direct algorithms serve only those).
bool is_shm(const Transport& transport);

}  // namespace tutti::transport::shm
