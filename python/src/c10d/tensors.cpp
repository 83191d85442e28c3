#include "c10d/tensors.hpp"

#include <cstring>

#include "tutti/torch_dtype.hpp"

namespace tutti::c10d_backend {

std::string prefix(const char* what) { return std::string("tutti: ") + what + ": "; }

DataType data_type_of(const at::Tensor& tensor, const char* what) {
  if (!tensor.defined()) throw Error(ErrorCode::invalid_argument, prefix(what) + "a tensor is undefined");
  if (!tensor.device().is_cpu())
    throw Error(ErrorCode::unsupported,
                prefix(what) + "tensors on " + tensor.device().str() +
                    " are not supported by tutti's torch.distributed backend (CPU tensors only)");
  if (tensor.layout() != at::kStrided)
    throw Error(ErrorCode::unsupported, prefix(what) + "sparse tensors are not supported by tutti (strided only)");
  if (tensor.scalar_type() == at::kBool) return DataType::u8;
  try {
    return tutti::libtorch::dtype_of(tensor);
  } catch (const Error& e) {
    throw Error(e.code(), prefix(what) + e.what());
  }
}

ReduceOp reduce_op_of(const ::c10d::ReduceOp& op, at::ScalarType type, const char* what) {
  const bool logical = type == at::kBool;
  switch (op.op_) {
    case ::c10d::ReduceOp::SUM:
      return logical ? ReduceOp::max : ReduceOp::sum;
    case ::c10d::ReduceOp::AVG:
      if (!logical) return ReduceOp::avg;
      break;
    case ::c10d::ReduceOp::PRODUCT:
      return logical ? ReduceOp::min : ReduceOp::prod;
    case ::c10d::ReduceOp::MIN:
      return ReduceOp::min;
    case ::c10d::ReduceOp::MAX:
      return ReduceOp::max;
    case ::c10d::ReduceOp::BAND:
      if (logical) return ReduceOp::min;
      break;
    case ::c10d::ReduceOp::BOR:
      if (logical) return ReduceOp::max;
      break;
    default:
      break;
  }
  static const char* const names[] = {"SUM", "AVG", "PRODUCT", "MIN", "MAX", "BAND", "BOR", "BXOR", "PREMUL_SUM"};
  const auto index = static_cast<std::size_t>(op.op_);
  const std::string name = index < std::size(names) ? names[index] : std::to_string(index);
  throw Error(ErrorCode::unsupported, prefix(what) + "ReduceOp." + name + " on " + c10::toString(type) +
                                          " is not supported by tutti (SUM, AVG, PRODUCT, MIN, MAX; BAND and BOR "
                                          "on bool only)");
}

const at::Tensor& single(const std::vector<at::Tensor>& tensors, const char* what) {
  if (tensors.size() != 1)
    throw Error(ErrorCode::invalid_argument,
                prefix(what) + "expected one tensor per rank, got " + std::to_string(tensors.size()));
  return tensors.front();
}

void check_tensor(const at::Tensor& t, std::size_t index, const at::Tensor& reference, long numel, const char* role,
                  const char* what) {
  data_type_of(t, what);
  if (t.scalar_type() != reference.scalar_type())
    throw Error(ErrorCode::invalid_argument, prefix(what) + role + "[" + std::to_string(index) + "] is " +
                                                 c10::toString(t.scalar_type()) + ", expected " +
                                                 c10::toString(reference.scalar_type()));
  if (numel >= 0 && t.numel() != numel)
    throw Error(ErrorCode::invalid_argument, prefix(what) + role + "[" + std::to_string(index) + "] has " +
                                                 std::to_string(t.numel()) + " elements, expected " +
                                                 std::to_string(numel));
}

void check_like(const std::vector<at::Tensor>& tensors, const at::Tensor& reference, long numel, const char* role,
                const char* what) {
  for (std::size_t i = 0; i < tensors.size(); ++i) check_tensor(tensors[i], i, reference, numel, role, what);
}

void check_pairs(const std::vector<at::Tensor>& small, const std::vector<at::Tensor>& big, int size,
                 const char* small_role, const char* big_role, const char* what) {
  if (small.empty() || small.size() != big.size())
    throw Error(ErrorCode::invalid_argument, prefix(what) + "expected as many " + big_role + " as " + small_role +
                                                 " (at least one), got " + std::to_string(big.size()) + " and " +
                                                 std::to_string(small.size()));
  check_like(small, small.front(), -1, small_role, what);
  // Each against its own small tensor; a message names it in the singular ("output[1]").
  const std::string one(big_role, std::strlen(big_role) - 1);
  for (std::size_t i = 0; i < small.size(); ++i)
    check_tensor(big[i], i, small[i], small[i].numel() * size, one.c_str(), what);
}

Staged::Staged(const at::Tensor& tensor, const char* what)
    : tensor_(tensor), buffer_(tensor.contiguous()), type_(data_type_of(tensor, what)) {}

void Staged::copy_back() const {
  if (!buffer_.is_same(tensor_)) tensor_.copy_(buffer_);
}

at::Tensor flatten(const std::vector<at::Tensor>& list) {
  std::vector<at::Tensor> flat;
  flat.reserve(list.size());
  for (const at::Tensor& t : list) flat.push_back(t.reshape({-1}));
  return at::cat(flat);
}

void unflatten(const at::Tensor& flat, const std::vector<at::Tensor>& list) {
  std::int64_t offset = 0;
  for (const at::Tensor& t : list) {
    t.copy_(flat.narrow(0, offset, t.numel()).view(t.sizes()));
    offset += t.numel();
  }
}

std::vector<std::size_t> counts_of(const std::vector<at::Tensor>& list) {
  std::vector<std::size_t> counts;
  counts.reserve(list.size());
  for (const at::Tensor& t : list) counts.push_back(static_cast<std::size_t>(t.numel()));
  return counts;
}

}  // namespace tutti::c10d_backend
