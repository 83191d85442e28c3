// libtorch glue: the flat gradient vector of ShardedOptimizer (torch_zero.hpp), and its stage 2
// reduction overlapped with backward (ShardedOptions::overlap).
// Part of <tutti/torch.hpp>, which users include: header-only, CPU tensors only. Inside namespace
// tutti, `torch::` means tutti::torch: write `::torch::` there.
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

#include "tutti/torch_optimizer.hpp"
#include "tutti/tutti.hpp"

namespace tutti::torch::detail {

/// A parameter's place in the flat vector.
struct FlatSlot {
  std::string name;
  ::torch::Tensor tensor;
  std::int64_t offset;
  std::int64_t numel;
};

/// Copies the slot's gradient (zeros where undefined) to its place in `flat`.
inline void pack_gradient(::torch::Tensor& flat, const FlatSlot& slot) {
  auto place = flat.narrow(0, slot.offset, slot.numel).view(slot.tensor.sizes());
  const auto& g = slot.tensor.grad();
  if (g.defined())
    place.copy_(g.is_sparse() ? g.to_dense() : g);
  else
    place.zero_();
}

/// Stage 2's reduction, started by gradient hooks during backward and finished by step().
/// Construct it on every rank alike, after the ranks agreed on the slots.
class OverlappedReduce {
 public:
  /// `slots`: the parameters (they must outlive this object). `grad_shard`: this rank's shard
  /// of the averaged gradient, written by the reduces rooted here.
  OverlappedReduce(Communicator comm, std::vector<FlatSlot>& slots, std::int64_t shard, std::int64_t bucket_elements,
                   ::torch::Tensor grad_shard)
      : comm_(std::move(comm)), slots_(slots), shard_(shard), grad_shard_(std::move(grad_shard)) {
    buckets_of_.resize(slots_.size());
    for (int owner = 0; owner < comm_.size(); ++owner) {
      for (std::int64_t at = owner * shard; at < (owner + 1) * shard; at += bucket_elements) {
        Bucket b{owner, at, std::min(bucket_elements, (owner + 1) * shard - at), 0, 0};
        for (std::size_t i = 0; i < slots_.size(); ++i)
          if (slots_[i].offset < b.begin + b.length && b.begin < slots_[i].offset + slots_[i].numel) {
            buckets_of_[i].push_back(buckets_.size());
            ++b.slots;
          }
        b.waiting = b.slots;
        buckets_.push_back(b);
      }
    }
    packed_.assign(slots_.size(), false);
    for (std::size_t i = 0; i < slots_.size(); ++i) {
      auto accumulator = ::torch::autograd::impl::grad_accumulator(slots_[i].tensor);
      if (!accumulator) continue;  // cannot happen for a leaf that requires grad
      hooks_.emplace_back(accumulator, accumulator->add_post_hook(std::make_unique<GradReadyHook>([this, i] {
        ::torch::NoGradGuard no_grad;
        if (packed_[i])
          throw Error(ErrorCode::invalid_argument,
                      "tutti::torch::ShardedOptimizer (rank " + std::to_string(comm_.rank()) + "): the gradient of " +
                          slots_[i].name + " was produced twice before step() (overlap takes one backward per step)");
        pack(i);
        started_in_backward_ += start_ready_buckets();
      })));
    }
  }
  /// Waits for the reduces in flight (their buffers are this object's); their errors are dropped.
  ~OverlappedReduce() {
    for (auto& [accumulator, key] : hooks_) accumulator->del_post_hook(key);
    for (auto& r : requests_) try {
        r.wait();
      } catch (...) {  // a destructor reports nothing; the step that failed has thrown already
      }
  }
  OverlappedReduce(const OverlappedReduce&) = delete;
  OverlappedReduce& operator=(const OverlappedReduce&) = delete;

  /// Whether backward has produced gradients that step() has not reduced yet.
  bool busy() const { return flat_.defined(); }

  /// Packs the gradients backward did not produce (as zeros), starts the remaining buckets, waits
  /// for all of them and returns the flat buffer (free for the caller's allgather). Collective.
  /// Throws the first reduce's Error after waiting for all of them.
  ::torch::Tensor finish() {
    for (std::size_t i = 0; i < slots_.size(); ++i)
      if (!packed_[i]) pack(i);
    start_ready_buckets();
    std::exception_ptr failure;
    for (auto& r : requests_) try {
        r.wait();
      } catch (...) {
        if (!failure) failure = std::current_exception();
      }
    requests_.clear();
    started_ = 0;
    packed_.assign(slots_.size(), false);
    for (auto& b : buckets_) b.waiting = b.slots;
    auto flat = std::move(flat_);
    flat_ = ::torch::Tensor();
    if (failure) std::rethrow_exception(failure);
    return flat;
  }

  /// Buckets whose reduce started during backward rather than in step(), over all steps.
  std::uint64_t started_in_backward() const { return started_in_backward_; }

 private:
  struct Bucket {
    int owner;
    std::int64_t begin, length;  // in the flat vector, within the owner's shard
    int slots;                   // parameters with elements in it
    int waiting;                 // of those, not packed yet in this step
  };

  void pack(std::size_t i) {
    if (!flat_.defined()) {
      flat_ = ::torch::empty({shard_ * comm_.size()}, ::torch::kFloat);
      const std::int64_t count = slots_.empty() ? 0 : slots_.back().offset + slots_.back().numel;
      flat_.narrow(0, count, flat_.numel() - count).zero_();  // the padding
    }
    pack_gradient(flat_, slots_[i]);
    packed_[i] = true;
    for (std::size_t b : buckets_of_[i]) --buckets_[b].waiting;
  }

  // Starts, last bucket first, every bucket that is ready and whose predecessors have started.
  std::uint64_t start_ready_buckets() {
    std::uint64_t started = 0;
    for (; started_ < buckets_.size(); ++started_, ++started) {
      const Bucket& b = buckets_[buckets_.size() - 1 - started_];
      if (b.waiting > 0) break;
      float* recv = b.owner == comm_.rank() ? grad_shard_.data_ptr<float>() + (b.begin - b.owner * shard_) : nullptr;
      requests_.push_back(comm_.ireduce(flat_.data_ptr<float>() + b.begin, recv, static_cast<std::size_t>(b.length),
                                        DataType::f32, ReduceOp::avg, b.owner));
    }
    return started;
  }

  Communicator comm_;
  std::vector<FlatSlot>& slots_;
  std::int64_t shard_;
  ::torch::Tensor grad_shard_;
  std::vector<Bucket> buckets_;                       // owner 0's first; started from the last
  std::vector<std::vector<std::size_t>> buckets_of_;  // per slot: the buckets it has elements in
  std::vector<bool> packed_;                          // per slot, in this step
  std::size_t started_ = 0;                           // buckets started in this step
  std::vector<Request> requests_;
  ::torch::Tensor flat_;  // the flat gradient between the first hook and step()
  std::uint64_t started_in_backward_ = 0;
  std::vector<std::pair<detail::GradAccumulatorPtr, std::uintptr_t>> hooks_;
};

}  // namespace tutti::torch::detail
