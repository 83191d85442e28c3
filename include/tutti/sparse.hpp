// Sparse collectives (SparCML, Renggli et al. 2019): allreduce and allgather of sparse vectors
// given as (index, value) pairs, whose result comes back sparse (sorted unique indices with
// values) or dense (`dim` values), whichever is smaller. docs/sparse.md describes the algorithms.
//
// Meaning. Rank r's input stands for the dense vector x_r of `dim` elements that is zero except
// at its indices; a duplicate index within one rank's input is combined with the op (in input
// order). sparse_allreduce computes y[i] = op over ranks of x_r[i], zeros included: with min, max
// or prod an index that some rank does not hold combines with 0, exactly as a dense allreduce of
// the x_r would. Each algorithm combines the ranks in an order of its own (the same on every
// rank). ReduceOp::avg is the sum divided by size() (integers truncate toward zero), as the dense
// allreduce does.
//
// Contract of every call below (collective over `comm`: every rank calls it, in the same order
// as its other calls on `comm`):
// - Before anything is sent, every rank checks its own input (a null pointer with nnz > 0, an
//   index >= dim, an invalid enum) and the ranks exchange a small descriptor (dim, index type,
//   value type, op, algorithm, form, nnz). A rank whose input is bad raises
//   Error(invalid_argument) naming it; every other rank raises invalid_argument naming that rank.
//   Ranks that disagree on dim, index type, value type, op, algorithm or form raise
//   Error(mismatch) on every rank. Nothing is written to any output then.
// - Every rank's result is identical, bit for bit (values are combined in a fixed order).
// - Failures of the transport (timeout, peer_failure, ...) are raised as the host API does.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <future>
#include <memory>
#include <span>
#include <vector>

#include "tutti/tutti.hpp"

namespace tutti::sparse {

enum class IndexType { u32, u64 };

/// How sparse_allreduce moves the data (docs/sparse.md). `automatic` picks by a cost model
/// over p, dim, the total and largest nnz and the expected overlap of the ranks' index sets.
/// Every algorithm gives the form asked for (SparCML's rule under Form::automatic).
enum class Algorithm {
  automatic,
  ssar_recursive_doubling,  // pairwise merges in log2(p) rounds; dense mid-way past the threshold
  ssar_split_allgather,     // sparse reduce-scatter of p index ranges, then sparse allgather
  dsar_split_allgather,     // the same, then a dense allgather of the ranges once the result is dense
  allgather,                // every rank's pairs to every rank, merged locally (Horovod's way)
  dense_allreduce,          // densify, then the dense Communicator::allreduce; where the result may be
                            // sparse, the ranks' index bitmaps gathered too and the union picked out
  hierarchical,             // across hosts (tutti/topology.hpp): merged inside each host first, so
                            // a host's link carries its union once, not each of its ranks' pairs
};

/// The form of a result. `automatic`: dense iff nnz·(c_i + c_v) >= dim·c_v for the merged
/// vector (c_i, c_v: bytes of one index and one value), SparCML's rule; otherwise forced.
enum class Form { automatic, sparse, dense };

/// One rank's input: `nnz` pairs (indices[k], values[k]) of a vector of dimension `dim`, in any
/// order. `indices` holds `nnz` u32 or u64 (index_type), `values` `nnz` elements of value_type.
struct Vector {
  std::size_t dim = 0;
  std::size_t nnz = 0;
  const void* indices = nullptr;
  IndexType index_type = IndexType::u32;
  const void* values = nullptr;
  DataType value_type = DataType::f32;
};

struct Options {
  Algorithm algorithm = Algorithm::automatic;
  Form form = Form::automatic;
  /// Deadline of each collective step; 0 = the communicator's default (TUTTI_TIMEOUT_MS). The
  /// point-to-point steps of ssar_recursive_doubling always have the communicator's default.
  std::chrono::milliseconds timeout{0};
};

/// The result of sparse_allreduce. Sparse: `indices` holds nnz sorted unique indices (of
/// index_type) — exactly the union of the ranks' input indices — and `values` their nnz values.
/// Dense: `indices` is empty, nnz == dim and `values` holds all dim values.
struct Result {
  Form form = Form::sparse;  // sparse or dense, never automatic
  std::size_t dim = 0;
  std::size_t nnz = 0;
  IndexType index_type = IndexType::u32;
  DataType value_type = DataType::f32;
  Algorithm algorithm = Algorithm::automatic;  // the algorithm that ran
  std::vector<std::byte> indices;
  std::vector<std::byte> values;

  template <class T>
  std::span<const T> values_as() const {
    return {reinterpret_cast<const T*>(values.data()), values.size() / sizeof(T)};
  }
  template <class I>
  std::span<const I> indices_as() const {
    return {reinterpret_cast<const I*>(indices.data()), indices.size() / sizeof(I)};
  }
};

/// The result of sparse_allgather: every rank's pairs, in rank order. Block r (pairs
/// offsets[r] to offsets[r + 1]) is rank r's input sorted by index, its duplicate indices
/// combined with the op; `indices` and `values` hold the blocks back to back (offsets has
/// size() + 1 entries). Nothing is combined across ranks.
struct GatherResult {
  std::size_t dim = 0;
  IndexType index_type = IndexType::u32;
  DataType value_type = DataType::f32;
  std::vector<std::size_t> offsets;
  std::vector<std::byte> indices;
  std::vector<std::byte> values;
};

}  // namespace tutti::sparse

namespace tutti {

/// y = op over ranks of the ranks' sparse vectors (the contract at the top of this file), on
/// every rank, sparse or dense by options.form. Runs on the caller's thread over `comm`.
/// Errors: invalid_argument, mismatch (above); Error(unsupported) never (every op and type serve).
sparse::Result sparse_allreduce(Communicator& comm, const sparse::Vector& input, ReduceOp op,
                                const sparse::Options& options = {});

/// sparse_allreduce, reusing the storage of `recycled`: a Result the caller is done with (the
/// previous step's, typically). The call takes its buffers over where they are large enough, so a
/// loop that hands each step's result back allocates no dense vector after the first step: a
/// fresh zeroed vector of 64 MiB costs tens of milliseconds of page faults, zeroing a reused one a
/// few. `recycled` is moved from at the start (left empty, its contents never read), whatever
/// the call then raises.
///   result = tutti::sparse_allreduce(comm, input, ReduceOp::sum, {}, std::move(result));
sparse::Result sparse_allreduce(Communicator& comm, const sparse::Vector& input, ReduceOp op,
                                const sparse::Options& options, sparse::Result&& recycled);

/// Every rank's pairs in rank order (sparse::GatherResult). options.algorithm and options.form
/// must be automatic (Error(invalid_argument) otherwise): the result is a list of blocks.
sparse::GatherResult sparse_allgather(Communicator& comm, const sparse::Vector& input, ReduceOp op,
                                      const sparse::Options& options = {});

namespace sparse {

namespace detail {
class Queue;
}

/// The handle of a nonblocking sparse call. wait() delivers the result once (a second wait()
/// raises Error(invalid_argument)); test() says whether it is ready without blocking. The
/// call's error, if any, is raised by wait().
template <class R>
class Request {
 public:
  Request() = default;
  explicit Request(std::future<R> future) : future_(std::move(future)) {}
  /// Blocks until done; returns the result or raises the call's Error.
  R wait() {
    if (!future_.valid()) throw Error(ErrorCode::invalid_argument, "sparse request: no result (already waited for)");
    return future_.get();
  }
  /// True once wait() would not block.
  bool test() const {
    return future_.valid() && future_.wait_for(std::chrono::seconds(0)) == std::future_status::ready;
  }

 private:
  std::future<R> future_;
};

/// Nonblocking sparse collectives over `host`: the constructor (collective over `host`) splits
/// a private duplicate of it that only this object's progress thread uses, so `host` stays free
/// for its own calls and a sparse call proceeds while the caller computes. Calls run one after
/// the other in issue order on every rank (issue them in the same order everywhere). The input
/// buffers must stay valid until the request completes. One thread at a time issues calls.
class Communicator {
 public:
  explicit Communicator(tutti::Communicator& host);
  /// Runs every call already issued (each bounded by its timeout), then stops the thread.
  ~Communicator();
  /// A moved-from object only accepts destruction and assignment (calls raise invalid_argument).
  Communicator(Communicator&&) noexcept;
  Communicator& operator=(Communicator&&) noexcept;

  int rank() const;
  int size() const;

  /// sparse_allreduce, on the progress thread.
  Request<Result> iallreduce(const Vector& input, ReduceOp op, const Options& options = {});
  /// The same, reusing `recycled`'s storage (tutti::sparse_allreduce's overload that takes one).
  Request<Result> iallreduce(const Vector& input, ReduceOp op, const Options& options, Result&& recycled);
  /// sparse_allgather, on the progress thread.
  Request<GatherResult> iallgather(const Vector& input, ReduceOp op, const Options& options = {});
  /// Blocking twins: iallreduce(...).wait(), ordered after the calls issued before.
  Result allreduce(const Vector& input, ReduceOp op, const Options& options = {});
  Result allreduce(const Vector& input, ReduceOp op, const Options& options, Result&& recycled);
  GatherResult allgather(const Vector& input, ReduceOp op, const Options& options = {});

 private:
  detail::Queue& checked() const;  // Error(invalid_argument) on a moved-from object
  std::unique_ptr<detail::Queue> queue_;
};

}  // namespace sparse

std::string_view to_string(sparse::Algorithm algorithm);
std::string_view to_string(sparse::Form form);

}  // namespace tutti
