// The QSGD sparse allreduce: exact indices, values quantized once by their own rank, exchanged the
// allgather way. The sparse layer's own stages (sparse/stages.hpp) do the checks, the canonical
// form, the descriptor exchange and the result's form, so the errors and the dense switch are
// those of sparse_allreduce; what is QSGD's own here is the agreement on the codec's options, the
// wire block and the decoding.
#include <array>
#include <cstring>
#include <string>
#include <vector>

#include "sparse/stages.hpp"
#include "tutti/compress.hpp"

namespace tutti::compress {

namespace {

namespace sd = sparse::detail;

constexpr const char* kOperation = "compress::qsgd_sparse_allreduce";

std::string prefix(int rank) { return std::string(kOperation) + " (rank " + std::to_string(rank) + "): "; }

// What the sparse descriptor does not cover: f32 values, sum or avg, the allgather way, and the
// codec's options (bits 4 or 8, a bucket size). Raises invalid_argument naming the rank.
void check_local(const sparse::Vector& input, const QsgdOptions& options, ReduceOp op,
                 const sparse::Options& sparse_options, int rank) {
  const auto bad = [&](const std::string& what) { throw Error(ErrorCode::invalid_argument, prefix(rank) + what); };
  if (op != ReduceOp::sum && op != ReduceOp::avg) bad("op must be sum or avg");
  if (input.value_type != DataType::f32) bad("values must be f32");
  if (sparse_options.algorithm != sparse::Algorithm::automatic &&
      sparse_options.algorithm != sparse::Algorithm::allgather)
    bad("the algorithm must be automatic or allgather");
  try {
    qsgd_encoded_bytes(0, options);
  } catch (const Error& e) {
    bad(e.what());
  }
}

// The codec's options must be the same on every rank: they fix every block's length. One small
// allgather, before the sparse descriptors, so that a bad or disagreeing option raises the same
// error on every rank (invalid_argument naming the rank, or mismatch) and nothing moves.
void agree_on_codec(Communicator& comm, const sparse::Vector& input, const QsgdOptions& options, ReduceOp op,
                    const sparse::Options& sparse_options) {
  enum { status, bits, bucket, fields };
  const int p = comm.size(), rank = comm.rank();
  std::string local_error;
  try {
    check_local(input, options, op, sparse_options, rank);
  } catch (const Error& e) {
    local_error = e.what();
  }
  const std::array<std::uint64_t, fields> mine{local_error.empty() ? 0u : 1u, static_cast<std::uint64_t>(options.bits),
                                               options.bucket_size};
  std::vector<std::array<std::uint64_t, fields>> all(static_cast<std::size_t>(p));
  tutti::Options collective;
  collective.timeout = sparse_options.timeout;
  comm.allgather(mine.data(), all.data(), fields, DataType::u64, collective);
  if (!local_error.empty()) throw Error(ErrorCode::invalid_argument, local_error);
  for (int r = 0; r < p; ++r)
    if (all[r][status] != 0)
      throw Error(ErrorCode::invalid_argument,
                  prefix(rank) + "rank " + std::to_string(r) + " passed an invalid input; nothing was reduced");
  for (int r = 1; r < p; ++r)
    if (all[r][bits] != all[0][bits] || all[r][bucket] != all[0][bucket])
      throw Error(ErrorCode::mismatch,
                  prefix(rank) + "rank " + std::to_string(r) + " has bits " + std::to_string(all[r][bits]) +
                      " and bucket size " + std::to_string(all[r][bucket]) + ", rank 0 bits " +
                      std::to_string(all[0][bits]) + " and bucket size " + std::to_string(all[0][bucket]));
}

// Rank r's block on the wire: its nnz indices in the index type, then qsgd_encode of its values.
std::size_t block_bytes(const sd::Layout& layout, std::size_t nnz, const QsgdOptions& options) {
  return nnz * layout.index_bytes + qsgd_encoded_bytes(nnz, options);
}

// Every rank's block, decoded into a sparse piece of f32 values, in rank order.
std::vector<sd::Piece> exchange(const sd::Context& ctx, const sd::Piece& mine, const QsgdOptions& options,
                                const RandomKey& key) {
  const sd::Layout& l = ctx.layout;
  std::vector<std::size_t> counts(static_cast<std::size_t>(ctx.size));
  std::size_t total = 0;
  // ctx.nnz was checked against dim when the descriptors were exchanged.
  for (int r = 0; r < ctx.size; ++r) total += counts[r] = block_bytes(l, ctx.nnz[r], options);
  std::vector<std::byte> send, recv(total);
  sd::append_indices(mine, 0, mine.nnz(), l, send);
  const std::size_t at = send.size();
  send.resize(at + qsgd_encoded_bytes(mine.nnz(), options));
  std::vector<float> values(mine.nnz());
  if (!values.empty()) std::memcpy(values.data(), mine.values.data(), mine.values.size());
  qsgd_encode(values.data(), values.size(), options, key, send.data() + at);
  ctx.comm.allgatherv(send.data(), send.size(), recv.data(), counts, DataType::u8, ctx.collective_options);
  // The indices alone are checked by the sparse layer's unpack, as pairs whose value has no bytes.
  sd::Layout indices_only = l;
  indices_only.value_bytes = 0;
  std::vector<sd::Piece> pieces(static_cast<std::size_t>(ctx.size));
  std::size_t offset = 0;
  for (int r = 0; r < ctx.size; ++r) {
    const std::size_t n = ctx.nnz[r], index_bytes = n * l.index_bytes;
    sd::Piece& piece = pieces[static_cast<std::size_t>(r)];
    piece = sd::unpack(std::span(recv).subspan(offset, index_bytes), 0, l.dim, indices_only,
                       prefix(ctx.rank) + "the indices from rank " + std::to_string(r));
    values.resize(n);
    qsgd_decode(recv.data() + offset + index_bytes, n, options, values.data());
    piece.values.resize(n * sizeof(float));
    if (n > 0) std::memcpy(piece.values.data(), values.data(), n * sizeof(float));
    offset += counts[r];
  }
  return pieces;
}

}  // namespace

sparse::Result qsgd_sparse_allreduce(Communicator& comm, const sparse::Vector& input, const QsgdOptions& options,
                                     const RandomKey& key, ReduceOp op, const sparse::Options& sparse_options) {
  if (comm.size() < 1) throw Error(ErrorCode::invalid_argument, std::string(kOperation) + ": empty communicator");
  agree_on_codec(comm, input, options, op, sparse_options);
  sparse::Options agreed_options = sparse_options;
  agreed_options.algorithm = sparse::Algorithm::allgather;
  sd::Agreed agreed = sd::agree_allreduce(comm, input, op, agreed_options, kOperation);
  RandomKey mine = key;
  mine.rank = static_cast<std::uint32_t>(comm.rank());
  std::vector<sd::Piece> pieces = exchange(agreed.ctx, agreed.mine, options, mine);
  // A balanced tree in rank order, the sparse layer's own (dense once a union passes the rule).
  sd::Piece merged = sd::merge_tree(std::move(pieces), ReduceOp::sum, agreed.ctx.layout, agreed.ctx.dense_from());
  return sd::result_of(std::move(merged), agreed.ctx, op, sparse::Algorithm::allgather);
}

}  // namespace tutti::compress
