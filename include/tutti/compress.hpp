// Gradient compression: codecs (fp16/bf16, QSGD, top-k, PowerSGD), error feedback, and the
// compressed allreduces built on them (docs/training.md, "Compression").
//
// Every compressed allreduce gives every rank the same bits: each rank decodes the same encoded
// messages and sums them in the same order. The randomness of QSGD comes from a counter-based
// generator keyed by (seed, rank, step, stream), so a run reproduces bit for bit.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "tutti/sparse.hpp"
#include "tutti/tutti.hpp"

namespace tutti::compress {

// ---- 16-bit floats ----

/// out[i] = in[i] as IEEE binary16 bits, rounded to nearest even (overflow gives inf, a NaN stays
/// a quiet NaN). The buffers must not overlap.
void encode_fp16(const float* in, std::uint16_t* out, std::size_t count);
/// out[i] = in[i], binary16 bits widened to f32 (exact).
void decode_fp16(const std::uint16_t* in, float* out, std::size_t count);
/// out[i] = in[i] as bfloat16 bits (the top half of the f32), rounded to nearest even.
void encode_bf16(const float* in, std::uint16_t* out, std::size_t count);
/// out[i] = in[i], bfloat16 bits widened to f32 (exact).
void decode_bf16(const std::uint16_t* in, float* out, std::size_t count);

/// The 16-bit type a dense compressed allreduce sends.
enum class Wire { fp16, bf16 };

// ---- randomness ----

/// The key of the counter-based generator: the same key and counter give the same number on any
/// machine. `stream` tells apart the tensors of one step (e.g. a hash of the tensor's name).
struct RandomKey {
  std::uint64_t seed = 0;
  std::uint32_t rank = 0;
  std::uint64_t step = 0;
  std::uint64_t stream = 0;
};

/// A uniform double in [0, 1) for (key, counter); 53 random bits.
double uniform(const RandomKey& key, std::uint64_t counter);

/// FNV-1a of `text`: a stream id that is the same in every process.
std::uint64_t stream_of(std::string_view text);

// ---- QSGD (Alistarh et al., 2017) ----

/// 8 bits: a sign and 127 levels; 4 bits: a sign and 7 levels. Each bucket of `bucket_size`
/// elements is quantized against its own L2 norm (sent as an f32).
struct QsgdOptions {
  int bits = 8;
  std::size_t bucket_size = 512;
};

/// s, the number of nonzero levels: 2^(bits-1) - 1. Error(invalid_argument) unless bits is 4 or 8.
int qsgd_levels(int bits);
/// Bytes of an encoded vector of `count` elements: one f32 norm per bucket, then the codes packed.
/// Error(invalid_argument) for bad options (bits not 4 or 8, bucket_size 0).
std::size_t qsgd_encoded_bytes(std::size_t count, const QsgdOptions& options);
/// Stochastic quantization: element i of a bucket with norm ‖v‖ becomes sign(v_i)·‖v‖·l/s where
/// l is ⌊s|v_i|/‖v‖⌋ rounded up with probability equal to the remainder, so E[decode] = v. The
/// coin for element i is uniform(key, i). `out` holds qsgd_encoded_bytes(count) bytes.
void qsgd_encode(const float* in, std::size_t count, const QsgdOptions& options, const RandomKey& key, std::byte* out);
/// out[i] = the value element i encodes.
void qsgd_decode(const std::byte* in, std::size_t count, const QsgdOptions& options, float* out);
/// out[i] += the value element i encodes (in f32).
void qsgd_decode_add(const std::byte* in, std::size_t count, const QsgdOptions& options, float* out);

// ---- top-k ----

/// The k elements of largest magnitude, ties broken by the lower index (so the choice is
/// deterministic), written as (index, value) pairs in increasing index order; values may be null
/// when only the indices are wanted. NaNs rank above every number. Error(invalid_argument) if
/// k > count, or in or indices is null with k > 0.
void top_k(const float* in, std::size_t count, std::size_t k, std::uint32_t* indices, float* values);

// ---- error feedback ----

/// One residual per tensor name: what a lossy codec did not send is added to the next step's
/// gradient, so that over steps everything is sent.
class ErrorFeedback {
 public:
  /// grad[i] += residual[i]; the first call for a name starts from a zero residual. Error
  /// (invalid_argument) if the name was seen with another count.
  void add_residual(std::string_view name, float* grad, std::size_t count);
  /// residual = corrected - sent (both `count` elements, as given to add_residual).
  void set_residual(std::string_view name, const float* corrected, const float* sent, std::size_t count);
  /// The residual of `name` (empty if none).
  std::span<const float> residual(std::string_view name) const;

 private:
  friend class GradientCompressor;  // its save_state and load_state
  std::vector<float>& slot(std::string_view name, std::size_t count);
  std::unordered_map<std::string, std::vector<float>> residuals_;
};

// ---- compressed allreduces ----

/// recv = op over ranks of send (f32, `count` elements, op sum or avg), sending `wire` values:
/// each rank rounds its input to 16 bits, a reduce-scatter adds the 16-bit blocks in f32 and
/// rounds each partial sum back to 16 bits, and an allgather spreads the reduced 16-bit blocks;
/// every rank (the blocks' owners too) decodes those same bits, so the result is bitwise
/// identical on every rank. avg divides the decoded sum by size() in f32. In place: send == recv.
/// Every rank passes the same count. Error(invalid_argument) for another op or a null buffer
/// with count > 0; the communicator's errors otherwise.
void allreduce(Communicator& comm, const float* send, float* recv, std::size_t count, Wire wire, ReduceOp op);

/// recv = op over ranks of QSGD(send) (f32, op sum or avg): each rank encodes its input with
/// `key` (its rank in key.rank), the encoded vectors are allgathered, and every rank decodes and
/// sums them in rank order in f32 (then divides by size() for avg): bitwise identical on every
/// rank. key.rank is replaced by each rank's own. `sent`, if not null, receives this rank's input as decoded (for error
/// feedback). In place: send == recv. Errors as allreduce above, and QSGD's for bad options.
void qsgd_allreduce(Communicator& comm, const float* send, float* recv, std::size_t count, const QsgdOptions& options,
                    const RandomKey& key, ReduceOp op, float* sent = nullptr);

/// y = op over ranks (sum or avg) of the ranks' sparse f32 vectors with QSGD values on the wire
/// (docs/sparse.md, "Low-precision values"). Each rank puts its input in canonical form (sorted,
/// duplicates summed in input order), encodes its canonical values once with `key` (key.rank is
/// replaced by its own rank; element k of the encoding is the k-th smallest index) and sends
/// its exact indices and the encoding to every rank (one allgatherv); every rank decodes every
/// rank's values and sums them as the sparse layer's allgather baseline does, a balanced tree in
/// rank order, so the result is identical bit for bit on every rank and, each value quantized
/// once, an unbiased estimate of the exact sum. The merging algorithms are not used: they would
/// quantize partial sums again at every hop, compounding the variance and making a partial sum's
/// error depend on the tree. The result's indices are exactly the union of the inputs' (a value
/// quantized to 0 keeps its index); its form follows sparse_options.form and SparCML's rule as
/// sparse_allreduce's does (c_v = 4). avg divides the sum by size() in f32. Result::algorithm is
/// allgather. Collective; every rank passes the same options (bits, bucket_size, form).
/// Errors: before any data moves, invalid_argument on every rank (naming the rank) for a value
/// type other than f32, an op other than sum or avg, sparse_options.algorithm other than
/// automatic or allgather, bad QSGD options, or what sparse_allreduce refuses; mismatch when the
/// ranks disagree on bits, bucket_size, dim, index type or form; the communicator's otherwise.
sparse::Result qsgd_sparse_allreduce(Communicator& comm, const sparse::Vector& input, const QsgdOptions& options,
                                     const RandomKey& key, ReduceOp op = ReduceOp::sum,
                                     const sparse::Options& sparse_options = {});

/// Top-k allreduce over the union of the ranks' choices (f32, op sum or avg): each rank chooses
/// the k elements of send of largest magnitude (top_k); the union U of every rank's choice is
/// found with a sparse_allreduce of the indices; then every rank's values at U are allreduced,
/// so recv holds op over ranks of send at every index of U and 0 elsewhere (identical on every
/// rank). An element any rank chose thus gets every rank's contribution, not only the choosers'.
/// `sent`, if not null, receives this rank's input at U and 0 elsewhere (what error feedback
/// subtracts). In place: send == recv. Every rank passes the same count and k. Returns |U|
/// (between k and size()·k); a rank sends k indices and bytes, then |U| floats. Errors as
/// allreduce above; invalid_argument if k > count.
std::size_t top_k_allreduce(Communicator& comm, const float* send, float* recv, std::size_t count, std::size_t k,
                            ReduceOp op, float* sent = nullptr);

// ---- PowerSGD (Vogels et al., 2019; PyTorch DDP's powerSGD_hook) ----

/// Rank-r approximation of each matrix gradient M (rows x cols, row-major), with error feedback
/// and a warm-started Q: M += residual; P = M Q; allreduce P (sum); orthogonalize P (Gram-
/// Schmidt); Q = Mᵀ P; allreduce Q (avg); M ≈ P Qᵀ; residual = M - P Qᵀ. Q starts from normal
/// numbers of a generator keyed by (seed, name), the same on every rank. A matrix for which the
/// factors are no smaller than it (r·(rows+cols) ≥ rows·cols) is allreduced uncompressed, as are
/// vectors (rows or cols of 1), as the hook does.
class PowerSgd {
 public:
  /// Error(invalid_argument) if rank < 1.
  PowerSgd(int rank, std::uint64_t seed);

  /// grad = the average over ranks of every rank's grad, approximated as above; bitwise identical
  /// on every rank. Every rank calls it with the same names in the same order and shapes. Returns
  /// the bytes this rank handed to the allreduces (P and Q, or the whole matrix uncompressed).
  /// Error(invalid_argument) for a null grad with elements, or a name seen with another shape.
  std::size_t allreduce(Communicator& comm, std::string_view name, float* grad, std::size_t rows, std::size_t cols);

  /// The residual of `name` (empty if none).
  std::span<const float> residual(std::string_view name) const;
  int rank() const { return rank_; }

 private:
  friend class GradientCompressor;  // its save_state and load_state
  struct State {
    std::size_t rows = 0, cols = 0;
    std::vector<float> q;         // cols x r, warm start
    std::vector<float> residual;  // rows x cols
  };
  int rank_;
  std::uint64_t seed_;
  std::unordered_map<std::string, State> states_;
};

/// Gram-Schmidt: makes the `cols` columns of `matrix` (rows x cols, row-major) orthonormal, in
/// order; a column that becomes zero stays zero.
void orthogonalize(float* matrix, std::size_t rows, std::size_t cols);

// ---- a compressor for training ----

/// A GradientCompressor's memory as bytes (GradientCompressor::save_state), to go on where it
/// stopped: after an elastic job's rebuild, or from a checkpoint.
struct CompressorState {
  /// The same on every rank: the compression, the step (which keys QSGD's randomness and top-k's
  /// warm-up) and PowerSGD's warm-started Q of each tensor.
  std::vector<std::byte> shared;
  /// This rank's own: the error-feedback residual of each tensor (qsgd, topk, powersgd), what its
  /// earlier steps did not send.
  std::vector<std::byte> local;
};

/// What DistributedOptions::compression and `tutti-train --compression` name.
struct Compression {
  enum class Kind { none, fp16, bf16, qsgd, powersgd, topk };
  Kind kind = Kind::none;
  int bits = 8;         ///< qsgd: 4 or 8
  int rank = 1;         ///< powersgd: the rank of the factors
  double ratio = 0.01;  ///< topk: the fraction of elements sent, in (0, 1]
  /// topk: over the first `warmup` steps the fraction sent falls geometrically from 1 to `ratio`
  /// (step t of them sends ratio^((t+1)/warmup)), as Deep Gradient Compression warms up.
  int warmup = 0;

  /// "none", "fp16", "bf16", "qsgd:BITS", "powersgd:RANK", "topk:RATIO" or "topk:RATIO:WARMUP".
  /// Error(invalid_argument) naming the text for anything else.
  static Compression parse(std::string_view text);
  /// The text parse() reads back.
  std::string to_string() const;
};

/// Averages gradients over ranks with a Compression, keeping the state of each tensor (residuals,
/// PowerSGD's Q) by name. qsgd and topk use error feedback; fp16 and bf16 send every element
/// (rounded) and need none; powersgd keeps its own. topk sends ⌈ratio·n⌉ elements of each tensor
/// (⌈ratio^((t+1)/warmup)·n⌉ at step t < warmup)
/// of n elements (at least one).
class GradientCompressor {
 public:
  /// Error(invalid_argument) for kind none or bad parameters.
  GradientCompressor(Compression compression, std::uint64_t seed);

  /// grad (f32, `shape` row-major) = the compressed average over comm's ranks, bitwise identical
  /// on every rank. Collective: every rank calls it with the same names, shapes and order.
  /// Returns the bytes this rank's compressed gradient took: what it handed to the collectives
  /// (16-bit values, QSGD's encoding, top-k's pairs of u32 index and f32 value, PowerSGD's factors).
  std::size_t average(Communicator& comm, std::string_view name, float* grad, std::span<const std::int64_t> shape);
  /// Starts the next step (a new QSGD key).
  void next_step() { ++step_; }

  const Compression& compression() const { return compression_; }
  std::uint64_t seed() const { return seed_; }
  std::uint64_t step() const { return step_; }
  /// Tensors whose residual this rank holds (qsgd, topk, powersgd's compressed matrices).
  std::size_t residual_count() const { return power_ ? power_->states_.size() : feedback_.residuals_.size(); }

  /// The compressor's memory (CompressorState), tensors in name order: the same bytes for the
  /// same state.
  CompressorState save_state() const;
  /// Goes on from what save_state gave: `shared` from any rank of the job, `local` this rank's
  /// own, or empty (a rank that joins: its residuals start from zero; PowerSGD's from zero
  /// against the shared Q). Error(invalid_argument), changing nothing, for bytes that another
  /// compression wrote or that are damaged, naming what is wrong.
  void load_state(std::span<const std::byte> shared, std::span<const std::byte> local);

 private:
  template <class Reduce>
  void with_feedback(std::string_view name, float* grad, std::size_t count, Reduce reduce);

  Compression compression_;
  std::uint64_t seed_;
  std::uint64_t step_ = 0;
  ErrorFeedback feedback_;
  std::unique_ptr<PowerSgd> power_;
  std::vector<float> corrected_, sent_;
};

}  // namespace tutti::compress
