// The operations of tutti.horovod.torch in flight: each is enqueued on the training engine (or, for
// alltoall, issued on the world communicator) and completes when synchronize() or poll() finds its
// result in place.
#pragma once

#include <chrono>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include <torch/types.h>

#include "common/storage_pin.hpp"
#include "tutti/engine.hpp"
#include "tutti/tutti.hpp"

namespace tutti_python::horovod {

/// One operation from enqueue to completion. Tensors it reads or writes are held by it, and their
/// storages pinned (common/storage_pin.hpp), so that their memory outlives the collective whatever
/// the caller does to them (del, set_; resize_ raises).
class PendingOp {
 public:
  virtual ~PendingOp() = default;
  /// Advances the operation without blocking (starts its next phase where one is due); true once
  /// the result is in place. Throws the operation's tutti::Error.
  virtual bool test() = 0;
  /// Blocks for at most `slice` on the current phase (errors are left for test()).
  virtual void wait_for(std::chrono::milliseconds slice) = 0;
  /// The outputs, valid once test() returned true: the result tensor, and for alltoall the
  /// received splits.
  virtual std::vector<torch::Tensor> results() = 0;

 protected:
  /// Pins the storages of `tensors` (undefined ones are skipped) until this operation is destroyed.
  void pin(std::initializer_list<torch::Tensor> tensors) {
    for (const torch::Tensor& t : tensors) pins_.emplace_back(t);
  }

 private:
  std::vector<StoragePin> pins_;
};

/// Horovod's reduction ops, as the Python module numbers them (Average = 0, Sum = 1, Adasum = 2,
/// Min = 3, Max = 4, Product = 5). Adasum is Error(unsupported).
tutti::ReduceOp reduce_op_of(int horovod_op, const std::string& name);

/// Allreduce of `input` into `output` (the same tensor for in place): both of one type and number
/// of elements. Non-contiguous tensors go through a contiguous copy.
std::unique_ptr<PendingOp> start_allreduce(tutti::Engine& engine, const std::string& name, torch::Tensor input,
                                           torch::Tensor output, int horovod_op);

/// Broadcast of root's `tensor` into every rank's `tensor`, in place.
std::unique_ptr<PendingOp> start_broadcast(tutti::Engine& engine, const std::string& name, torch::Tensor tensor,
                                           int root);

/// Allgather along dim 0, the first dimensions may differ between ranks (Horovod's allgather): the
/// ranks first exchange their first dimension and a signature of the rest of the shape and type,
/// then gather blocks padded to the largest first dimension, and the result is compacted.
std::unique_ptr<PendingOp> start_allgather(tutti::Engine& engine, const std::string& name, torch::Tensor input);

/// Alltoall along dim 0 on `world` (ordered like any call on a communicator: every rank must issue
/// its alltoalls in the same order). `splits` (integer, size() entries summing to dim 0) says how
/// many rows go to each rank; undefined: dim 0 split equally. The received splits are exchanged
/// before this returns; the data moves asynchronously.
std::unique_ptr<PendingOp> start_alltoall(tutti::Communicator& world, const std::string& name, torch::Tensor input,
                                          torch::Tensor splits);

}  // namespace tutti_python::horovod
