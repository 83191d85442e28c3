// Tensors as Tutti buffers: the checks every collective of the "tutti" backend makes on its
// arguments, the Tutti type and reduction of a tensor, and contiguous staging.
#pragma once

#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/Types.hpp>

#include "tutti/tutti.hpp"

namespace tutti::c10d_backend {

/// "tutti: allreduce: " — the start of every message of operation `what`.
std::string prefix(const char* what);

/// The Tutti type of `tensor`'s elements. Bool travels as u8. Errors: Error(invalid_argument)
/// for an undefined tensor or a type Tutti lacks (int16, complex, …); Error(unsupported) for a
/// tensor not on the CPU or not strided.
DataType data_type_of(const at::Tensor& tensor, const char* what);

/// The Tutti reduction of `op` on elements of `type`: SUM, AVG, PRODUCT, MIN, MAX for every type;
/// on bool, SUM and BOR are a logical or (max), PRODUCT and BAND a logical and (min). Anything
/// else (bitwise ops on numbers, BXOR, PREMUL_SUM) is Error(unsupported).
ReduceOp reduce_op_of(const ::c10d::ReduceOp& op, at::ScalarType type, const char* what);

/// Exactly one tensor (the per-rank list of torch's API); Error(invalid_argument) otherwise.
const at::Tensor& single(const std::vector<at::Tensor>& tensors, const char* what);

/// Tensor `role`[`index`] has `reference`'s scalar type and `numel` elements (a negative `numel`:
/// any); Error(invalid_argument) naming both otherwise.
void check_tensor(const at::Tensor& tensor, std::size_t index, const at::Tensor& reference, long numel,
                  const char* role, const char* what);

/// Every tensor of `tensors` has `reference`'s scalar type and `numel` elements (a negative
/// `numel`: any); Error(invalid_argument) naming `role` and the index otherwise.
void check_like(const std::vector<at::Tensor>& tensors, const at::Tensor& reference, long numel, const char* role,
                const char* what);

/// The pairs of torch 2.x's coalesced tensor collectives: `small[i]` (an input of an allgather,
/// an output of a reduce_scatter) goes with `big[i]`, `size` times as large. Error(invalid_argument)
/// naming `what` unless there is at least one pair, every small tensor has the first one's type,
/// and each big one its small one's type and `size` times its elements. `small_role` and
/// `big_role` ("inputs", "outputs") name the lists in messages.
void check_pairs(const std::vector<at::Tensor>& small, const std::vector<at::Tensor>& big, int size,
                 const char* small_role, const char* big_role, const char* what);

/// A tensor's data as Tutti sees it: a contiguous buffer, the tensor itself when it is
/// contiguous, else a contiguous copy that copy_back() writes into the tensor (as Gloo does).
class Staged {
 public:
  Staged(const at::Tensor& tensor, const char* what);
  at::Tensor& buffer() { return buffer_; }
  void* data() const { return buffer_.data_ptr(); }
  std::size_t count() const { return static_cast<std::size_t>(buffer_.numel()); }
  DataType type() const { return type_; }
  /// Writes the buffer into the tensor when they differ.
  void copy_back() const;

 private:
  at::Tensor tensor_;
  at::Tensor buffer_;
  DataType type_;
};

/// The tensors of `list` laid end to end in one new contiguous tensor (of `list`'s type).
at::Tensor flatten(const std::vector<at::Tensor>& list);
/// Copies consecutive pieces of `flat` into the tensors of `list` (their sizes in order).
void unflatten(const at::Tensor& flat, const std::vector<at::Tensor>& list);
/// Element counts of the tensors of `list`.
std::vector<std::size_t> counts_of(const std::vector<at::Tensor>& list);

}  // namespace tutti::c10d_backend
