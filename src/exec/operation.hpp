// One nonblocking operation: a schedule being run over a transport. Steps start as soon as their
// dependencies complete, so independent steps (and the chunks of a pipelined schedule) overlap.
// Not thread-safe: the owning OperationQueue serializes calls under its lock.
#pragma once

#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "schedule/schedule.hpp"
#include "transport/transport.hpp"

namespace tutti::exec {

class OperationQueue;

class Operation {
 public:
  struct Buffers {
    const void* input = nullptr;
    void* output = nullptr;
  };

  /// A collective: runs `schedule` with message indices numbered per peer in list order.
  Operation(transport::Transport& transport, schedule::Schedule schedule, Buffers buffers, DataType type, ReduceOp op,
            transport::Signature signature);
  /// Point to point: one send or receive with an explicit key.
  static std::unique_ptr<Operation> point_to_point(transport::Transport& transport, bool is_send, void* data,
                                                   std::size_t count, DataType type, int peer,
                                                   transport::MessageKey key, std::string description);

  /// A collective the transport runs itself (the shared-memory direct algorithms): `advance` makes
  /// what progress it can without blocking, returns true once done and throws Error on failure;
  /// `waiting` names the ranks it waits for. It starts only once every earlier collective of the
  /// queue has finished (see exclusive()).
  static std::unique_ptr<Operation> native(transport::Transport& transport, transport::Signature signature,
                                           std::function<bool()> advance, std::function<std::vector<int>()> waiting);
  /// Whether the operation may progress only after every earlier collective finished.
  bool exclusive() const { return static_cast<bool>(advance_); }

  /// Keeps `memory` alive as long as the operation (e.g. a snapshot of an in-place input).
  void own(std::unique_ptr<std::byte[]> memory) { owned_.push_back(std::move(memory)); }
  /// Runs after every step succeeded (e.g. the division of avg), before the operation completes.
  void on_success(std::function<void()> finalize) { finalize_ = std::move(finalize); }

  /// Posts the first steps; call once, in issue order.
  void start();
  /// Advances whatever can advance without blocking. Returns true once finished (or failed).
  bool progress();
  /// Fails the operation (withdrawing every posted step) unless it already finished.
  void fail(const Error& error);

  bool finished() const { return finished_; }
  const std::optional<Error>& error() const { return error_; }
  bool ordered() const { return ordered_; }
  std::uint64_t ordinal = 0;             // issue order within the queue
  std::chrono::milliseconds timeout{0};  // how long a wait may take
  const transport::Signature& signature() const { return signature_; }
  std::string describe() const;
  /// Ranks this operation is still waiting for (posted, uncompleted receives and sends).
  std::vector<int> waiting_for() const;

 private:
  Operation(transport::Transport& transport, DataType type, ReduceOp op);
  void build_graph();
  void add_signature_exchange();
  std::optional<Error> check_signature() const;
  std::byte* address(const schedule::Region& region) const;
  void start_step(std::uint32_t index);
  void complete_step(std::uint32_t index);
  bool progress_native();

  transport::Transport& transport_;
  schedule::Schedule schedule_;
  DataType type_;
  ReduceOp op_;
  std::size_t elem_size_;
  transport::Signature signature_;
  std::string description_;  // point to point
  bool ordered_ = true;
  const std::byte* input_ = nullptr;
  std::byte* output_ = nullptr;
  std::unique_ptr<std::byte[]> scratch_;
  std::vector<std::unique_ptr<std::byte[]>> owned_;
  std::function<void()> finalize_;
  std::function<bool()> advance_;              // native operations
  std::function<std::vector<int>()> waiting_;  // native operations

  std::vector<std::uint32_t> remaining_deps_;
  std::vector<std::uint32_t> dependents_begin_, dependents_;  // CSR
  std::vector<transport::MessageKey> keys_;
  std::unique_ptr<transport::Completion[]> completions_;
  std::vector<std::unique_ptr<std::byte[]>> staging_;  // per step, for transports without native recv_reduce
  std::vector<std::uint32_t> ready_, in_flight_;
  std::size_t completed_ = 0;
  std::uint32_t signature_recv_ = ~std::uint32_t{0};  // the step receiving the ring neighbour's signature
  bool finished_ = false;
  std::optional<Error> error_;
};

}  // namespace tutti::exec
