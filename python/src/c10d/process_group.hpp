// The torch.distributed backend "tutti": a c10d backend over one tutti::Communicator
// (docs/torch-distributed.md). On torch 1.x it is a c10d::ProcessGroup, which torch.distributed
// uses as the group itself; from torch 2.0 on, a c10d::Backend, which torch wraps in a
// ProcessGroup of its own (registered for the CPU). The collectives are the same on both: where
// the two APIs differ, TUTTI_C10D_BACKEND (below) decides.
//
// Every collective checks its tensors (CPU, a type Tutti has, matching sizes), issues the Tutti
// nonblocking twin on contiguous buffers and returns a WorkTutti at once; the work completes when
// the Tutti request does. allreduce also takes one sparse COO tensor (ReduceOp.SUM, as Gloo), over
// Tutti's sparse collectives (sparse_allreduce.cpp). Operations not listed here raise c10d's
// "ProcessGroup tutti does not support ..." (1.x) or "Backend tutti does not support ..." (2.x) error.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <torch/version.h>

#if TORCH_VERSION_MAJOR >= 2
#define TUTTI_C10D_BACKEND 1
#include <torch/csrc/distributed/c10d/Backend.hpp>
#else
#define TUTTI_C10D_BACKEND 0
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#endif

#include "c10d/work.hpp"
#include "tutti/sparse.hpp"
#include "tutti/tutti.hpp"

namespace tutti::c10d_backend {

#if TUTTI_C10D_BACKEND
using C10dBase = ::c10d::Backend;
#else
using C10dBase = ::c10d::ProcessGroup;
#endif

class ProcessGroupTutti : public C10dBase {
 public:
  /// The group of `comm`'s ranks; `timeout` is the deadline of every operation whose options set
  /// none.
  ProcessGroupTutti(tutti::Communicator comm, std::chrono::milliseconds timeout);
  ~ProcessGroupTutti() override;

  const std::string getBackendName() const override { return "tutti"; }
  /// The group's Tutti communicator (the same group, not a copy of its members).
  const tutti::Communicator& communicator() const { return comm_; }

  c10::intrusive_ptr<::c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                             const ::c10d::BroadcastOptions& opts) override;
  c10::intrusive_ptr<::c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                             const ::c10d::AllreduceOptions& opts) override;
  c10::intrusive_ptr<::c10d::Work> allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                                       const ::c10d::AllreduceCoalescedOptions& opts) override;
  c10::intrusive_ptr<::c10d::Work> reduce(std::vector<at::Tensor>& tensors, const ::c10d::ReduceOptions& opts) override;
  c10::intrusive_ptr<::c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                             std::vector<at::Tensor>& inputs,
                                             const ::c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<::c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                   const ::c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<::c10d::Work> allgather_coalesced(std::vector<std::vector<at::Tensor>>& outputs,
                                                       std::vector<at::Tensor>& inputs,
                                                       const ::c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<::c10d::Work> gather(std::vector<std::vector<at::Tensor>>& outputs,
                                          std::vector<at::Tensor>& inputs, const ::c10d::GatherOptions& opts) override;
  c10::intrusive_ptr<::c10d::Work> scatter(std::vector<at::Tensor>& outputs,
                                           std::vector<std::vector<at::Tensor>>& inputs,
                                           const ::c10d::ScatterOptions& opts) override;
  c10::intrusive_ptr<::c10d::Work> reduce_scatter(std::vector<at::Tensor>& outputs,
                                                  std::vector<std::vector<at::Tensor>>& inputs,
                                                  const ::c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<::c10d::Work> _reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                        const ::c10d::ReduceScatterOptions& opts) override;
#if TUTTI_C10D_BACKEND
  /// outputs[i] gets every rank's inputs[i] end to end (torch 2.x: all_gather_into_tensor under
  /// _coalescing_manager); one allgather for all of them.
  c10::intrusive_ptr<::c10d::Work> allgather_into_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                   std::vector<at::Tensor>& inputs,
                                                                   const ::c10d::AllgatherOptions& opts) override;
  /// outputs[i] gets the reduction of every rank's block `rank` of inputs[i] (torch 2.x:
  /// reduce_scatter_tensor under _coalescing_manager); one reduce_scatter for all of them.
  c10::intrusive_ptr<::c10d::Work> reduce_scatter_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                   std::vector<at::Tensor>& inputs,
                                                                   const ::c10d::ReduceScatterOptions& opts) override;
#endif
  c10::intrusive_ptr<::c10d::Work> alltoall_base(at::Tensor& output, at::Tensor& input,
                                                 std::vector<int64_t>& output_splits,
                                                 std::vector<int64_t>& input_splits,
                                                 const ::c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<::c10d::Work> alltoall(std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
                                            const ::c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<::c10d::Work> barrier(const ::c10d::BarrierOptions& opts) override;
  c10::intrusive_ptr<::c10d::Work> send(std::vector<at::Tensor>& tensors, int dst, int tag) override;
  c10::intrusive_ptr<::c10d::Work> recv(std::vector<at::Tensor>& tensors, int src, int tag) override;
  c10::intrusive_ptr<::c10d::Work> recvAnysource(std::vector<at::Tensor>& tensors, int tag) override;

  /// Sequence numbers start at 0 on every rank and count the operations issued (the same on
  /// every rank while they issue the same operations, as Gloo's); setting is a no-op.
  void setSequenceNumberForGroup() override {}
  uint64_t getSequenceNumberForGroup() override { return sequence_; }

 private:
  using Issue = std::function<tutti::Request(tutti::Communicator&, const tutti::Options&)>;
  /// Issues `issue` (one thread at a time: Tutti's calls on one communicator are issued in
  /// order) and returns the work that completes with it.
  c10::intrusive_ptr<::c10d::Work> run(::c10d::OpType type, std::chrono::milliseconds timeout, const Issue& issue,
                                       std::vector<at::Tensor> outputs, std::vector<at::Tensor> keep,
                                       std::function<void()> finalize, int source_rank = -1);
  /// A root rank of torch's options, checked against the group's size.
  int root_of(std::int64_t root, const char* what) const;
  /// allreduce of one sparse COO tensor, over tutti's sparse collectives (sparse_allreduce.cpp).
  c10::intrusive_ptr<::c10d::Work> allreduce_sparse_coo(std::vector<at::Tensor>& tensors,
                                                        const ::c10d::AllreduceOptions& opts);

  tutti::Communicator comm_;
  std::chrono::milliseconds timeout_;
  std::mutex issue_mutex_;
  std::atomic<std::uint64_t> sequence_{0};
  std::unique_ptr<WorkProgress> progress_;
  // The sparse calls' own thread and communicator (a split of comm_), made by the first sparse
  // allreduce; destroyed first, since its calls read buffers that progress_'s works hold.
  std::unique_ptr<tutti::sparse::Communicator> sparse_;
};

}  // namespace tutti::c10d_backend
