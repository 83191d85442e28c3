// One measured case of tutti-bench (collective, type, op, root, size, form) and the buffers it
// runs on: sizes, predictable inputs and the exact check of the results.
#pragma once

#include <cstddef>
#include <memory>
#include <span>
#include <vector>

#include "bench/options.hpp"
#include "tutti/tutti.hpp"

namespace tutti::bench {

struct Case {
  Kind kind = Collective::allreduce;
  DataType type = DataType::f32;
  ReduceOp op = ReduceOp::sum;
  int root = 0;
  std::size_t count = 0;  // the count argument of the call (per-rank block for total-size collectives)
  bool in_place = false;
};

/// The case for `bytes` as nccl-tests reads `size(B)`; the count is rounded down to fit.
Case make_case(Kind kind, DataType type, ReduceOp op, int root, std::size_t bytes, int ranks);
/// The bytes the row reports (size(B)) and the elements (count) it prints.
std::size_t case_bytes(const Case& c, int ranks);
std::size_t case_elements(const Case& c, int ranks);
/// Writes `v` as one element of `type` at `at` (integers by conversion, f16/bf16 through float).
void store(DataType type, void* at, double v);
/// Whether the collective has this form: broadcast is in place only; sendrecv, barrier, gather,
/// scatter and the v-forms are timed out of place only.
bool has_form(Kind kind, bool in_place);
/// The uneven blocks of allgatherv and alltoallv, in elements, for the case's average block `n`:
/// 2·n·(k+1)/(p+1), rounded down, with k = q for rank q's allgatherv block and k = (from + to) mod p
/// for the block rank `from` sends rank `to` in alltoallv. Every rank's blocks add up to about p·n,
/// as alltoall's and allgather's do, and no two ranks' blocks are the same size (p > 1).
std::size_t uneven_count(std::size_t n, int k, int p);

/// The buffers of one case on one rank, allocated once per size and reused by every peer.
/// `input()` is where the rank's input lives for this form; `output()` what is checked.
class Buffers {
 public:
  /// With `shared`, the memory comes from shared->allocate (SharedBuffer: zero copy on shm).
  Buffers(const Case& c, int rank, int ranks, const Communicator* shared = nullptr);
  const void* send() const;  // the `send` argument of the call
  void* recv();              // the `recv` argument (the buffer of broadcast)
  /// Writes the predictable inputs and poisons the outputs (before a checked iteration).
  void prepare();
  /// Elements of this rank's output that differ from the exact expected result.
  std::size_t count_wrong() const;
  /// Flips a bit of the first output element (tests of the check itself).
  void corrupt();
  /// The memory behind send() and recv(), which device mode mirrors on the device: the inputs of
  /// an out-of-place case (empty in place) and the outputs (where an in-place input lives too).
  std::span<std::byte> send_storage() { return {send_, send_ ? send_elems_ * elem_ : 0}; }
  std::span<std::byte> recv_storage() { return {recv_, recv_elems_ * elem_}; }
  /// allgatherv: the per-rank counts (recv_counts); alltoallv: this rank's send and receive counts.
  std::span<const std::size_t> send_counts() const { return send_counts_; }
  std::span<const std::size_t> recv_counts() const { return recv_counts_; }

 private:
  std::byte* input();
  Case case_;
  int rank_, ranks_;
  std::size_t send_elems_, recv_elems_, elem_;
  std::vector<std::size_t> send_counts_, recv_counts_;  // the v-forms only
  std::byte* send_ = nullptr;                           // null in place
  std::byte* recv_ = nullptr;
  std::unique_ptr<std::byte[]> owned_send_, owned_recv_;
  SharedBuffer shared_send_, shared_recv_;
};

}  // namespace tutti::bench
