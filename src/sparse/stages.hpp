// The two stages of sparse_allreduce that do not depend on how the pairs travel, for the layers
// above that move a sparse vector their own way (compress::qsgd_sparse_allreduce sends its values
// quantized): the checks, canonical form and descriptor exchange before any data moves, and the
// result's form after the merge. Using these keeps such a collective's errors and its dense
// switch those of sparse_allreduce.
#pragma once

#include "sparse/algorithms.hpp"

namespace tutti::sparse::detail {

/// This rank's canonical input and what every rank agreed on.
struct Agreed {
  Piece mine;             // empty while `deferred`
  bool deferred = false;  // the input was canonical already: `mine` not copied from it yet
  Context ctx;
};

/// sparse_allreduce's first stage (collective): checks this rank's input and options, puts the
/// input in canonical form (sorted, duplicates combined with `op`) and exchanges the descriptors.
/// Raises what tutti/sparse.hpp's contract says (invalid_argument naming the rank, mismatch) on
/// every rank before any data moves; `operation` names the call in the messages. With `defer`,
/// an input that is canonical already is not copied (Agreed::deferred; see take_mine): a dense
/// result can then be scattered from the caller's arrays directly.
Agreed agree_allreduce(tutti::Communicator& comm, const Vector& input, ReduceOp op, const Options& options,
                       const char* operation, bool defer = false);

/// agreed.mine, copied from `input` first if it was deferred.
Piece take_mine(Agreed& agreed, const Vector& input);

/// sparse_allreduce's last stage: the merged piece of every rank as a Result, dense if the piece
/// is, if ctx.form is dense, or by SparCML's rule under Form::automatic; avg divides by ctx.size.
/// `algorithm` is what the result reports as having run. Takes ctx's spare storage.
Result result_of(Piece merged, Context& ctx, ReduceOp op, Algorithm algorithm);

}  // namespace tutti::sparse::detail
