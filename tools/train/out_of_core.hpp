// tutti-train's out-of-core mode (--device-memory MB): the network trained under a device-memory
// budget, its saved activations, parameters, gradients and momentum in an offload::Pool
// (tutti/offload.hpp, tutti/torch_offload.hpp), activations and momentum swapped to host as needed.
#pragma once

#include <torch/torch.h>

#include <cstddef>
#include <memory>

#include "model.hpp"
#include "tutti/offload.hpp"
#include "tutti/torch.hpp"

namespace tutti::train {

/// Forward and backward of a NetImpl whose layers keep what backward needs in a pool of
/// `budget_bytes` of device memory (the device from TUTTI_DEVICE, else emulated; it must be
/// host-addressable). Construct it before anything records the parameters' data pointers (the
/// DistributedOptimizer, broadcast_parameters may come after: it writes in place); the net must
/// outlive it. Used from one thread.
class OutOfCore {
 public:
  /// Places the net's parameters and their gradients in the pool (held: they count against the
  /// budget and are never swapped). Error(system) "out of device memory ..." if they alone do not
  /// fit; Error(invalid_argument) for budget_bytes == 0; Error(unsupported) for a device that is
  /// not host-addressable (CUDA).
  OutOfCore(NetImpl& net, std::size_t budget_bytes, bool swap);
  /// Gives the parameters and gradients libtorch memory again (their values kept).
  ~OutOfCore();
  OutOfCore(const OutOfCore&) = delete;
  OutOfCore& operator=(const OutOfCore&) = delete;

  /// The mean cross-entropy loss of the net on `images` ([N, 1, 28, 28], normalized) and `labels`
  /// ([N] int64), equal to loss_of(net.forward(images), labels); calling backward() on it
  /// accumulates the parameters' gradients as libtorch would. Frees what an earlier forward left
  /// unconsumed. With grad mode off (evaluation), the net's own forward (nothing is saved).
  /// Error(system) "out of device memory ..." when a layer's saved tensors cannot fit (with
  /// swapping off: as soon as the budget is full).
  torch::Tensor forward(const torch::Tensor& images, const torch::Tensor& labels);

  /// SGD whose momentum buffers live in the pool (swapped out after each update, prefetched
  /// before use), over the net's parameters; wrap it in DistributedOptimizer like torch's SGD.
  /// Bit for bit torch::optim::SGD's updates. Must not outlive this object.
  std::unique_ptr<tutti::libtorch::OffloadedSGD> make_sgd(const torch::optim::SGDOptions& options);

  /// Peak device bytes, bytes swapped out and in, time waited for swaps, ... (the pool's).
  offload::Counters counters() const { return pool_.counters(); }
  /// Device bytes the parameters and gradients take.
  std::size_t parameter_bytes() const { return parameters_.bytes(); }
  offload::Pool& pool() { return pool_; }

 private:
  NetImpl& net_;
  offload::Pool pool_;
  tutti::libtorch::PooledParameters parameters_;
  tutti::libtorch::ActivationStore store_;
};

}  // namespace tutti::train
