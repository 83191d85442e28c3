// One rank's view of one communicator over the TCP hub: a thin layer that maps the
// communicator's ranks to the hub's (global) ranks. Splits share the hub and its connections.
#pragma once

#include <memory>
#include <vector>

#include "transport/tcp/hub.hpp"
#include "transport/transport.hpp"

namespace tutti::transport::tcp {

class TcpTransport final : public Transport {
 public:
  /// Joins communicator `id` over the hub's ranks `members`; this rank is members[rank].
  TcpTransport(std::shared_ptr<Hub> hub, std::uint64_t id, std::vector<int> members, int rank);
  ~TcpTransport() override;
  TcpTransport(const TcpTransport&) = delete;
  TcpTransport& operator=(const TcpTransport&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return static_cast<int>(members_.size()); }
  std::uint64_t id() const override { return id_; }
  std::string_view name() const override { return "tcp"; }
  Kind kind() const override { return Kind::tcp; }
  std::unique_ptr<Transport> split(std::uint64_t id, const std::vector<int>& ranks, int new_rank) override;
  void announce(const Signature& signature) override { hub_->announce(id_, signature); }
  void notify_signature(int peer, std::uint64_t seq) override { hub_->notify_signature(id_, peer, seq); }
  void post_send(int peer, const MessageKey& key, const void* data, std::size_t bytes, Completion* done) override {
    hub_->post_send(id_, peer, key, data, bytes, done);
  }
  void post_recv(int peer, const MessageKey& key, void* data, std::size_t bytes, Completion* done) override {
    hub_->post_recv(id_, peer, key, PostedRecv{data, bytes, done});
  }
  /// Native: the I/O thread combines the elements as they arrive (no staging copy).
  bool post_recv_reduce(int peer, const MessageKey& key, void* dst, const void* operand, std::size_t count,
                        DataType type, ReduceOp op, Completion* done) override {
    hub_->post_recv(id_, peer, key, PostedRecv{dst, count * size_of(type), done, operand, type, op});
    return true;
  }
  void cancel(Completion* done) override { hub_->cancel(id_, done); }
  bool withdraw_recv(Completion* done) override { return hub_->withdraw_recv(id_, done); }
  std::uint64_t generation() const override { return hub_->generation(); }
  void wait(std::uint64_t seen, std::chrono::steady_clock::time_point deadline) override { hub_->wait(seen, deadline); }
  void wake() override { hub_->ring(); }
  std::optional<Failure> aborted() const override { return hub_->failure(*state_); }
  void abort(const Error& error, std::uint64_t seq) override { hub_->abort(id_, error, seq); }

  Hub& hub() { return *hub_; }

 private:
  std::shared_ptr<Hub> hub_;
  std::uint64_t id_;
  std::vector<int> members_;
  int rank_;
  CommState* state_;  // owned by the hub until ~TcpTransport
};

}  // namespace tutti::transport::tcp
