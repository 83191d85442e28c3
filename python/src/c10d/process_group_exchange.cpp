// The rooted and personalized collectives of ProcessGroupTutti (gather, scatter, reduce_scatter,
// alltoall), the barrier and point to point.
#include "c10d/process_group.hpp"
#include "c10d/tensors.hpp"

namespace tutti::c10d_backend {

using ::c10d::OpType;
using WorkPtr = c10::intrusive_ptr<::c10d::Work>;

WorkPtr ProcessGroupTutti::gather(std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
                                  const ::c10d::GatherOptions& opts) {
  const char* what = "gather";
  const int root = root_of(opts.rootRank, what);
  auto in = std::make_shared<Staged>(single(inputs, what), what);
  std::vector<at::Tensor> list;
  at::Tensor flat;
  if (rank_ == root) {
    if (outputs.size() != 1 || outputs.front().size() != static_cast<std::size_t>(size_))
      throw Error(ErrorCode::invalid_argument,
                  prefix(what) + "the root expects one list of " + std::to_string(size_) + " output tensors");
    list = outputs.front();
    check_like(list, inputs.front(), inputs.front().numel(), "gather_list", what);
    flat = at::empty({inputs.front().numel() * size_}, inputs.front().options());
  } else if (!outputs.empty() && !outputs.front().empty()) {
    throw Error(ErrorCode::invalid_argument,
                prefix(what) + "only the root (rank " + std::to_string(root) + ") takes output tensors");
  }
  return run(
      OpType::GATHER, opts.timeout,
      [&](tutti::Communicator& c, const tutti::Options& o) {
        return c.igather(in->data(), flat.defined() ? flat.data_ptr() : nullptr, in->count(), in->type(), root, o);
      },
      list, {in->buffer(), flat},
      [flat, list] {
        if (flat.defined()) unflatten(flat, list);
      });
}

WorkPtr ProcessGroupTutti::scatter(std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
                                   const ::c10d::ScatterOptions& opts) {
  const char* what = "scatter";
  const int root = root_of(opts.rootRank, what);
  auto out = std::make_shared<Staged>(single(outputs, what), what);
  at::Tensor flat;
  if (rank_ == root) {
    if (inputs.size() != 1 || inputs.front().size() != static_cast<std::size_t>(size_))
      throw Error(ErrorCode::invalid_argument,
                  prefix(what) + "the root expects one list of " + std::to_string(size_) + " input tensors");
    check_like(inputs.front(), outputs.front(), outputs.front().numel(), "scatter_list", what);
    flat = flatten(inputs.front());
  } else if (!inputs.empty() && !inputs.front().empty()) {
    throw Error(ErrorCode::invalid_argument,
                prefix(what) + "only the root (rank " + std::to_string(root) + ") takes input tensors");
  }
  return run(
      OpType::SCATTER, opts.timeout,
      [&](tutti::Communicator& c, const tutti::Options& o) {
        return c.iscatter(flat.defined() ? flat.data_ptr() : nullptr, out->data(), out->count(), out->type(), root, o);
      },
      outputs, {out->buffer(), flat}, [out] { out->copy_back(); });
}

WorkPtr ProcessGroupTutti::reduce_scatter(std::vector<at::Tensor>& outputs,
                                          std::vector<std::vector<at::Tensor>>& inputs,
                                          const ::c10d::ReduceScatterOptions& opts) {
  const char* what = "reduce_scatter";
  const at::Tensor& output = single(outputs, what);
  auto out = std::make_shared<Staged>(output, what);
  if (inputs.size() != 1 || inputs.front().size() != static_cast<std::size_t>(size_))
    throw Error(ErrorCode::invalid_argument,
                prefix(what) + "expected one list of " + std::to_string(size_) + " input tensors (one per rank)");
  check_like(inputs.front(), output, output.numel(), "input_list", what);
  const ReduceOp op = reduce_op_of(opts.reduceOp, output.scalar_type(), what);
  at::Tensor flat = flatten(inputs.front());
  return run(
      OpType::REDUCE_SCATTER, opts.timeout,
      [&](tutti::Communicator& c, const tutti::Options& o) {
        return c.ireduce_scatter(flat.data_ptr(), out->data(), out->count(), out->type(), op, o);
      },
      outputs, {out->buffer(), flat}, [out] { out->copy_back(); });
}

WorkPtr ProcessGroupTutti::_reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                const ::c10d::ReduceScatterOptions& opts) {
  const char* what = "_reduce_scatter_base";
  auto in = std::make_shared<Staged>(input, what);
  auto out = std::make_shared<Staged>(output, what);
  check_like({input}, output, output.numel() * size_, "input", what);
  const ReduceOp op = reduce_op_of(opts.reduceOp, output.scalar_type(), what);
  return run(
      OpType::_REDUCE_SCATTER_BASE, opts.timeout,
      [&](tutti::Communicator& c, const tutti::Options& o) {
        return c.ireduce_scatter(in->data(), out->data(), out->count(), out->type(), op, o);
      },
      {output}, {in->buffer(), out->buffer()}, [out] { out->copy_back(); });
}

#if TUTTI_C10D_BACKEND
WorkPtr ProcessGroupTutti::reduce_scatter_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                           std::vector<at::Tensor>& inputs,
                                                           const ::c10d::ReduceScatterOptions& opts) {
  // One reduce_scatter: the block for rank r holds block r of every input, end to end.
  const char* what = "reduce_scatter_tensor_coalesced";
  check_pairs(outputs, inputs, size_, "outputs", "inputs", what);
  std::vector<at::Tensor> blocks;  // inputs[i] as rows of one block per rank
  for (std::size_t i = 0; i < outputs.size(); ++i) blocks.push_back(inputs[i].reshape({size_, outputs[i].numel()}));
  const ReduceOp op = reduce_op_of(opts.reduceOp, outputs.front().scalar_type(), what);
  const DataType type = data_type_of(outputs.front(), what);
  at::Tensor send = at::cat(blocks, 1).contiguous();
  at::Tensor recv = at::empty({send.size(1)}, send.options());
  return run(
      OpType::REDUCE_SCATTER_TENSOR_COALESCED, opts.timeout,
      [&](tutti::Communicator& c, const tutti::Options& o) {
        return c.ireduce_scatter(send.data_ptr(), recv.data_ptr(), static_cast<std::size_t>(recv.numel()), type, op, o);
      },
      outputs, {send, recv}, [recv, outputs] { unflatten(recv, outputs); });
}
#endif

namespace {

// Element counts per rank of a tensor split along its first dimension into `splits` rows each
// (empty `splits`: equal parts).
std::vector<std::size_t> split_counts(const at::Tensor& t, const std::vector<int64_t>& splits, int size,
                                      const char* role) {
  const char* what = "alltoall_base";
  const std::int64_t rows = t.dim() == 0 ? 1 : t.size(0);
  const std::int64_t row = rows == 0 ? 0 : t.numel() / rows;
  std::vector<std::size_t> counts;
  if (splits.empty()) {
    if (rows % size != 0)
      throw Error(ErrorCode::invalid_argument, prefix(what) + role + "'s first dimension (" + std::to_string(rows) +
                                                   ") is not divisible by the group size " + std::to_string(size));
    counts.assign(static_cast<std::size_t>(size), static_cast<std::size_t>(rows / size * row));
    return counts;
  }
  if (splits.size() != static_cast<std::size_t>(size))
    throw Error(ErrorCode::invalid_argument, prefix(what) + role + " split sizes have " +
                                                 std::to_string(splits.size()) + " entries, expected " +
                                                 std::to_string(size));
  std::int64_t sum = 0;
  for (std::int64_t s : splits) {
    if (s < 0) throw Error(ErrorCode::invalid_argument, prefix(what) + role + " split sizes must not be negative");
    sum += s;
    counts.push_back(static_cast<std::size_t>(s * row));
  }
  if (sum != rows)
    throw Error(ErrorCode::invalid_argument, prefix(what) + role + " split sizes add up to " + std::to_string(sum) +
                                                 ", but its first dimension is " + std::to_string(rows));
  return counts;
}

}  // namespace

WorkPtr ProcessGroupTutti::alltoall_base(at::Tensor& output, at::Tensor& input, std::vector<int64_t>& output_splits,
                                         std::vector<int64_t>& input_splits, const ::c10d::AllToAllOptions& opts) {
  const char* what = "alltoall_base";
  auto in = std::make_shared<Staged>(input, what);
  auto out = std::make_shared<Staged>(output, what);
  check_like({output}, input, -1, "output", what);
  const auto send_counts = split_counts(input, input_splits, size_, "input");
  const auto recv_counts = split_counts(output, output_splits, size_, "output");
  return run(
      OpType::ALLTOALL_BASE, opts.timeout,
      [&](tutti::Communicator& c, const tutti::Options& o) {
        if (input_splits.empty() && output_splits.empty() && in->count() == out->count())
          return c.ialltoall(in->data(), out->data(), in->count() / static_cast<std::size_t>(size_), in->type(), o);
        return c.ialltoallv(in->data(), send_counts, out->data(), recv_counts, in->type(), o);
      },
      {output}, {in->buffer(), out->buffer()}, [out] { out->copy_back(); });
}

WorkPtr ProcessGroupTutti::alltoall(std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
                                    const ::c10d::AllToAllOptions& opts) {
  const char* what = "alltoall";
  if (inputs.size() != static_cast<std::size_t>(size_) || outputs.size() != static_cast<std::size_t>(size_))
    throw Error(ErrorCode::invalid_argument,
                prefix(what) + "expected " + std::to_string(size_) + " input and output tensors (one per rank), got " +
                    std::to_string(inputs.size()) + " and " + std::to_string(outputs.size()));
  check_like(inputs, inputs.front(), -1, "input_tensor_list", what);
  check_like(outputs, inputs.front(), -1, "output_tensor_list", what);
  const DataType type = data_type_of(inputs.front(), what);
  const std::vector<std::size_t> send_counts = counts_of(inputs), recv_counts = counts_of(outputs);
  at::Tensor send = flatten(inputs);
  std::int64_t total = 0;
  for (std::size_t n : recv_counts) total += static_cast<std::int64_t>(n);
  at::Tensor recv = at::empty({total}, inputs.front().options());
  return run(
      OpType::ALLTOALL, opts.timeout,
      [&](tutti::Communicator& c, const tutti::Options& o) {
        return c.ialltoallv(send.data_ptr(), send_counts, recv.data_ptr(), recv_counts, type, o);
      },
      outputs, {send, recv}, [recv, outputs] { unflatten(recv, outputs); });
}

WorkPtr ProcessGroupTutti::barrier(const ::c10d::BarrierOptions& opts) {
  return run(
      OpType::BARRIER, opts.timeout, [](tutti::Communicator& c, const tutti::Options& o) { return c.ibarrier(o); }, {},
      {}, nullptr);
}

WorkPtr ProcessGroupTutti::send(std::vector<at::Tensor>& tensors, int dst, int tag) {
  const char* what = "send";
  root_of(dst, what);
  auto staged = std::make_shared<Staged>(single(tensors, what), what);
  return run(
      OpType::SEND, ::c10d::kUnsetTimeout,
      [&](tutti::Communicator& c, const tutti::Options&) {
        return c.isend(staged->data(), staged->count(), staged->type(), dst, tag);
      },
      tensors, {staged->buffer()}, nullptr);
}

WorkPtr ProcessGroupTutti::recv(std::vector<at::Tensor>& tensors, int src, int tag) {
  const char* what = "recv";
  root_of(src, what);
  auto staged = std::make_shared<Staged>(single(tensors, what), what);
  return run(
      OpType::RECV, ::c10d::kUnsetTimeout,
      [&](tutti::Communicator& c, const tutti::Options&) {
        return c.irecv(staged->data(), staged->count(), staged->type(), src, tag);
      },
      tensors, {staged->buffer()}, [staged] { staged->copy_back(); }, src);
}

// The first message with `tag` from any rank (tutti::any_source); the Work's sourceRank() names it.
WorkPtr ProcessGroupTutti::recvAnysource(std::vector<at::Tensor>& tensors, int tag) {
  const char* what = "recv";
  auto staged = std::make_shared<Staged>(single(tensors, what), what);
  return run(
      OpType::RECVANYSOURCE, ::c10d::kUnsetTimeout,
      [&](tutti::Communicator& c, const tutti::Options&) {
        return c.irecv(staged->data(), staged->count(), staged->type(), tutti::any_source, tag);
      },
      tensors, {staged->buffer()}, [staged] { staged->copy_back(); }, WorkTutti::source_of_request);
}

}  // namespace tutti::c10d_backend
