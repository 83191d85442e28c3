// In-process transport: ranks are threads of one process sharing a Fabric. A message is moved
// by whichever side posts second, straight from the sender's buffer into the receiver's (one
// copy, no intermediate buffer), and a receive-and-reduce reduces straight from the sender's
// buffer. Waiting sleeps on a per-rank condition variable.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <unordered_map>
#include <vector>

#include "transport/transport.hpp"

namespace tutti::transport::inproc {

class Fabric;
struct CommState;

/// One rank's view of one communicator over a Fabric.
class InprocTransport final : public Transport {
 public:
  InprocTransport(std::shared_ptr<Fabric> fabric, std::uint64_t comm_id, std::vector<int> members, int rank);
  bool native_reduce = true;
  int rank() const override { return rank_; }
  int size() const override { return static_cast<int>(members_.size()); }
  std::uint64_t id() const override { return comm_id_; }
  std::string_view name() const override { return "inproc"; }
  Kind kind() const override { return Kind::inproc; }
  std::unique_ptr<Transport> split(std::uint64_t id, const std::vector<int>& ranks, int new_rank) override;
  bool detects_every_mismatch() const override { return true; }
  void announce(const Signature& signature) override;
  void post_send(int peer, const MessageKey& key, const void* data, std::size_t bytes, Completion* done) override;
  void post_recv(int peer, const MessageKey& key, void* data, std::size_t bytes, Completion* done) override;
  bool post_recv_reduce(int peer, const MessageKey& key, void* dst, const void* operand, std::size_t count,
                        DataType type, ReduceOp op, Completion* done) override;
  void cancel(Completion* done) override;
  std::uint64_t generation() const override;
  void wait(std::uint64_t seen, std::chrono::steady_clock::time_point deadline) override;
  void wake() override;
  std::optional<Failure> aborted() const override;
  void abort(const Error& error, std::uint64_t seq) override;

  const std::shared_ptr<Fabric>& fabric() const { return fabric_; }
  std::uint64_t comm_id() const { return comm_id_; }
  const std::vector<int>& members() const { return members_; }  // global rank of each rank

  struct Posted;  // an unmatched send or receive (defined in inproc.cpp)

 private:
  void post(int peer, const MessageKey& key, Posted entry, bool is_send);
  std::shared_ptr<Fabric> fabric_;
  std::uint64_t comm_id_;
  std::vector<int> members_;
  int rank_;
  std::shared_ptr<CommState> state_;
};

/// Creates the fabric and communicator 0 over `p` ranks: one transport per rank. With
/// `native_reduce` false, receive-and-reduce is left to the executor (staging memory), as on a
/// transport that cannot reduce on arrival; tests use it to cover that path.
std::vector<std::unique_ptr<InprocTransport>> make_group(int p, bool native_reduce = true);

/// Registers a new communicator (e.g. from split) over global ranks `members`; every member
/// calls this with the same arguments. Returns this rank's transport.
std::unique_ptr<InprocTransport> join(const std::shared_ptr<Fabric>& fabric, std::uint64_t comm_id,
                                      std::vector<int> members, int rank);

}  // namespace tutti::transport::inproc
