// The torch.distributed backend "tutti": a c10d::ProcessGroup over one tutti::Communicator
// (docs/torch-distributed.md).
//
// Every collective checks its tensors (CPU, a type Tutti has, matching sizes), issues the Tutti
// nonblocking twin on contiguous buffers and returns a WorkTutti at once; the work completes when
// the Tutti request does. Operations not listed here raise c10d's "ProcessGroup tutti does not
// support ..." error.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include "c10d/work.hpp"
#include "tutti/tutti.hpp"

namespace tutti::c10d_backend {

class ProcessGroupTutti : public ::c10d::ProcessGroup {
 public:
  /// The group of `comm`'s ranks; `timeout` is the deadline of every operation whose options set
  /// none.
  ProcessGroupTutti(tutti::Communicator comm, std::chrono::milliseconds timeout);
  ~ProcessGroupTutti() override;

  const std::string getBackendName() const override { return "tutti"; }

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

  void setSequenceNumberForGroup() override;
  uint64_t getSequenceNumberForGroup() override;

 private:
  using Issue = std::function<tutti::Request(tutti::Communicator&, const tutti::Options&)>;
  /// Issues `issue` (one thread at a time: Tutti's calls on one communicator are issued in
  /// order) and returns the work that completes with it.
  c10::intrusive_ptr<::c10d::Work> run(::c10d::OpType type, std::chrono::milliseconds timeout, const Issue& issue,
                                       std::vector<at::Tensor> outputs, std::vector<at::Tensor> keep,
                                       std::function<void()> finalize, int source_rank = -1);
  /// A root rank of torch's options, checked against the group's size.
  int root_of(std::int64_t root, const char* what) const;

  tutti::Communicator comm_;
  std::chrono::milliseconds timeout_;
  std::mutex issue_mutex_;
  std::unique_ptr<WorkProgress> progress_;
};

}  // namespace tutti::c10d_backend
