// allreduce of a sparse COO tensor on the backend "tutti", as Gloo's: ReduceOp.SUM only, and the
// caller's tensor becomes the coalesced sum, of its own sizes, sparse_dim and dense_dim. It runs on
// Tutti's sparse collectives (include/tutti/sparse.hpp), whose result is the exact union of the
// ranks' indices, as Gloo's sum of the gathered tensors is.
//
// The mapping. Entry (i_0, ..., i_{s-1}) of a coalesced tensor holds a block of B dense values (B:
// the product of the dense sizes; 1 without dense dimensions); it becomes the B elements row·B + j
// (j < B) of a sparse vector of dimension rows·B, `row` being the row-major index of the entry over
// the sparse sizes and `rows` their product. Every rank gives whole blocks, so the sorted union the
// sparse allreduce returns (Form::sparse, forced) is whole blocks again: B indices per entry.
// A dense size of 0 (B = 0) still has entries, which Gloo keeps: they travel as one zero each.
//
// Why a second collective. Tensors of different sizes with the same element count ((4, 6) and
// (6, 4); sparse_dim 1 and 2 of the same sizes) give vectors of the same dimension, which the
// sparse API cannot tell apart. So the ranks also allgather a descriptor of their tensor (sizes,
// sparse_dim, dense_dim, type) on the group's communicator, and every rank raises mismatch naming
// two of them where they differ (Gloo checks the sizes the same way, by an allgather first).
//
// Progress. The sparse call runs on a tutti::sparse::Communicator: a thread of its own over a split
// of the group's communicator, made at the group's first sparse allreduce. That split is a
// collective on the group's communicator, ordered after the operations issued before it: the first
// sparse allreduce of a group returns once every rank has issued it; later ones return at once.
#include <algorithm>
#include <array>
#include <chrono>
#include <cstring>
#include <exception>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <ATen/ATen.h>

#include "c10d/process_group.hpp"
#include "c10d/tensors.hpp"

namespace tutti::c10d_backend {

namespace {

using Clock = std::chrono::steady_clock;

// One rank's description of its tensor: sparse_dim, dense_dim, scalar type, number of dimensions,
// a hash of all sizes, then the first kShown sizes (-1 past the last), for the message.
constexpr std::size_t kShown = 6;
constexpr std::size_t kDescriptor = 5 + kShown;

std::array<std::int64_t, kDescriptor> descriptor_of(const at::Tensor& tensor) {
  std::array<std::int64_t, kDescriptor> d{};
  d.fill(-1);
  d[0] = tensor.sparse_dim();
  d[1] = tensor.dense_dim();
  d[2] = static_cast<std::int64_t>(tensor.scalar_type());
  d[3] = tensor.dim();
  for (std::size_t i = 0; i < tensor.sizes().size() && i < kShown; ++i) d[5 + i] = tensor.sizes()[i];
  const auto sizes = tensor.sizes();
  d[4] = static_cast<std::int64_t>(tutti::detail::fnv1a(sizes.data(), sizes.size() * sizeof(std::int64_t)));
  return d;
}

std::string describe(const std::int64_t* d) {
  std::string sizes = "[";
  for (std::int64_t i = 0; i < d[3]; ++i) {
    if (i > 0) sizes += ", ";
    if (i == static_cast<std::int64_t>(kShown)) {
      sizes += "...";
      break;
    }
    sizes += std::to_string(d[5 + i]);
  }
  return sizes + "] (sparse_dim " + std::to_string(d[0]) + ", dense_dim " + std::to_string(d[1]) + ", " +
         c10::toString(static_cast<at::ScalarType>(d[2])) + ")";
}

// a·b, or Error(unsupported) past what a sparse vector's dimension holds.
std::uint64_t times(std::uint64_t a, std::uint64_t b, const at::Tensor& tensor) {
  std::uint64_t product = 0;
  if (__builtin_mul_overflow(a, b, &product))
    throw Error(ErrorCode::unsupported, prefix("allreduce") + "a sparse tensor of sizes " + c10::str(tensor.sizes()) +
                                            " has more than 2^64 elements, more than tutti's sparse allreduce indexes");
  return product;
}

const char* op_name(const ::c10d::ReduceOp& op) {
  static const char* const names[] = {"SUM", "AVG", "PRODUCT", "MIN", "MAX", "BAND", "BOR", "BXOR", "PREMUL_SUM"};
  const auto index = static_cast<std::size_t>(op.op_);
  return index < std::size(names) ? names[index] : "UNUSED";
}

// One sparse allreduce in flight: its input (until the sparse call is done), the descriptors'
// exchange, and the result (until the work's finalize takes it).
struct SparseCall {
  // The tensor's shape, and the sparse vector's layout (block: B above, at least 1).
  std::vector<std::int64_t> sizes;
  std::int64_t sparse_dim = 0;
  std::uint64_t block = 1;
  // Input.
  std::vector<std::uint32_t> indices32;
  std::vector<std::uint64_t> indices64;
  at::Tensor values;
  // Every rank's descriptor, allgathered on the group's communicator.
  std::array<std::int64_t, kDescriptor> mine{};
  at::Tensor descriptors;
  tutti::Request exchange;
  sparse::Request<sparse::Result> request;
  Clock::time_point issued;
  // Outcome, once both are done.
  std::mutex mutex;
  bool finished = false;
  std::exception_ptr error;
  sparse::Result result;

  /// Takes the tensor's entries as the sparse vector (returned) and describes the tensor.
  sparse::Vector prepare(const at::Tensor& tensor);
  bool wait(std::chrono::milliseconds limit);
  void check_descriptors() const;
  at::Tensor rebuild(const at::Tensor& like) const;
};

bool SparseCall::wait(std::chrono::milliseconds limit) {
  const Clock::time_point deadline = Clock::now() + limit;
  // The sparse call first, whatever the exchange says: it reads the input until it is done. Its
  // Request has no bounded wait, hence the polling (from 20 µs, doubling to 1 ms).
  for (auto pause = std::chrono::microseconds(20);; pause = std::min(2 * pause, std::chrono::microseconds(1000))) {
    {
      std::lock_guard lock(mutex);
      if (finished) {
        if (error) std::rethrow_exception(error);
        return true;
      }
      if (request.test()) break;
    }
    const Clock::time_point now = Clock::now();
    if (now >= deadline) return false;
    std::this_thread::sleep_for(std::min<Clock::duration>(pause, deadline - now));
  }
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(std::max(deadline - Clock::now(), {}));
  if (!exchange.wait_for(left, issued)) return false;  // raises the exchange's own error
  std::lock_guard lock(mutex);
  if (!finished) {
    finished = true;
    try {
      check_descriptors();  // before the sparse call's error: it names the sizes
      result = request.wait();
    } catch (...) {
      error = std::current_exception();
    }
    indices32 = {};
    indices64 = {};
    values = at::Tensor();
  }
  if (error) std::rethrow_exception(error);
  return true;
}

void SparseCall::check_descriptors() const {
  const std::int64_t* all = descriptors.data_ptr<std::int64_t>();
  for (std::int64_t r = 1; r < descriptors.size(0); ++r) {
    if (!std::equal(all, all + kDescriptor, all + r * static_cast<std::int64_t>(kDescriptor)))
      throw Error(ErrorCode::mismatch, prefix("allreduce") + "the ranks' sparse tensors differ: rank 0 has " +
                                           describe(all) + ", rank " + std::to_string(r) + " has " +
                                           describe(all + r * static_cast<std::int64_t>(kDescriptor)));
  }
}

template <class I>
void unravel(const std::vector<std::byte>& bytes, std::size_t rows, std::uint64_t block,
             const std::vector<std::int64_t>& sizes, at::Tensor& indices) {
  const I* flat = reinterpret_cast<const I*>(bytes.data());
  std::int64_t* out = indices.data_ptr<std::int64_t>();
  const auto sparse_dim = static_cast<std::size_t>(indices.size(0));
  for (std::size_t k = 0; k < rows; ++k) {
    const std::uint64_t first = flat[k * block];
    // Whole blocks, by construction (equal descriptors); checked, not trusted.
    if (first % block != 0 || static_cast<std::uint64_t>(flat[k * block + block - 1]) != first + block - 1)
      throw Error(ErrorCode::mismatch, prefix("allreduce") + "the sparse result is not made of whole blocks of " +
                                           std::to_string(block) + " values (the ranks' tensors disagree)");
    std::uint64_t row = first / block;
    for (std::size_t d = sparse_dim; d-- > 0;) {
      const auto size = static_cast<std::uint64_t>(sizes[d]);
      out[d * rows + k] = static_cast<std::int64_t>(row % size);
      row /= size;
    }
  }
}

at::Tensor SparseCall::rebuild(const at::Tensor& like) const {
  const std::size_t rows = result.nnz / block;
  if (result.form != sparse::Form::sparse || result.nnz % block != 0)
    throw Error(ErrorCode::mismatch, prefix("allreduce") + "the sparse result is not made of whole blocks of " +
                                         std::to_string(block) + " values (the ranks' tensors disagree)");
  at::Tensor indices = at::empty({sparse_dim, static_cast<std::int64_t>(rows)}, at::kLong);
  if (result.index_type == sparse::IndexType::u32)
    unravel<std::uint32_t>(result.indices, rows, block, sizes, indices);
  else
    unravel<std::uint64_t>(result.indices, rows, block, sizes, indices);
  std::vector<std::int64_t> shape{static_cast<std::int64_t>(rows)};
  shape.insert(shape.end(), sizes.begin() + sparse_dim, sizes.end());
  at::Tensor values = at::empty(shape, like.options().layout(at::kStrided));
  if (values.numel() > 0) std::memcpy(values.data_ptr(), result.values.data(), values.nbytes());
  at::Tensor out = at::_sparse_coo_tensor_unsafe(indices, values, sizes, like.options());
  return out._coalesced_(true);
}

// The input's indices as the sparse vector's: each entry's row-major index over the sparse sizes,
// times `block`, plus 0 .. block - 1.
template <class I>
std::vector<I> flatten_indices(const at::Tensor& indices, const std::vector<std::int64_t>& sizes, std::uint64_t block) {
  const at::Tensor contiguous = indices.contiguous();
  const std::int64_t* in = contiguous.data_ptr<std::int64_t>();
  const auto sparse_dim = static_cast<std::size_t>(contiguous.size(0));
  const auto nnz = static_cast<std::size_t>(contiguous.size(1));
  std::vector<I> flat(nnz * block);
  for (std::size_t k = 0; k < nnz; ++k) {
    std::uint64_t row = 0;
    for (std::size_t d = 0; d < sparse_dim; ++d) {
      const std::int64_t i = in[d * nnz + k];
      if (i < 0 || i >= sizes[d])
        throw Error(ErrorCode::invalid_argument, prefix("allreduce") + "the sparse tensor's index " +
                                                     std::to_string(i) + " in dimension " + std::to_string(d) +
                                                     " is out of its size " + std::to_string(sizes[d]));
      row = row * static_cast<std::uint64_t>(sizes[d]) + static_cast<std::uint64_t>(i);
    }
    for (std::uint64_t j = 0; j < block; ++j) flat[k * block + j] = static_cast<I>(row * block + j);
  }
  return flat;
}

sparse::Vector SparseCall::prepare(const at::Tensor& tensor) {
  const at::Tensor input = tensor.coalesce();
  values = input._values().contiguous();
  sizes = tensor.sizes().vec();
  sparse_dim = tensor.sparse_dim();
  std::uint64_t rows = 1;
  for (std::int64_t d = 0; d < sparse_dim; ++d) rows = times(rows, static_cast<std::uint64_t>(sizes[d]), tensor);
  std::uint64_t elements = 1;
  for (std::size_t d = static_cast<std::size_t>(sparse_dim); d < sizes.size(); ++d)
    elements = times(elements, static_cast<std::uint64_t>(sizes[d]), tensor);
  block = std::max<std::uint64_t>(elements, 1);
  if (elements == 0) values = at::zeros({input._nnz()}, values.options());  // one zero per entry
  sparse::Vector vector;
  vector.dim = static_cast<std::size_t>(times(rows, block, tensor));
  vector.nnz = static_cast<std::size_t>(input._nnz()) * static_cast<std::size_t>(block);
  vector.value_type = data_type_of(values, "allreduce");  // CPU, a type Tutti has
  vector.values = values.data_ptr();
  if (vector.dim <= (std::uint64_t{1} << 32)) {
    indices32 = flatten_indices<std::uint32_t>(input._indices(), sizes, block);
    vector.index_type = sparse::IndexType::u32;
    vector.indices = indices32.data();
  } else {
    indices64 = flatten_indices<std::uint64_t>(input._indices(), sizes, block);
    vector.index_type = sparse::IndexType::u64;
    vector.indices = indices64.data();
  }
  mine = descriptor_of(tensor);
  return vector;
}

}  // namespace

c10::intrusive_ptr<::c10d::Work> ProcessGroupTutti::allreduce_sparse_coo(std::vector<at::Tensor>& tensors,
                                                                         const ::c10d::AllreduceOptions& opts) {
  const char* what = "allreduce";
  const at::Tensor& tensor = tensors.front();
  if (opts.reduceOp.op_ != ::c10d::ReduceOp::SUM)
    throw Error(ErrorCode::unsupported, prefix(what) + "ReduceOp." + op_name(opts.reduceOp) +
                                            " on a sparse tensor is not supported (ReduceOp.SUM only, as Gloo)");
  // Below autograd, as Gloo's: coalesce() and copy_() on the tensor itself, not as recorded ops.
  at::AutoDispatchBelowAutograd below_autograd;
  auto call = std::make_shared<SparseCall>();
  const sparse::Vector vector = call->prepare(tensor);
  const ReduceOp op = reduce_op_of(opts.reduceOp, tensor.scalar_type(), what);  // sum (bool: or)
  call->descriptors = at::empty({size_, static_cast<std::int64_t>(kDescriptor)}, at::kLong);
  const std::chrono::milliseconds timeout = opts.timeout == ::c10d::kUnsetTimeout ? timeout_ : opts.timeout;
  tutti::Options exchange_options;
  exchange_options.timeout = timeout;
  sparse::Options sparse_options;
  sparse_options.form = sparse::Form::sparse;
  sparse_options.timeout = timeout;
  {
    std::lock_guard lock(issue_mutex_);
    if (!sparse_) sparse_ = std::make_unique<sparse::Communicator>(comm_);  // collective (above)
    call->issued = Clock::now();
    call->exchange =
        comm_.iallgather(call->mine.data(), call->descriptors.data_ptr(), kDescriptor, DataType::i64, exchange_options);
    call->request = sparse_->iallreduce(vector, op, sparse_options);
    ++sequence_;
  }
  auto work = c10::make_intrusive<WorkTutti>(
      rank_, ::c10d::OpType::ALLREDUCE, [call](std::chrono::milliseconds limit) { return call->wait(limit); }, tensors,
      std::vector<at::Tensor>{call->values, call->descriptors},
      [call, tensor] {
        at::AutoDispatchBelowAutograd below_autograd;
        tensor.copy_(call->rebuild(tensor));  // the tensor takes the result's indices and values
        call->result = {};
      });
  progress_->add(work);
  return work;
}

}  // namespace tutti::c10d_backend
