// The compressed dense allreduces. Both are built from the communicator's own collectives (so the
// algorithm choice, pipelining and error handling are the library's), and both end with every
// rank decoding the same encoded bytes in the same order, which is what makes the result
// bitwise identical on every rank.
#include <algorithm>
#include <string>
#include <vector>

#include "tutti/compress.hpp"
#include "tutti/sparse.hpp"

namespace tutti::compress {

namespace {

void check(Communicator& comm, const float* send, const float* recv, std::size_t count, ReduceOp op, const char* what) {
  if (op != ReduceOp::sum && op != ReduceOp::avg)
    throw Error(ErrorCode::invalid_argument,
                std::string(what) + " on rank " + std::to_string(comm.rank()) + ": op must be sum or avg");
  if (count > 0 && (send == nullptr || recv == nullptr))
    throw Error(ErrorCode::invalid_argument, std::string(what) + " on rank " + std::to_string(comm.rank()) +
                                                 ": null buffer with count " + std::to_string(count));
}

void finish(float* recv, std::size_t count, ReduceOp op, int size) {
  if (op != ReduceOp::avg) return;
  const float p = static_cast<float>(size);
  for (std::size_t i = 0; i < count; ++i) recv[i] /= p;
}

}  // namespace

void allreduce(Communicator& comm, const float* send, float* recv, std::size_t count, Wire wire, ReduceOp op) {
  check(comm, send, recv, count, op, "compress::allreduce");
  if (count == 0) return;
  const auto p = static_cast<std::size_t>(comm.size());
  const std::size_t block = (count + p - 1) / p;
  // The input rounded to 16 bits, padded with zeros to size() equal blocks.
  std::vector<std::uint16_t> all(block * p, 0);
  const bool fp16 = wire == Wire::fp16;
  (fp16 ? encode_fp16 : encode_bf16)(send, all.data(), count);
  // The 16-bit reduction kernels add in f32 and round the sum to nearest even: each step of the
  // reduce-scatter decodes, adds in f32 and re-encodes.
  const DataType type = fp16 ? DataType::f16 : DataType::bf16;
  std::vector<std::uint16_t> mine(block);
  comm.reduce_scatter(all.data(), mine.data(), block, type, ReduceOp::sum);
  comm.allgather(mine.data(), all.data(), block, type);
  (fp16 ? decode_fp16 : decode_bf16)(all.data(), recv, count);
  finish(recv, count, op, comm.size());
}

void qsgd_allreduce(Communicator& comm, const float* send, float* recv, std::size_t count, const QsgdOptions& options,
                    const RandomKey& key, ReduceOp op, float* sent) {
  check(comm, send, recv, count, op, "compress::qsgd_allreduce");
  const std::size_t bytes = qsgd_encoded_bytes(count, options);
  if (count == 0) return;
  const auto p = static_cast<std::size_t>(comm.size());
  std::vector<std::byte> all(bytes * p);
  const auto me = static_cast<std::size_t>(comm.rank());
  RandomKey mine = key;
  mine.rank = static_cast<std::uint32_t>(comm.rank());
  qsgd_encode(send, count, options, mine, all.data() + bytes * me);
  comm.allgather(all.data() + bytes * me, all.data(), bytes, DataType::u8);
  if (sent != nullptr) qsgd_decode(all.data() + bytes * me, count, options, sent);
  // Rank order, from the first rank's decoded vector, the same on every rank.
  qsgd_decode(all.data(), count, options, recv);
  for (std::size_t r = 1; r < p; ++r) qsgd_decode_add(all.data() + bytes * r, count, options, recv);
  finish(recv, count, op, comm.size());
}

std::size_t top_k_allreduce(Communicator& comm, const float* send, float* recv, std::size_t count, std::size_t k,
                            ReduceOp op, float* sent) {
  check(comm, send, recv, count, op, "compress::top_k_allreduce");
  std::vector<std::uint32_t> indices(k);
  top_k(send, count, k, indices.data(), nullptr);  // the values sent are read on the union below
  // The union of the ranks' choices: a sparse allreduce of the indices (a byte of 1 each; what it
  // adds up is not used), in its sparse form, so its result is exactly the union, sorted.
  const std::vector<std::uint8_t> ones(k, 1);
  const sparse::Vector chosen{count, k, indices.data(), sparse::IndexType::u32, ones.data(), DataType::u8};
  sparse::Options options;
  options.form = sparse::Form::sparse;
  const sparse::Result united = sparse_allreduce(comm, chosen, ReduceOp::sum, options);
  const auto at = united.indices_as<std::uint32_t>();
  // Every rank's values on the union, reduced as a dense vector: the same sorted indices on every
  // rank, so the vectors line up, and the result is the allreduce's, identical on every rank.
  std::vector<float> reduced(at.size());
  for (std::size_t j = 0; j < at.size(); ++j) reduced[j] = send[at[j]];
  if (sent != nullptr) {
    std::fill(sent, sent + count, 0.0f);
    for (std::size_t j = 0; j < at.size(); ++j) sent[at[j]] = reduced[j];
  }
  comm.allreduce(reduced.data(), reduced.data(), reduced.size(), DataType::f32, op);
  std::fill(recv, recv + count, 0.0f);
  for (std::size_t j = 0; j < at.size(); ++j) recv[at[j]] = reduced[j];
  return at.size();
}

}  // namespace tutti::compress
