// The flat gradient vector of ShardedOptimizer (include/tutti/torch_zero.hpp), and its stage 2
// reduction overlapped with backward (ShardedOptions::overlap). Private to Tutti::torch
// (zero_overlap.cpp).
//
// With overlap, the flat vector is cut into buckets that never cross a shard boundary: each shard
// into pieces of at most `bucket_elements`. A hook on each parameter's gradient accumulator copies
// the gradient into the flat vector the moment backward has produced it; a bucket whose gradients
// are all there is averaged onto its owner with a nonblocking reduce (rooted at the owner, into
// the owner's gradient shard). Buckets are started in one fixed order on every rank, the last
// bucket first (backward produces the last layers' gradients first): a bucket that is ready waits
// for the ones before it in that order. Calls on a communicator must be issued in the same order
// on every rank, and two buckets of the same size and owner issued in different orders would
// silently add the wrong elements together; a rank whose graph skips a parameter starts the
// buckets after it in step(), in the same order.
#pragma once

#include <cstdint>
#include <exception>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/types.h>

#include "tutti/torch_optimizer.hpp"  // GradAccumulatorPtr, GradReadyHook
#include "tutti/tutti.hpp"

namespace tutti::libtorch::detail {

/// A parameter's place in the flat vector.
struct FlatSlot {
  std::string name;
  torch::Tensor tensor;
  std::int64_t offset;
  std::int64_t numel;
};

/// Copies the slot's gradient (zeros where undefined) to its place in `flat`.
void pack_gradient(torch::Tensor& flat, const FlatSlot& slot);

/// Stage 2's reduction, started by gradient hooks during backward and finished by step().
/// Construct it on every rank alike, after the ranks agreed on the slots.
class OverlappedReduce {
 public:
  /// `slots`: the parameters (they must outlive this object). `grad_shard`: this rank's shard
  /// of the averaged gradient, written by the reduces rooted here.
  OverlappedReduce(Communicator comm, std::vector<FlatSlot>& slots, std::int64_t shard, std::int64_t bucket_elements,
                   torch::Tensor grad_shard);
  /// Waits for the reduces in flight (their buffers are this object's); their errors are dropped.
  ~OverlappedReduce();
  OverlappedReduce(const OverlappedReduce&) = delete;
  OverlappedReduce& operator=(const OverlappedReduce&) = delete;

  /// Whether backward has produced gradients that step() has not reduced yet.
  bool busy() const { return flat_.defined(); }

  /// Packs the gradients backward did not produce (as zeros), starts the remaining buckets, waits
  /// for all of them and returns the flat buffer (free for the caller's allgather). Collective.
  /// Throws the first reduce's Error after waiting for all of them.
  torch::Tensor finish();

  /// Buckets whose reduce started during backward rather than in step(), over all steps.
  std::uint64_t started_in_backward() const { return started_in_backward_; }

 private:
  struct Bucket {
    int owner;
    std::int64_t begin, length;  // in the flat vector, within the owner's shard
    int slots;                   // parameters with elements in it
    int waiting;                 // of those, not packed yet in this step
  };

  void pack(std::size_t i);

  // Starts, last bucket first, every bucket that is ready and whose predecessors have started.
  std::uint64_t start_ready_buckets();

  Communicator comm_;
  std::vector<FlatSlot>& slots_;
  std::int64_t shard_;
  torch::Tensor grad_shard_;
  std::vector<Bucket> buckets_;                       // owner 0's first; started from the last
  std::vector<std::vector<std::size_t>> buckets_of_;  // per slot: the buckets it has elements in
  std::vector<bool> packed_;                          // per slot, in this step
  std::size_t started_ = 0;                           // buckets started in this step
  std::vector<Request> requests_;
  torch::Tensor flat_;  // the flat gradient between the first hook and step()
  std::uint64_t started_in_backward_ = 0;
  std::vector<std::pair<detail::GradAccumulatorPtr, std::uintptr_t>> hooks_;
};

}  // namespace tutti::libtorch::detail
