// Shared memory inside a host, TCP across hosts, behind one Transport.
//
// Routing: an operation with a peer on this rank's host goes to the shared-memory transport (the
// peer renumbered among the host's ranks), any other to the TCP transport; Completion::route
// records which, so that `cancel` reaches the one that holds it. Both see every collective's
// announcement: each compares the signatures its own messages carry (shared memory also keeps
// its table among the host's ranks), and since neither sees every pair of ranks, the executor
// adds its ring of signature messages (detects_every_mismatch stays false).
//
// Waiting: the rank sleeps where shared memory wakes it, on its futex doorbell in the segment,
// which the host's peers ring. The TCP hub's I/O thread rings that same doorbell whenever it
// rings its own (a completion, a peer's abort, a lost connection), through the bell it calls for
// us; so one sleep wakes on the completions of either transport at once, without a polling
// thread or a time slice, and the shared-memory wait keeps its deadline (it also wakes at least
// every 100 ms by itself). The generation is the shared-memory one for the same reason. Before it
// sleeps, the wait polls for a moment yielding the core between polls, and polls the TCP sockets
// too (Hub::poll), so that a message from another host completes on the waiting thread, with no
// wake-up of the I/O thread, which stays off the sockets meanwhile. A rank alone on its host has
// no shared-memory part and waits on TCP alone.
//
// Failures: an abort goes to both transports; one that reaches either (a peer's abort, a dead
// peer) is passed on to the other by `progress`, so that every rank sees it whichever way it came.
#include "transport/routed/routed.hpp"

#include <algorithm>
#include <string>
#include <utility>

#include "transport/shm/shm_transport.hpp"
#include "transport/tcp/tcp_transport.hpp"

namespace tutti::transport::routed {

namespace {

constexpr int via_local = 0, via_remote = 1;

std::unique_ptr<tcp::TcpTransport> as_tcp(std::unique_ptr<Transport> transport) {
  auto* tcp = dynamic_cast<tcp::TcpTransport*>(transport.get());
  if (tcp == nullptr)
    throw Error(ErrorCode::invalid_argument, "routed: the transport between hosts must be tcp, got " +
                                                 std::string(transport ? transport->name() : "none"));
  transport.release();
  return std::unique_ptr<tcp::TcpTransport>(tcp);
}

class RoutedTransport final : public Transport {
 public:
  RoutedTransport(std::vector<int> host_of, int rank, std::unique_ptr<Transport> local,
                  std::unique_ptr<tcp::TcpTransport> remote);
  ~RoutedTransport() override {
    if (auto* shm = dynamic_cast<shm::ShmTransport*>(local_.get())) shm->poll_while_waiting(nullptr);
    remote_->hub().remove_bell(this);
  }
  RoutedTransport(const RoutedTransport&) = delete;
  RoutedTransport& operator=(const RoutedTransport&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return static_cast<int>(host_of_.size()); }
  std::uint64_t id() const override { return remote_->id(); }
  std::string_view name() const override { return "shm+tcp"; }
  Kind kind() const override { return Kind::routed; }
  std::unique_ptr<Transport> split(std::uint64_t id, const std::vector<int>& ranks, int new_rank) override;
  void announce(const Signature& signature) override {
    if (local_) local_->announce(signature);
    remote_->announce(signature);
  }
  // A peer on this host compares signatures through the host's table already.
  void notify_signature(int peer, std::uint64_t seq) override {
    if (!is_local(peer)) remote_->notify_signature(peer, seq);
  }
  // A small frame that runs ahead leaves TCP at once here, not with the next (MessageKey::runs_ahead):
  // held back, small rooted calls on 2 hosts x 2 ranks measured 1.5-4x slower (docs/performance.md,
  // 2026-12-07, late night). Within the host it stays marked: shared memory sends it eagerly.
  void post_send(int peer, const MessageKey& key, const void* data, std::size_t bytes, Completion* done) override {
    const auto [transport, there] = route(peer, done);
    MessageKey at_once = key;
    if (transport == remote_.get()) at_once.runs_ahead = false;
    transport->post_send(there, at_once, data, bytes, done);
  }
  void post_recv(int peer, const MessageKey& key, void* data, std::size_t bytes, Completion* done) override {
    const auto [transport, there] = route(peer, done);
    transport->post_recv(there, key, data, bytes, done);
  }
  bool post_recv_reduce(int peer, const MessageKey& key, void* dst, const void* operand, std::size_t count,
                        DataType type, ReduceOp op, Completion* done) override {
    const auto [transport, there] = route(peer, done);
    return transport->post_recv_reduce(there, key, dst, operand, count, type, op, done);
  }
  void cancel(Completion* done) override {
    if (done->route == via_local && local_)
      local_->cancel(done);
    else
      remote_->cancel(done);
  }
  bool withdraw_recv(Completion* done) override {
    return done->route == via_local && local_ ? local_->withdraw_recv(done) : remote_->withdraw_recv(done);
  }
  std::uint64_t generation() const override { return local_ ? local_->generation() : remote_->generation(); }
  void wait(std::uint64_t seen, std::chrono::steady_clock::time_point deadline) override {
    if (local_)
      local_->wait(seen, deadline);
    else
      remote_->wait(seen, deadline);
  }
  void wake() override {
    if (local_)
      local_->wake();
    else
      remote_->wake();
  }
  void relax() override {
    if (local_)
      local_->relax();
    else
      Transport::relax();
  }
  void progress() override;
  std::optional<Failure> aborted() const override;
  void abort(const Error& error, std::uint64_t seq) override {
    if (local_) local_->abort(error, seq);
    remote_->abort(error, seq);
  }

 private:
  bool is_local(int peer) const { return local_ && local_index_[static_cast<std::size_t>(peer)] >= 0; }
  int local_index(int peer) const { return local_index_[static_cast<std::size_t>(peer)]; }
  /// The transport that carries messages with `peer` and the peer's rank in it; notes it on `done`.
  std::pair<Transport*, int> route(int peer, Completion* done) {
    if (is_local(peer)) {
      done->route = via_local;
      return {local_.get(), local_index(peer)};
    }
    done->route = via_remote;
    return {remote_.get(), peer};
  }

  std::vector<int> host_of_;
  std::vector<int> local_index_;  // among the ranks of this rank's host; -1 on other hosts
  int rank_;
  std::unique_ptr<Transport> local_;  // null when this rank is alone on its host
  std::unique_ptr<tcp::TcpTransport> remote_;
};

RoutedTransport::RoutedTransport(std::vector<int> host_of, int rank, std::unique_ptr<Transport> local,
                                 std::unique_ptr<tcp::TcpTransport> remote)
    : host_of_(std::move(host_of)),
      local_index_(host_of_.size(), -1),
      rank_(rank),
      local_(std::move(local)),
      remote_(std::move(remote)) {
  const auto size = static_cast<int>(host_of_.size());
  if (rank_ < 0 || rank_ >= size || remote_->size() != size || remote_->rank() != rank_)
    throw Error(ErrorCode::invalid_argument, "routed: rank " + std::to_string(rank_) + " of " + std::to_string(size) +
                                                 ", but the tcp transport is rank " + std::to_string(remote_->rank()) +
                                                 " of " + std::to_string(remote_->size()));
  std::vector<int> names;  // the host's ranks, as this communicator numbers them
  for (int r = 0; r < size; ++r) {
    if (host_of_[static_cast<std::size_t>(r)] != host_of_[static_cast<std::size_t>(rank_)]) continue;
    local_index_[static_cast<std::size_t>(r)] = static_cast<int>(names.size());
    names.push_back(r);
  }
  const int mine = local_index_[static_cast<std::size_t>(rank_)];
  if (!local_ && names.size() > 1)
    throw Error(ErrorCode::invalid_argument, "routed: rank " + std::to_string(rank_) + " shares its host with " +
                                                 std::to_string(names.size() - 1) +
                                                 " ranks but has no transport to them");
  if (!local_) return;
  if (local_->size() != static_cast<int>(names.size()) || local_->rank() != mine)
    throw Error(ErrorCode::invalid_argument,
                "routed: rank " + std::to_string(rank_) + " is rank " + std::to_string(mine) + " of " +
                    std::to_string(names.size()) + " on its host, but the local transport is rank " +
                    std::to_string(local_->rank()) + " of " + std::to_string(local_->size()));
  if (auto* shm = dynamic_cast<shm::ShmTransport*>(local_.get())) {
    shm->set_rank_names(std::move(names));
    shm->yield_while_waiting();
    tcp::Hub* hub = &remote_->hub();
    shm->poll_while_waiting([hub](bool polling) {
      if (polling)
        hub->poll();
      else
        hub->stop_polling();
    });
  }
  Transport* sleeper = local_.get();
  remote_->hub().add_bell(this, [sleeper] { sleeper->wake(); });
}

// Pure shared memory when every member is on this host (its `direct` algorithms then serve the
// sub-communicator), pure TCP when every member is on a host of its own, else routed again.
std::unique_ptr<Transport> RoutedTransport::split(std::uint64_t id, const std::vector<int>& ranks, int new_rank) {
  const int mine = host_of_[static_cast<std::size_t>(rank_)];
  std::vector<int> hosts, local_members;
  int local_rank = -1;
  for (int r : ranks) {
    hosts.push_back(host_of_[static_cast<std::size_t>(r)]);
    if (hosts.back() != mine) continue;
    if (r == rank_) local_rank = static_cast<int>(local_members.size());
    local_members.push_back(local_index(r));
  }
  if (local_ && local_members.size() == ranks.size()) return local_->split(id, local_members, new_rank);
  std::vector<int> distinct = hosts;
  std::sort(distinct.begin(), distinct.end());
  if (std::adjacent_find(distinct.begin(), distinct.end()) == distinct.end())
    return remote_->split(id, ranks, new_rank);
  std::unique_ptr<Transport> local = local_members.size() > 1 ? local_->split(id, local_members, local_rank) : nullptr;
  return std::make_unique<RoutedTransport>(std::move(hosts), new_rank, std::move(local),
                                           as_tcp(remote_->split(id, ranks, new_rank)));
}

void RoutedTransport::progress() {
  if (!local_) return;  // TCP's I/O thread moves its bytes
  local_->progress();
  const auto local = local_->aborted();
  const auto remote = remote_->aborted();
  if (local && !remote)
    remote_->abort(local->error, local->seq);
  else if (remote && !local)
    local_->abort(remote->error, remote->seq);
}

std::optional<Failure> RoutedTransport::aborted() const {
  if (local_)
    if (auto failure = local_->aborted()) return failure;
  return remote_->aborted();
}

}  // namespace

std::unique_ptr<Transport> make(std::vector<int> host_of, int rank, std::unique_ptr<Transport> local,
                                std::unique_ptr<Transport> remote) {
  return std::make_unique<RoutedTransport>(std::move(host_of), rank, std::move(local), as_tcp(std::move(remote)));
}

}  // namespace tutti::transport::routed
