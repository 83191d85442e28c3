#include "c10d/process_group.hpp"

#include <Python.h>

#include "c10d/tensors.hpp"

namespace tutti::c10d_backend {

using ::c10d::OpType;
using WorkPtr = c10::intrusive_ptr<::c10d::Work>;

ProcessGroupTutti::ProcessGroupTutti(tutti::Communicator comm, std::chrono::milliseconds timeout)
    : C10dBase(comm.rank(), comm.size()),
      comm_(std::move(comm)),
      timeout_(timeout),
      progress_(std::make_unique<WorkProgress>()) {}

ProcessGroupTutti::~ProcessGroupTutti() {
  // The progress thread may be completing a future whose Python callback needs the GIL, which
  // the thread that drops the last reference may hold: let go of it while joining.
  if (Py_IsInitialized() && PyGILState_Check()) {
    PyThreadState* state = PyEval_SaveThread();
    sparse_.reset();
    progress_.reset();
    PyEval_RestoreThread(state);
  }
}

WorkPtr ProcessGroupTutti::run(OpType type, std::chrono::milliseconds timeout, const Issue& issue,
                               std::vector<at::Tensor> outputs, std::vector<at::Tensor> keep,
                               std::function<void()> finalize, int source_rank) {
  tutti::Options options;
  options.timeout = timeout == ::c10d::kUnsetTimeout ? timeout_ : timeout;
  tutti::Request request;
  {
    std::lock_guard lock(issue_mutex_);
    request = issue(comm_, options);
    ++sequence_;
  }
  auto work = c10::make_intrusive<WorkTutti>(rank_, type, std::move(request), std::move(outputs), std::move(keep),
                                             std::move(finalize), source_rank);
  progress_->add(work);
  return work;
}

int ProcessGroupTutti::root_of(std::int64_t root, const char* what) const {
  if (root < 0 || root >= size_)
    throw Error(ErrorCode::invalid_argument,
                prefix(what) + "root " + std::to_string(root) + " is not in 0.." + std::to_string(size_ - 1));
  return static_cast<int>(root);
}

WorkPtr ProcessGroupTutti::broadcast(std::vector<at::Tensor>& tensors, const ::c10d::BroadcastOptions& opts) {
  const int root = root_of(opts.rootRank, "broadcast");
  if (opts.rootTensor != 0)
    throw Error(ErrorCode::invalid_argument, prefix("broadcast") + "rootTensor must be 0 (one tensor per rank)");
  auto staged = std::make_shared<Staged>(single(tensors, "broadcast"), "broadcast");
  return run(
      OpType::BROADCAST, opts.timeout,
      [&](tutti::Communicator& c, const tutti::Options& o) {
        return c.ibroadcast(staged->data(), staged->count(), staged->type(), root, o);
      },
      tensors, {staged->buffer()}, [staged] { staged->copy_back(); });
}

WorkPtr ProcessGroupTutti::allreduce(std::vector<at::Tensor>& tensors, const ::c10d::AllreduceOptions& opts) {
  const at::Tensor& tensor = single(tensors, "allreduce");
  if (tensor.defined() && tensor.layout() == at::kSparse) return allreduce_sparse_coo(tensors, opts);
  auto staged = std::make_shared<Staged>(tensor, "allreduce");
  const ReduceOp op = reduce_op_of(opts.reduceOp, tensor.scalar_type(), "allreduce");
  return run(
      OpType::ALLREDUCE, opts.timeout,
      [&](tutti::Communicator& c, const tutti::Options& o) {
        return c.iallreduce(staged->data(), staged->data(), staged->count(), staged->type(), op, o);
      },
      tensors, {staged->buffer()}, [staged] { staged->copy_back(); });
}

WorkPtr ProcessGroupTutti::allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                               const ::c10d::AllreduceCoalescedOptions& opts) {
  const char* what = "allreduce_coalesced";
  if (tensors.empty()) throw Error(ErrorCode::invalid_argument, prefix(what) + "no tensors");
  check_like(tensors, tensors.front(), -1, "tensors", what);
  const ReduceOp op = reduce_op_of(opts.reduceOp, tensors.front().scalar_type(), what);
  const DataType type = data_type_of(tensors.front(), what);
  at::Tensor flat = flatten(tensors);  // one allreduce for all of them, as Gloo does
  return run(
      OpType::ALLREDUCE_COALESCED, opts.timeout,
      [&](tutti::Communicator& c, const tutti::Options& o) {
        return c.iallreduce(flat.data_ptr(), flat.data_ptr(), static_cast<std::size_t>(flat.numel()), type, op, o);
      },
      tensors, {flat}, [flat, tensors] { unflatten(flat, tensors); });
}

WorkPtr ProcessGroupTutti::reduce(std::vector<at::Tensor>& tensors, const ::c10d::ReduceOptions& opts) {
  const int root = root_of(opts.rootRank, "reduce");
  const at::Tensor& tensor = single(tensors, "reduce");
  auto staged = std::make_shared<Staged>(tensor, "reduce");
  const ReduceOp op = reduce_op_of(opts.reduceOp, tensor.scalar_type(), "reduce");
  const bool is_root = rank_ == root;
  return run(
      OpType::REDUCE, opts.timeout,
      [&](tutti::Communicator& c, const tutti::Options& o) {
        return c.ireduce(staged->data(), is_root ? staged->data() : nullptr, staged->count(), staged->type(), op, root,
                         o);
      },
      tensors, {staged->buffer()},
      [staged, is_root] {
        if (is_root) staged->copy_back();
      });
}

WorkPtr ProcessGroupTutti::allgather(std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
                                     const ::c10d::AllgatherOptions& opts) {
  const char* what = "allgather";
  const at::Tensor& input = single(inputs, what);
  auto staged = std::make_shared<Staged>(input, what);
  if (outputs.size() != 1 || outputs.front().size() != static_cast<std::size_t>(size_))
    throw Error(ErrorCode::invalid_argument,
                prefix(what) + "expected one list of " + std::to_string(size_) + " output tensors (one per rank)");
  const std::vector<at::Tensor>& list = outputs.front();
  check_like(list, input, -1, "output_tensors", what);
  if (list[static_cast<std::size_t>(rank_)].numel() != input.numel())
    throw Error(ErrorCode::invalid_argument, prefix(what) + "output_tensors[" + std::to_string(rank_) + "] has " +
                                                 std::to_string(list[static_cast<std::size_t>(rank_)].numel()) +
                                                 " elements, but this rank's input has " +
                                                 std::to_string(input.numel()));
  // Blocks of different sizes (each output's size is its rank's input size) go through allgatherv.
  const std::vector<std::size_t> counts = counts_of(list);
  std::size_t total = 0;
  for (std::size_t n : counts) total += n;
  at::Tensor flat = at::empty({static_cast<std::int64_t>(total)}, input.options());
  return run(
      OpType::ALLGATHER, opts.timeout,
      [&](tutti::Communicator& c, const tutti::Options& o) {
        return c.iallgatherv(staged->data(), staged->count(), flat.data_ptr(), counts, staged->type(), o);
      },
      list, {staged->buffer(), flat}, [flat, list] { unflatten(flat, list); });
}

WorkPtr ProcessGroupTutti::_allgather_base(at::Tensor& output, at::Tensor& input,
                                           const ::c10d::AllgatherOptions& opts) {
  const char* what = "_allgather_base";
  auto in = std::make_shared<Staged>(input, what);
  auto out = std::make_shared<Staged>(output, what);
  check_like({output}, input, input.numel() * size_, "output", what);
  return run(
      OpType::_ALLGATHER_BASE, opts.timeout,
      [&](tutti::Communicator& c, const tutti::Options& o) {
        return c.iallgather(in->data(), out->data(), in->count(), in->type(), o);
      },
      {output}, {in->buffer(), out->buffer()}, [out] { out->copy_back(); });
}

WorkPtr ProcessGroupTutti::allgather_coalesced(std::vector<std::vector<at::Tensor>>& outputs,
                                               std::vector<at::Tensor>& inputs, const ::c10d::AllgatherOptions& opts) {
  // Every rank's inputs laid end to end, gathered in one allgather (as Gloo does): outputs[r][i]
  // gets rank r's input i.
  const char* what = "allgather_coalesced";
  if (inputs.empty()) throw Error(ErrorCode::invalid_argument, prefix(what) + "no input tensors");
  check_like(inputs, inputs.front(), -1, "input_tensors", what);
  if (outputs.size() != static_cast<std::size_t>(size_))
    throw Error(ErrorCode::invalid_argument, prefix(what) + "expected " + std::to_string(size_) +
                                                 " output lists (one per rank), got " + std::to_string(outputs.size()));
  for (const auto& list : outputs) {
    if (list.size() != inputs.size())
      throw Error(ErrorCode::invalid_argument, prefix(what) +
                                                   "every output list must have as many tensors as the inputs (" +
                                                   std::to_string(inputs.size()) + ")");
    for (std::size_t i = 0; i < list.size(); ++i)
      check_tensor(list[i], i, inputs[i], inputs[i].numel(), "output", what);
  }
  const DataType type = data_type_of(inputs.front(), what);
  at::Tensor send = flatten(inputs);
  at::Tensor recv = at::empty({send.numel() * size_}, send.options());
  std::vector<at::Tensor> all;  // every output tensor, in rank order: the future's value
  for (const auto& list : outputs) all.insert(all.end(), list.begin(), list.end());
  return run(
      OpType::ALLGATHER_COALESCED, opts.timeout,
      [&](tutti::Communicator& c, const tutti::Options& o) {
        return c.iallgather(send.data_ptr(), recv.data_ptr(), static_cast<std::size_t>(send.numel()), type, o);
      },
      all, {send, recv}, [recv, all] { unflatten(recv, all); });
}

#if TUTTI_C10D_BACKEND
WorkPtr ProcessGroupTutti::allgather_into_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                           std::vector<at::Tensor>& inputs,
                                                           const ::c10d::AllgatherOptions& opts) {
  // Every rank's inputs end to end, one allgather: rank r's block holds its input i at the
  // offset of input i, which goes to block r of outputs[i].
  const char* what = "allgather_into_tensor_coalesced";
  check_pairs(inputs, outputs, size_, "inputs", "outputs", what);
  const DataType type = data_type_of(inputs.front(), what);
  at::Tensor send = flatten(inputs);
  at::Tensor recv = at::empty({size_, send.numel()}, send.options());
  return run(
      OpType::ALLGATHER_INTO_TENSOR_COALESCED, opts.timeout,
      [&](tutti::Communicator& c, const tutti::Options& o) {
        return c.iallgather(send.data_ptr(), recv.data_ptr(), static_cast<std::size_t>(send.numel()), type, o);
      },
      outputs, {send, recv},
      [recv, outputs] {
        std::int64_t offset = 0;
        for (const at::Tensor& out : outputs) {
          const std::int64_t n = out.numel() / recv.size(0);
          out.copy_(recv.narrow(1, offset, n).reshape(out.sizes()));
          offset += n;
        }
      });
}
#endif

}  // namespace tutti::c10d_backend
