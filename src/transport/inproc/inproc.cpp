#include "transport/inproc/inproc.hpp"

#include <cstring>
#include <thread>

#include "core/copy.hpp"
#include "reduce/reduce.hpp"
#include "transport/matching.hpp"

namespace tutti::transport::inproc {

namespace {

// A sleeping place per rank: completions bump the generation and wake the waiter.
struct Doorbell {
  std::mutex mutex;
  std::condition_variable cv;
  std::atomic<std::uint64_t> generation{0};
  void ring() {
    {
      std::lock_guard lock(mutex);
      generation.fetch_add(1, std::memory_order_acq_rel);
    }
    cv.notify_all();
  }
};

}  // namespace

struct SignatureSlot {
  Signature signature;
  int first_rank = 0;
  int arrived = 0;
};

struct CommState {
  std::vector<int> members;
  std::atomic<bool> has_error{false};  // fast check without the lock
  std::optional<Failure> error;
  std::map<std::uint64_t, SignatureSlot> signatures;
};

struct InprocTransport::Posted {
  enum Kind { send, recv, recv_reduce } kind = send;
  const void* src = nullptr;  // send
  void* dst = nullptr;        // recv, recv_reduce
  const void* operand = nullptr;
  std::size_t bytes = 0;
  DataType type = DataType::u8;
  ReduceOp op = ReduceOp::sum;
  Completion* done = nullptr;
  int owner = 0;       // global rank of the poster
  int owner_rank = 0;  // its rank in the communicator
};

class Fabric {
 public:
  struct Endpoint {
    std::mutex mutex;
    // Unmatched posts, under (global rank of the sender, key, communicator); owned here.
    MatchTable<InprocTransport::Posted*> pending;
    Doorbell bell;
  };
  explicit Fabric(int p) {
    for (int i = 0; i < p; ++i) endpoints.push_back(std::make_unique<Endpoint>());
  }
  ~Fabric() {
    for (auto& e : endpoints)
      for (auto& [key, posted] : e->pending) delete posted;
  }
  std::vector<std::unique_ptr<Endpoint>> endpoints;
  std::mutex comms_mutex;
  std::unordered_map<std::uint64_t, std::shared_ptr<CommState>> comms;
};

InprocTransport::InprocTransport(std::shared_ptr<Fabric> fabric, std::uint64_t comm_id, std::vector<int> members,
                                 int rank)
    : fabric_(std::move(fabric)), comm_id_(comm_id), members_(std::move(members)), rank_(rank) {
  std::lock_guard lock(fabric_->comms_mutex);
  state_ = fabric_->comms.at(comm_id_);
}

void InprocTransport::announce(const Signature& signature) {
  std::optional<Error> mismatch;
  {
    std::lock_guard lock(fabric_->comms_mutex);
    CommState& state = *state_;
    auto [it, inserted] = state.signatures.try_emplace(signature.seq, SignatureSlot{signature, rank_, 0});
    SignatureSlot& slot = it->second;
    if (!inserted && !(slot.signature == signature) && !state.error) {
      mismatch = collective_mismatch(slot.first_rank, slot.signature, rank_, signature);
    }
    if (++slot.arrived == size()) state.signatures.erase(it);
  }
  if (mismatch) abort(*mismatch, signature.seq);
}

namespace {

// Moves the data of a matched pair, then completes both sides. Runs outside every lock.
void deliver(InprocTransport::Posted* send_side, InprocTransport::Posted* recv_side, Fabric& fabric, bool& failed) {
  const std::size_t expected = recv_side->bytes;
  failed = send_side->bytes != expected;
  if (failed) {
    const std::string message =
        size_mismatch(send_side->owner_rank, send_side->bytes, recv_side->owner_rank, expected, recv_side->done->key);
    send_side->done->error = message;
    recv_side->done->error = message;
    send_side->done->set(Completion::failed);
    recv_side->done->set(Completion::failed);
  } else {
    if (recv_side->kind == InprocTransport::Posted::recv) {
      if (expected > 0) core::copy(recv_side->dst, send_side->src, expected);
    } else {
      reduce::apply(recv_side->op, recv_side->type, recv_side->dst, recv_side->operand, send_side->src,
                    expected / size_of(recv_side->type));
    }
    send_side->done->set(Completion::done);
    recv_side->done->set(Completion::done);
  }
  fabric.endpoints[static_cast<std::size_t>(send_side->owner)]->bell.ring();
  fabric.endpoints[static_cast<std::size_t>(recv_side->owner)]->bell.ring();
  delete send_side;
  delete recv_side;
}

}  // namespace

void InprocTransport::post(int peer, const MessageKey& key, Posted entry, bool is_send) {
  const int me = members_[static_cast<std::size_t>(rank_)];
  const int other = members_[static_cast<std::size_t>(peer)];
  entry.owner = me;
  entry.owner_rank = rank_;
  prepare(entry.done, peer, key, is_send);
  // Sends are filed with the receiver, receives with themselves; both under the receiver's key.
  const MatchKey k = match_key(is_send ? me : other, key, comm_id_);
  Fabric::Endpoint& box = *fabric_->endpoints[static_cast<std::size_t>(is_send ? other : me)];
  Posted* mine = new Posted(entry);
  Posted* match = nullptr;
  {
    std::lock_guard lock(box.mutex);
    auto it = box.pending.find(k);
    if (it == box.pending.end()) {
      box.pending.emplace(k, mine);
      return;
    }
    match = it->second;
    box.pending.erase(it);
  }
  bool failed = false;
  if (is_send)
    deliver(mine, match, *fabric_, failed);
  else
    deliver(match, mine, *fabric_, failed);
  (void)failed;
}

void InprocTransport::post_send(int peer, const MessageKey& key, const void* data, std::size_t bytes,
                                Completion* done) {
  Posted p;
  p.kind = Posted::send;
  p.src = data;
  p.bytes = bytes;
  p.done = done;
  post(peer, key, p, true);
}

void InprocTransport::post_recv(int peer, const MessageKey& key, void* data, std::size_t bytes, Completion* done) {
  Posted p;
  p.kind = Posted::recv;
  p.dst = data;
  p.bytes = bytes;
  p.done = done;
  post(peer, key, p, false);
}

bool InprocTransport::post_recv_reduce(int peer, const MessageKey& key, void* dst, const void* operand,
                                       std::size_t count, DataType type, ReduceOp op, Completion* done) {
  if (!native_reduce) return false;
  Posted p;
  p.kind = Posted::recv_reduce;
  p.dst = dst;
  p.operand = operand;
  p.bytes = count * size_of(type);
  p.type = type;
  p.op = op;
  p.done = done;
  post(peer, key, p, false);
  return true;
}

void InprocTransport::cancel(Completion* done) {
  if (done->state() != Completion::posted) return;
  const int me = members_[static_cast<std::size_t>(rank_)];
  const int other = members_[static_cast<std::size_t>(done->peer)];
  const MatchKey k = match_key(done->is_send ? me : other, done->key, comm_id_);
  Fabric::Endpoint& box = *fabric_->endpoints[static_cast<std::size_t>(done->is_send ? other : me)];
  {
    std::lock_guard lock(box.mutex);
    auto it = box.pending.find(k);
    if (it != box.pending.end() && it->second->done == done) {
      delete it->second;
      box.pending.erase(it);
      done->set(Completion::cancelled);
      return;
    }
  }
  // Matched already: the peer's thread is moving the data; it finishes in bounded time.
  while (done->state() == Completion::posted) std::this_thread::yield();
}

std::uint64_t InprocTransport::generation() const {
  const int me = members_[static_cast<std::size_t>(rank_)];
  return fabric_->endpoints[static_cast<std::size_t>(me)]->bell.generation.load(std::memory_order_acquire);
}

void InprocTransport::wait(std::uint64_t seen, std::chrono::steady_clock::time_point deadline) {
  const int me = members_[static_cast<std::size_t>(rank_)];
  Doorbell& bell = fabric_->endpoints[static_cast<std::size_t>(me)]->bell;
  // A short spin catches the common case of a peer finishing within microseconds.
  for (int i = 0; i < 64; ++i) {
    if (bell.generation.load(std::memory_order_acquire) != seen) return;
    std::this_thread::yield();
  }
  std::unique_lock lock(bell.mutex);
  bell.cv.wait_until(lock, deadline, [&] { return bell.generation.load(std::memory_order_acquire) != seen; });
}

void InprocTransport::wake() {
  fabric_->endpoints[static_cast<std::size_t>(members_[static_cast<std::size_t>(rank_)])]->bell.ring();
}

std::optional<Failure> InprocTransport::aborted() const {
  if (!state_->has_error.load(std::memory_order_acquire)) return std::nullopt;
  std::lock_guard lock(fabric_->comms_mutex);
  return state_->error;
}

void InprocTransport::abort(const Error& error, std::uint64_t seq) {
  {
    std::lock_guard lock(fabric_->comms_mutex);
    CommState& state = *state_;
    if (state.error) return;
    state.error = Failure{error, seq};
    state.has_error.store(true, std::memory_order_release);
  }
  for (int member : members_) fabric_->endpoints[static_cast<std::size_t>(member)]->bell.ring();
}

std::unique_ptr<InprocTransport> join(const std::shared_ptr<Fabric>& fabric, std::uint64_t comm_id,
                                      std::vector<int> members, int rank) {
  {
    std::lock_guard lock(fabric->comms_mutex);
    auto [it, inserted] = fabric->comms.try_emplace(comm_id);
    if (inserted) {
      it->second = std::make_shared<CommState>();
      it->second->members = members;
    }
  }
  return std::make_unique<InprocTransport>(fabric, comm_id, std::move(members), rank);
}

std::unique_ptr<Transport> InprocTransport::split(std::uint64_t id, const std::vector<int>& ranks, int new_rank) {
  std::vector<int> members;
  for (int r : ranks) members.push_back(members_[static_cast<std::size_t>(r)]);
  auto transport = join(fabric_, id, std::move(members), new_rank);
  transport->native_reduce = native_reduce;
  return transport;
}

std::vector<std::unique_ptr<InprocTransport>> make_group(int p, bool native_reduce) {
  auto fabric = std::make_shared<Fabric>(p);
  std::vector<int> members(static_cast<std::size_t>(p));
  for (int i = 0; i < p; ++i) members[static_cast<std::size_t>(i)] = i;
  std::vector<std::unique_ptr<InprocTransport>> out;
  for (int i = 0; i < p; ++i) {
    out.push_back(join(fabric, 0, members, i));
    out.back()->native_reduce = native_reduce;
  }
  return out;
}

}  // namespace tutti::transport::inproc
