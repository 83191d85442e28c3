#include "horovod/ops.hpp"

#include <algorithm>
#include <bit>
#include <numeric>
#include <utility>

#include "tutti/torch_dtype.hpp"

namespace tutti_python::horovod {

namespace {

using tutti::Error;
using tutti::ErrorCode;

std::string rank_prefix(const std::string& what, const std::string& name, int rank) {
  return "tutti.horovod " + what + " '" + name + "' (rank " + std::to_string(rank) + "): ";
}

/// The tensor's Tutti type; Error(invalid_argument) for a tensor that is not in host memory (the
/// engine reads and writes it through its data pointer) or of a type Tutti does not reduce.
tutti::DataType checked_type(const torch::Tensor& t, const std::string& where) {
  if (t.defined() && !t.device().is_cpu())
    throw Error(ErrorCode::invalid_argument, where + "the tensor is on " + t.device().str() + " (CPU tensors only)");
  return tutti::libtorch::dtype_of(t);
}

/// The type and the dimensions after the first, as one number the ranks compare.
std::int64_t row_signature(const torch::Tensor& t) {
  std::string text = c10::toString(t.scalar_type());
  for (std::int64_t d = 1; d < t.dim(); ++d) text += "," + std::to_string(t.size(d));
  return std::bit_cast<std::int64_t>(tutti::libtorch::detail::fnv1a(text));
}

std::string describe(const torch::Tensor& t) {
  std::string s = std::string(c10::toString(t.scalar_type())) + "[";
  for (std::int64_t d = 0; d < t.dim(); ++d) s += (d ? "," : "") + std::to_string(t.size(d));
  return s + "]";
}

/// Elements in one row (one index of dim 0).
std::int64_t row_elements(const torch::Tensor& t) {
  std::int64_t n = 1;
  for (std::int64_t d = 1; d < t.dim(); ++d) n *= t.size(d);
  return n;
}

/// A tensor shaped like `like` but with `rows` rows.
torch::Tensor empty_rows(const torch::Tensor& like, std::int64_t rows) {
  std::vector<std::int64_t> shape(like.sizes().begin(), like.sizes().end());
  shape[0] = rows;
  return torch::empty(shape, like.options().memory_format(torch::MemoryFormat::Contiguous));
}

void ignore_errors_while_waiting(tutti::Handle& handle, std::chrono::milliseconds slice) {
  try {
    handle.wait_for(slice);
  } catch (const Error&) {
    // test() raises it, to the caller that synchronizes this operation.
  }
}

/// One engine collective; the result is copied into `output` where the engine worked on a copy.
class EngineOp final : public PendingOp {
 public:
  EngineOp(tutti::Handle handle, torch::Tensor input, torch::Tensor buffer, torch::Tensor output)
      : handle_(std::move(handle)), input_(std::move(input)), buffer_(std::move(buffer)), output_(std::move(output)) {
    pin({input_, buffer_});
  }

  bool test() override {
    if (done_) return true;
    if (!handle_.test()) return false;
    if (!output_.is_same(buffer_)) output_.copy_(buffer_);
    done_ = true;
    return true;
  }
  void wait_for(std::chrono::milliseconds slice) override { ignore_errors_while_waiting(handle_, slice); }
  std::vector<torch::Tensor> results() override { return {output_}; }

 private:
  tutti::Handle handle_;
  torch::Tensor input_, buffer_, output_;  // input_ and buffer_ are held for the engine
  bool done_ = false;
};

/// Horovod's allgather: first dimensions, then the padded blocks, then the compacted result.
class AllgatherOp final : public PendingOp {
 public:
  AllgatherOp(tutti::Engine& engine, std::string name, torch::Tensor input)
      : engine_(engine), name_(std::move(name)), input_(input.contiguous()) {
    if (input_.dim() == 0)
      throw Error(ErrorCode::invalid_argument, rank_prefix("allgather", name_, engine.rank()) +
                                                   "the tensor is a scalar; allgather needs at least one dimension");
    dtype_ = checked_type(input_, rank_prefix("allgather", name_, engine.rank()));
    pin({input_});  // the data phase may send it as it is
    meta_ = torch::tensor({input_.size(0), row_signature(input_)}, torch::kLong);
    gathered_ = torch::empty({2 * engine.size()}, torch::kLong);
    handle_ = engine.enqueue_allgather(name_, meta_.data_ptr(), gathered_.data_ptr(), 2, tutti::DataType::i64);
  }

  bool test() override {
    if (phase_ == Phase::shapes) {
      if (!handle_.test()) return false;
      start_data();
    }
    if (phase_ == Phase::data) {
      if (!handle_.test()) return false;
      compact();
    }
    return true;
  }
  void wait_for(std::chrono::milliseconds slice) override { ignore_errors_while_waiting(handle_, slice); }
  std::vector<torch::Tensor> results() override { return {output_}; }

 private:
  enum class Phase { shapes, data, done };

  void start_data() {
    const auto* g = gathered_.data_ptr<std::int64_t>();
    for (int r = 0; r < engine_.size(); ++r) {
      if (g[2 * r + 1] != g[1] || g[2 * r + 1] != meta_.data_ptr<std::int64_t>()[1])
        throw Error(ErrorCode::mismatch, rank_prefix("allgather", name_, engine_.rank()) + "rank " + std::to_string(r) +
                                             "'s tensor differs from this rank's in type or in the dimensions after "
                                             "the first (this rank's: " +
                                             describe(input_) + ")");
      rows_.push_back(g[2 * r]);
    }
    max_rows_ = *std::max_element(rows_.begin(), rows_.end());
    const std::int64_t total = std::accumulate(rows_.begin(), rows_.end(), std::int64_t{0});
    if (max_rows_ == 0 || row_elements(input_) == 0) {
      output_ = empty_rows(input_, total);
      phase_ = Phase::done;
      return;
    }
    send_ = input_;
    if (input_.size(0) < max_rows_) {  // pad to the largest block: the engine gathers equal blocks
      send_ = torch::zeros_like(empty_rows(input_, max_rows_));
      send_.narrow(0, 0, input_.size(0)).copy_(input_);
    }
    recv_ = empty_rows(input_, max_rows_ * engine_.size());
    handle_ = engine_.enqueue_allgather(name_ + "/data", send_.data_ptr(), recv_.data_ptr(),
                                        static_cast<std::size_t>(send_.numel()), dtype_);
    phase_ = Phase::data;
  }

  void compact() {
    if (std::all_of(rows_.begin(), rows_.end(), [&](std::int64_t r) { return r == max_rows_; })) {
      output_ = recv_;
    } else {
      std::vector<torch::Tensor> blocks;
      for (std::size_t r = 0; r < rows_.size(); ++r)
        blocks.push_back(recv_.narrow(0, static_cast<std::int64_t>(r) * max_rows_, rows_[r]));
      output_ = torch::cat(blocks);
    }
    phase_ = Phase::done;
  }

  tutti::Engine& engine_;
  std::string name_;
  torch::Tensor input_, meta_, gathered_, send_, recv_, output_;
  tutti::DataType dtype_ = tutti::DataType::u8;
  tutti::Handle handle_;
  std::vector<std::int64_t> rows_;
  std::int64_t max_rows_ = 0;
  Phase phase_ = Phase::shapes;
};

/// Alltoall's data phase on the world communicator.
class AlltoallOp final : public PendingOp {
 public:
  AlltoallOp(tutti::Request request, torch::Tensor input, torch::Tensor output, torch::Tensor received,
             std::vector<std::size_t> send_counts, std::vector<std::size_t> recv_counts)
      : request_(std::move(request)),
        input_(std::move(input)),
        output_(std::move(output)),
        received_(std::move(received)),
        send_counts_(std::move(send_counts)),
        recv_counts_(std::move(recv_counts)) {
    pin({input_});
  }

  bool test() override { return request_.test(); }
  void wait_for(std::chrono::milliseconds slice) override {
    try {
      request_.wait_for(slice);
    } catch (const Error&) {
      // test() raises it.
    }
  }
  std::vector<torch::Tensor> results() override { return {output_, received_}; }

 private:
  tutti::Request request_;
  torch::Tensor input_, output_, received_;
  std::vector<std::size_t> send_counts_, recv_counts_;  // held for the request
};

/// The rows each rank receives from this one: `splits`, or dim 0 split equally.
std::vector<std::int64_t> send_rows(const torch::Tensor& input, const torch::Tensor& splits, int size,
                                    const std::string& where) {
  const std::int64_t rows = input.size(0);
  if (!splits.defined()) {
    if (rows % size != 0)
      throw Error(ErrorCode::invalid_argument, where + "dim 0 (" + std::to_string(rows) +
                                                   ") is not divisible by the number of ranks (" +
                                                   std::to_string(size) + "); pass splits");
    return std::vector<std::int64_t>(static_cast<std::size_t>(size), rows / size);
  }
  if (splits.is_floating_point() || splits.is_complex() || splits.numel() != size)
    throw Error(ErrorCode::invalid_argument,
                where + "splits must be " + std::to_string(size) + " integers (one per rank), not " + describe(splits));
  const torch::Tensor s = splits.to(torch::kLong).contiguous();
  std::vector<std::int64_t> out(s.data_ptr<std::int64_t>(), s.data_ptr<std::int64_t>() + size);
  if (std::any_of(out.begin(), out.end(), [](std::int64_t v) { return v < 0; }) ||
      std::accumulate(out.begin(), out.end(), std::int64_t{0}) != rows)
    throw Error(ErrorCode::invalid_argument,
                where + "splits must be non-negative and sum to dim 0 (" + std::to_string(rows) + ")");
  return out;
}

}  // namespace

tutti::ReduceOp reduce_op_of(int horovod_op, const std::string& name) {
  switch (horovod_op) {
    case 0:
      return tutti::ReduceOp::avg;
    case 1:
      return tutti::ReduceOp::sum;
    case 2:
      throw Error(ErrorCode::unsupported,
                  "tutti.horovod allreduce '" + name + "': op Adasum is not supported by Tutti (use Average or Sum)");
    case 3:
      return tutti::ReduceOp::min;
    case 4:
      return tutti::ReduceOp::max;
    case 5:
      return tutti::ReduceOp::prod;
    default:
      throw Error(ErrorCode::invalid_argument,
                  "tutti.horovod allreduce '" + name + "': unknown op " + std::to_string(horovod_op));
  }
}

std::unique_ptr<PendingOp> start_allreduce(tutti::Engine& engine, const std::string& name, torch::Tensor input,
                                           torch::Tensor output, int horovod_op) {
  const tutti::ReduceOp op = reduce_op_of(horovod_op, name);
  const tutti::DataType type = checked_type(input, rank_prefix("allreduce", name, engine.rank()));
  checked_type(output, rank_prefix("allreduce", name, engine.rank()));
  if (input.scalar_type() != output.scalar_type() || input.numel() != output.numel())
    throw Error(ErrorCode::invalid_argument, rank_prefix("allreduce", name, engine.rank()) + "output " +
                                                 describe(output) + " does not match input " + describe(input));
  const bool in_place = input.is_same(output);
  torch::Tensor buffer = output.is_contiguous() ? output : torch::empty_like(output, torch::MemoryFormat::Contiguous);
  torch::Tensor send = in_place && buffer.is_same(output) ? buffer : input.contiguous();
  // The shape travels with the name: ranks whose tensors agree in count but not in shape raise
  // Error(mismatch), as in Horovod.
  const std::vector<std::int64_t> dims(input.sizes().begin(), input.sizes().end());
  tutti::Handle h = engine.enqueue_allreduce(name, send.data_ptr(), buffer.data_ptr(), dims, type, op);
  return std::make_unique<EngineOp>(std::move(h), std::move(send), std::move(buffer), std::move(output));
}

std::unique_ptr<PendingOp> start_broadcast(tutti::Engine& engine, const std::string& name, torch::Tensor tensor,
                                           int root) {
  const tutti::DataType type = checked_type(tensor, rank_prefix("broadcast", name, engine.rank()));
  torch::Tensor buffer = tensor.contiguous();
  auto n = static_cast<std::size_t>(buffer.numel());
  tutti::Handle h = engine.enqueue_broadcast(name, buffer.data_ptr(), n, type, root);
  return std::make_unique<EngineOp>(std::move(h), torch::Tensor(), std::move(buffer), std::move(tensor));
}

std::unique_ptr<PendingOp> start_allgather(tutti::Engine& engine, const std::string& name, torch::Tensor input) {
  return std::make_unique<AllgatherOp>(engine, name, std::move(input));
}

std::unique_ptr<PendingOp> start_alltoall(tutti::Communicator& world, const std::string& name, torch::Tensor input,
                                          torch::Tensor splits) {
  const std::string where = rank_prefix("alltoall", name, world.rank());
  if (input.dim() == 0)
    throw Error(ErrorCode::invalid_argument, where + "the tensor is a scalar; alltoall needs at least one dimension");
  const tutti::DataType type = checked_type(input, where);
  const int size = world.size();
  const std::vector<std::int64_t> rows = send_rows(input, splits, size, where);
  // Every rank learns how many rows each peer sends it, and checks that the peers' rows are shaped
  // like its own, before any data moves (a row of another size would misplace every block).
  std::vector<std::int64_t> meta_out, meta_in(2 * static_cast<std::size_t>(size));
  for (std::int64_t r : rows) meta_out.insert(meta_out.end(), {r, row_signature(input)});
  world.alltoall(meta_out.data(), meta_in.data(), 2, tutti::DataType::i64);
  std::vector<std::int64_t> received(static_cast<std::size_t>(size));
  for (int r = 0; r < size; ++r) {
    if (meta_in[2 * r + 1] != row_signature(input))
      throw Error(ErrorCode::mismatch, where + "rank " + std::to_string(r) +
                                           "'s tensor differs from this rank's in type or in the dimensions after "
                                           "the first (this rank's: " +
                                           describe(input) + ")");
    received[static_cast<std::size_t>(r)] = meta_in[2 * r];
  }
  const auto row = static_cast<std::size_t>(row_elements(input));
  std::vector<std::size_t> send_counts, recv_counts;
  for (int r = 0; r < size; ++r) {
    send_counts.push_back(static_cast<std::size_t>(rows[static_cast<std::size_t>(r)]) * row);
    recv_counts.push_back(static_cast<std::size_t>(received[static_cast<std::size_t>(r)]) * row);
  }
  torch::Tensor send = input.contiguous();
  torch::Tensor output = empty_rows(send, std::accumulate(received.begin(), received.end(), std::int64_t{0}));
  torch::Tensor received_tensor = torch::tensor(received, torch::kInt);
  tutti::Request request = world.ialltoallv(send.data_ptr(), send_counts, output.data_ptr(), recv_counts, type);
  return std::make_unique<AlltoallOp>(std::move(request), std::move(send), std::move(output),
                                      std::move(received_tensor), std::move(send_counts), std::move(recv_counts));
}

}  // namespace tutti_python::horovod
