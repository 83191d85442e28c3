// sparse_allreduce and sparse_allgather: the local checks, the descriptor exchange that makes
// every rank agree (or raise the same error), the algorithm choice, and the result's form.
#include <array>
#include <string>
#include <utility>

#include "comm/access.hpp"
#include "comm/comm_impl.hpp"
#include "comm/tuning.hpp"
#include "reduce/reduce.hpp"
#include "sparse/algorithms.hpp"
#include "sparse/allocation.hpp"
#include "sparse/cost_model.hpp"
#include "sparse/stages.hpp"

namespace tutti::sparse::detail {

namespace {

// What each rank announces before any data moves (u64 fields, exchanged by one allgather).
enum Field { f_status, f_dim, f_index_type, f_value_type, f_op, f_algorithm, f_form, f_nnz, f_count };
using Descriptor = std::array<std::uint64_t, f_count>;

const char* field_name(int f) {
  static constexpr const char* names[] = {"status", "dim",       "index type", "value type",
                                          "op",     "algorithm", "form",       "nnz"};
  return names[f];
}

std::string prefix(const char* operation, int rank) {
  return std::string(operation) + " (rank " + std::to_string(rank) + "): ";
}

void check_options(const Options& options, ReduceOp op, bool gather, const char* operation, int rank) {
  const auto bad = [&](const char* what) { throw Error(ErrorCode::invalid_argument, prefix(operation, rank) + what); };
  if (static_cast<int>(op) < 0 || static_cast<int>(op) > static_cast<int>(ReduceOp::avg)) bad("invalid op");
  if (static_cast<int>(options.algorithm) < 0 ||
      static_cast<int>(options.algorithm) > static_cast<int>(Algorithm::hierarchical))
    bad("invalid algorithm");
  if (static_cast<int>(options.form) < 0 || static_cast<int>(options.form) > static_cast<int>(Form::dense))
    bad("invalid form");
  if (options.timeout.count() < 0) bad("negative timeout");
  if (gather && (options.algorithm != Algorithm::automatic || options.form != Form::automatic))
    bad("sparse_allgather takes neither an algorithm nor a form");
}

// Exchanges the descriptors; every rank raises the same error for a bad input (invalid_argument
// naming the rank) or a disagreement (mismatch naming both ranks and the field).
std::vector<Descriptor> agree(tutti::Communicator& comm, const Descriptor& mine, const std::string& local_error,
                              const tutti::Options& options, const char* operation) {
  const int p = comm.size(), rank = comm.rank();
  std::vector<Descriptor> all(p);
  comm.allgather(mine.data(), all.data(), f_count, DataType::u64, options);
  // A rank's own bad input first: its message says what is wrong with it.
  if (all[rank][f_status] != 0) throw Error(ErrorCode::invalid_argument, local_error);
  for (int r = 0; r < p; ++r)
    if (all[r][f_status] != 0) {
      throw Error(ErrorCode::invalid_argument, prefix(operation, rank) + "rank " + std::to_string(r) +
                                                   " passed an invalid input; nothing was reduced");
    }
  for (int r = 1; r < p; ++r)
    for (int f = f_dim; f < f_nnz; ++f)
      if (all[r][f] != all[0][f])
        throw Error(ErrorCode::mismatch, prefix(operation, rank) + "rank " + std::to_string(r) + " has " +
                                             field_name(f) + " " + std::to_string(all[r][f]) + ", rank 0 " +
                                             std::to_string(all[0][f]));
  for (int r = 0; r < p; ++r)
    if (all[r][f_nnz] > all[0][f_dim])
      throw Error(ErrorCode::invalid_argument, prefix(operation, rank) + "rank " + std::to_string(r) + " announced " +
                                                   std::to_string(all[r][f_nnz]) + " pairs, more than dim");
  return all;
}

struct Prepared {
  Piece mine;
  bool deferred = false;  // the input is canonical: mine left empty (agree_allreduce's defer)
  std::vector<Descriptor> all;
};

tutti::Options collective_options(const Options& options) {
  tutti::Options out;
  out.timeout = options.timeout;
  return out;
}

// Local checks, canonical form and the exchange, shared by both collectives.
Prepared prepare(tutti::Communicator& comm, const Vector& input, ReduceOp op, const Options& options, bool gather,
                 const char* operation, bool defer = false) {
  if (comm.size() < 1) throw Error(ErrorCode::invalid_argument, std::string(operation) + ": empty communicator");
  const int rank = comm.rank();
  Descriptor d{};
  std::string local_error;
  Prepared out;
  try {
    check_options(options, op, gather, operation, rank);
    const bool sorted = check_input(input, operation, rank);
    out.deferred = defer && sorted;
    const Layout layout = layout_of(input.dim, input.index_type, input.value_type);
    // A forced dense vector is refused here, on every rank and before anything moves, where it
    // cannot fit (an automatic form goes dense only where the pairs alone are about as large).
    if (!gather && (options.form == Form::dense || options.algorithm == Algorithm::dense_allreduce))
      check_allocation(input.dim, layout.value_bytes, "the dense vector", operation, rank);
    if (!out.deferred) out.mine = sorted ? copy_canonical(input, layout) : canonical(input, op, layout);
  } catch (const Error& e) {
    if (e.code() != ErrorCode::invalid_argument) throw;
    local_error = e.what();
    d[f_status] = 1;
  }
  d[f_dim] = input.dim;
  d[f_index_type] = static_cast<std::uint64_t>(input.index_type);
  d[f_value_type] = static_cast<std::uint64_t>(input.value_type);
  d[f_op] = static_cast<std::uint64_t>(op);
  d[f_algorithm] = static_cast<std::uint64_t>(options.algorithm);
  d[f_form] = static_cast<std::uint64_t>(options.form);
  d[f_nnz] = out.deferred ? input.nnz : out.mine.nnz();
  out.all = agree(comm, d, local_error, collective_options(options), operation);
  return out;
}

Context context_of(tutti::Communicator& comm, const Vector& input, ReduceOp op, const Options& options,
                   const std::vector<Descriptor>& all, const char* operation) {
  Context ctx(comm);
  ctx.rank = comm.rank();
  ctx.size = comm.size();
  ctx.layout = layout_of(input.dim, input.index_type, input.value_type);
  ctx.op = op == ReduceOp::avg ? ReduceOp::sum : op;
  ctx.form = options.form;
  ctx.collective_options = collective_options(options);
  ctx.operation = operation;
  for (const Descriptor& d : all) ctx.nnz.push_back(static_cast<std::size_t>(d[f_nnz]));
  return ctx;
}

Workload workload_of(const Context& ctx) {
  Workload w;
  w.ranks = ctx.size;
  w.dim = ctx.layout.dim;
  w.index_bytes = ctx.layout.index_bytes;
  w.value_bytes = ctx.layout.value_bytes;
  w.form = ctx.form;
  for (std::size_t n : ctx.nnz) {
    w.total_nnz += n;
    w.max_nnz = std::max(w.max_nnz, n);
  }
  return w;
}

// The transport's calibrated cost model where the tuning file has one (tutti-bench --calibrate
// measures a link's real rate, which the defaults cannot know), else the defaults.
CostParams cost_of(std::string_view transport, tutti::transport::Kind kind) {
  tutti::comm::choice::load_from_environment();
  return tutti::comm::choice::cost_for(transport, kind);
}

// The cost model of the communicator's own transport (tcp's where it has none).
CostParams transport_cost(const Context& ctx) {
  const auto* impl = tutti::comm::Access::impl(ctx.comm);
  return impl ? cost_of(impl->transport_name(), impl->transport_kind()) : cost_of("tcp", tutti::transport::Kind::tcp);
}

Algorithm chosen(const Context& ctx, const Options& options) {
  if (options.algorithm != Algorithm::automatic) return options.algorithm;
  Workload w = workload_of(ctx);
  if (ctx.size > 1 && w.total_nnz > 0) {  // where the ranks live (collective the first time; cached)
    const tutti::comm::Topology& topology = tutti::comm::Access::impl(ctx.comm)->topology();
    if (topology.uniform()) {
      w.hosts = topology.host_count();
      w.local_size = topology.max_local_size();
      w.local_cost = cost_of("shm", tutti::transport::Kind::shm);
    }
  }
  return choose(w, transport_cost(ctx));
}

}  // namespace

Algorithm choose_flat(const Context& ctx, const CostParams& cost) { return choose(workload_of(ctx), cost); }

Piece run_flat(Context& ctx, Algorithm algorithm, Piece mine) {
  switch (algorithm) {
    case Algorithm::ssar_recursive_doubling:
      return recursive_doubling(ctx, std::move(mine));
    case Algorithm::ssar_split_allgather:
    case Algorithm::dsar_split_allgather:
      return split_allgather(ctx, std::move(mine), algorithm == Algorithm::dsar_split_allgather);
    case Algorithm::dense_allreduce:
      return dense_allreduce(ctx, as_vector(mine, ctx.layout));
    default:
      return allgather_merge(ctx, std::move(mine));
  }
}

Agreed agree_allreduce(tutti::Communicator& comm, const Vector& input, ReduceOp op, const Options& options,
                       const char* operation, bool defer) {
  Prepared prepared = prepare(comm, input, op, options, false, operation, defer);
  Context ctx = context_of(comm, input, op, options, prepared.all, operation);
  return {std::move(prepared.mine), prepared.deferred, std::move(ctx)};
}

Piece take_mine(Agreed& agreed, const Vector& input) {
  if (agreed.deferred) {
    agreed.mine = copy_canonical(input, agreed.ctx.layout);  // deferred only when is_canonical held
    agreed.deferred = false;
  }
  return std::move(agreed.mine);
}

Result result_of(Piece merged, Context& ctx, ReduceOp op, Algorithm algorithm) {
  // The union only grows, so a piece that went dense mid-way is dense by the rule at the end too.
  const bool dense = merged.dense || ctx.form == Form::dense ||
                     (ctx.form == Form::automatic && ctx.layout.dense_is_smaller(merged.nnz()));
  if (dense && !merged.dense) merged = densify(std::move(merged), ctx.layout, ctx.zeroed_dense());
  Result result;
  if (!dense) {
    result.indices = std::move(ctx.spare_indices);
    result.indices.clear();
  }
  result.form = dense ? Form::dense : Form::sparse;
  result.dim = ctx.layout.dim;
  result.index_type = ctx.layout.index_type;
  result.value_type = ctx.layout.value_type;
  result.algorithm = algorithm;
  result.nnz = dense ? ctx.layout.dim : merged.nnz();
  if (!dense) append_indices(merged, 0, merged.nnz(), ctx.layout, result.indices);
  result.values = std::move(merged.values);
  if (op == ReduceOp::avg && result.nnz > 0)
    reduce::divide(ctx.layout.value_type, result.values.data(), result.nnz, ctx.size);
  return result;
}

}  // namespace tutti::sparse::detail

namespace tutti {

using namespace sparse::detail;

sparse::Result sparse_allreduce(Communicator& comm, const sparse::Vector& input, ReduceOp op,
                                const sparse::Options& options) {
  return sparse_allreduce(comm, input, op, options, sparse::Result{});
}

sparse::Result sparse_allreduce(Communicator& comm, const sparse::Vector& input, ReduceOp op,
                                const sparse::Options& options, sparse::Result&& recycled) {
  const char* operation = "sparse_allreduce";
  sparse::Result spare = std::exchange(recycled, {});  // left empty whatever the call raises
  // Deferred: a canonical input is copied only by the algorithms that ship pieces; the dense
  // allreduce scatters it into its dense vector directly (large vectors spend most of their time
  // faulting in fresh pages, so every copy avoided counts).
  Agreed prepared = agree_allreduce(comm, input, op, options, operation, true);
  Context& ctx = prepared.ctx;
  ctx.spare_values = std::move(spare.values);
  ctx.spare_indices = std::move(spare.indices);
  const sparse::Algorithm algorithm = chosen(ctx, options);
  // hierarchical where one rank's pairs alone outweigh the dense vector: the dense allreduce,
  // itself hierarchical across hosts (src/sparse/hierarchical.cpp says why).
  const bool dense_way = algorithm == sparse::Algorithm::dense_allreduce ||
                         (algorithm == sparse::Algorithm::hierarchical && ctx.pairs_outweigh_dense());
  Piece merged;
  if (dense_way && prepared.deferred)
    merged = dense_allreduce(ctx, input);
  else if (dense_way)
    merged = run_flat(ctx, sparse::Algorithm::dense_allreduce, take_mine(prepared, input));
  else if (algorithm == sparse::Algorithm::hierarchical)
    merged = hierarchical(ctx, take_mine(prepared, input), transport_cost(ctx));
  else
    merged = run_flat(ctx, algorithm, take_mine(prepared, input));
  return result_of(std::move(merged), ctx, op, algorithm);
}

sparse::GatherResult sparse_allgather(Communicator& comm, const sparse::Vector& input, ReduceOp op,
                                      const sparse::Options& options) {
  const char* operation = "sparse_allgather";
  Prepared prepared = prepare(comm, input, op, options, true, operation);
  Context ctx = context_of(comm, input, op, options, prepared.all, operation);
  std::vector<Piece> pieces;
  if (ctx.size == 1)
    pieces.push_back(std::move(prepared.mine));
  else
    pieces = allgather_pieces(ctx, prepared.mine);
  sparse::GatherResult result;
  result.dim = input.dim;
  result.index_type = input.index_type;
  result.value_type = input.value_type;
  result.offsets.push_back(0);
  for (const Piece& piece : pieces) {
    append_indices(piece, 0, piece.nnz(), ctx.layout, result.indices);
    result.values.insert(result.values.end(), piece.values.begin(), piece.values.end());
    result.offsets.push_back(result.offsets.back() + piece.nnz());
  }
  return result;
}

std::string_view to_string(sparse::Algorithm algorithm) {
  switch (algorithm) {
    case sparse::Algorithm::automatic:
      return "automatic";
    case sparse::Algorithm::ssar_recursive_doubling:
      return "ssar_recursive_doubling";
    case sparse::Algorithm::ssar_split_allgather:
      return "ssar_split_allgather";
    case sparse::Algorithm::dsar_split_allgather:
      return "dsar_split_allgather";
    case sparse::Algorithm::allgather:
      return "allgather";
    case sparse::Algorithm::dense_allreduce:
      return "dense_allreduce";
    case sparse::Algorithm::hierarchical:
      return "hierarchical";
  }
  return "unknown";
}

std::string_view to_string(sparse::Form form) {
  switch (form) {
    case sparse::Form::automatic:
      return "automatic";
    case sparse::Form::sparse:
      return "sparse";
    case sparse::Form::dense:
      return "dense";
  }
  return "unknown";
}

}  // namespace tutti
