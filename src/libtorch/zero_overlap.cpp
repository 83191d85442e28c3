// ShardedOptimizer's flat gradient vector and overlapped reduction (zero_overlap.hpp).
#include <cstdint>
#include <exception>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/types.h>

#include "libtorch/zero_overlap.hpp"

namespace tutti::libtorch::detail {

void pack_gradient(torch::Tensor& flat, const FlatSlot& slot) {
  auto place = flat.narrow(0, slot.offset, slot.numel).view(slot.tensor.sizes());
  const auto& g = slot.tensor.grad();
  if (g.defined())
    place.copy_(g.is_sparse() ? g.to_dense() : g);
  else
    place.zero_();
}

OverlappedReduce::OverlappedReduce(Communicator comm, std::vector<FlatSlot>& slots, std::int64_t shard,
                                   std::int64_t bucket_elements, torch::Tensor grad_shard)
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
    auto accumulator = torch::autograd::impl::grad_accumulator(slots_[i].tensor);
    if (!accumulator) continue;  // cannot happen for a leaf that requires grad
    hooks_.emplace_back(accumulator, accumulator->add_post_hook(std::make_unique<GradReadyHook>([this, i] {
      torch::NoGradGuard no_grad;
      if (packed_[i])
        throw Error(ErrorCode::invalid_argument,
                    "tutti::libtorch::ShardedOptimizer (rank " + std::to_string(comm_.rank()) + "): the gradient of " +
                        slots_[i].name + " was produced twice before step() (overlap takes one backward per step)");
      pack(i);
      started_in_backward_ += start_ready_buckets();
    })));
  }
}

OverlappedReduce::~OverlappedReduce() {
  for (auto& [accumulator, key] : hooks_) accumulator->del_post_hook(key);
  for (auto& r : requests_) try {
      r.wait();
    } catch (...) {  // a destructor reports nothing; the step that failed has thrown already
    }
}

torch::Tensor OverlappedReduce::finish() {
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
  flat_ = torch::Tensor();
  if (failure) std::rethrow_exception(failure);
  return flat;
}

void OverlappedReduce::pack(std::size_t i) {
  if (!flat_.defined()) {
    flat_ = torch::empty({shard_ * comm_.size()}, torch::kFloat);
    const std::int64_t count = slots_.empty() ? 0 : slots_.back().offset + slots_.back().numel;
    flat_.narrow(0, count, flat_.numel() - count).zero_();  // the padding
  }
  pack_gradient(flat_, slots_[i]);
  packed_[i] = true;
  for (std::size_t b : buckets_of_[i]) --buckets_[b].waiting;
}

std::uint64_t OverlappedReduce::start_ready_buckets() {
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

}  // namespace tutti::libtorch::detail
