// MpiTransport's messages (mpi_transport.hpp): posting sends, receives and the MPI collectives,
// testing them, cancelling and withdrawing, waiting, and abort. Setting up and tearing down are in
// mpi_setup.cpp.
#include "transport/mpi/mpi_transport.hpp"

#include <algorithm>
#include <climits>
#include <thread>

#include "transport/matching.hpp"
#include "transport/mpi/mpi_support.hpp"

namespace tutti::transport::mpi {

namespace {

using clock = std::chrono::steady_clock;

// How long `cancel` waits for MPI to let go of a request before detaching it.
constexpr auto cancel_grace = std::chrono::milliseconds(200);

// MPI counts are ints: a message over INT_MAX bytes travels as one element of a derived type
// (whole GiB chunks, then the rest), so that keys still map to a single MPI message.
bool byte_type(std::size_t bytes, MPI_Datatype& type, int& count, std::string& error) {
  if (bytes <= static_cast<std::size_t>(INT_MAX)) {
    type = MPI_BYTE;
    count = static_cast<int>(bytes);
    return true;
  }
  constexpr std::size_t chunk = std::size_t{1} << 30;
  const std::size_t chunks = bytes / chunk, rest = bytes % chunk;
  MPI_Datatype gib = MPI_DATATYPE_NULL, body = MPI_DATATYPE_NULL;
  int rc = MPI_Type_contiguous(static_cast<int>(chunk), MPI_BYTE, &gib);
  if (rc == MPI_SUCCESS) rc = MPI_Type_contiguous(static_cast<int>(chunks), gib, &body);
  type = body;
  if (rc == MPI_SUCCESS && rest > 0) {
    int lengths[2] = {1, static_cast<int>(rest)};
    MPI_Aint displacements[2] = {0, static_cast<MPI_Aint>(chunks * chunk)};
    MPI_Datatype types[2] = {body, MPI_BYTE};
    rc = MPI_Type_create_struct(2, lengths, displacements, types, &type);
    MPI_Type_free(&body);
  }
  if (gib != MPI_DATATYPE_NULL) MPI_Type_free(&gib);
  if (rc == MPI_SUCCESS) rc = MPI_Type_commit(&type);
  if (rc != MPI_SUCCESS) {
    error = "MPI_Type_create for a " + std::to_string(bytes) + "-byte message failed: " + error_string(rc);
    return false;
  }
  count = 1;
  return true;
}
}  // namespace

int MpiTransport::tag_of(const MessageKey& key, std::string& error) const {
  if (key.channel == Channel::point_to_point) {
    if (key.seq > static_cast<std::uint64_t>(tag_ub_))
      error = "tag " + std::to_string(key.seq) + " exceeds the MPI transport's largest tag " + std::to_string(tag_ub_);
    return static_cast<int>(key.seq & static_cast<std::uint64_t>(tag_ub_));
  }
  const std::uint64_t seq = key.seq & ((std::uint64_t{1} << seq_bits_) - 1);
  const std::uint64_t index = key.index & ((std::uint64_t{1} << index_bits_) - 1);
  return static_cast<int>((seq << index_bits_) | index);
}

void MpiTransport::fail(Completion* done, const std::string& error) {
  done->error = error;
  done->set(Completion::failed);
  wake();
}

void MpiTransport::post(bool is_send, int peer, const MessageKey& key, void* data, std::size_t bytes,
                        Completion* done) {
  prepare(done, peer, key, is_send);
  std::string error;
  const int tag = tag_of(key, error);
  if (peer < 0 || peer >= size_) error = "peer " + std::to_string(peer) + " is not a rank of the communicator";
  if (!error.empty()) return fail(done, error);

  std::lock_guard lock(mutex_);
  auto mpi_lock = serialize();
  Pending pending{done, MPI_BYTE, bytes, peer, nullptr, {}};
  int count = 0;
  if (!byte_type(bytes, pending.type, count, error)) return fail(done, error);
  const MPI_Comm comm = key.channel == Channel::collective ? collective_ : point_to_point_;
  MPI_Request request = MPI_REQUEST_NULL;
  const int rc = is_send ? MPI_Isend(data, count, pending.type, peer, tag, comm, &request)
                         : MPI_Irecv(data, count, pending.type, peer, tag, comm, &request);
  if (rc != MPI_SUCCESS) {
    release_locked(pending);
    return fail(done, std::string(is_send ? "MPI_Isend" : "MPI_Irecv") + " failed: " + error_string(rc));
  }
  requests_.push_back(request);
  pending_.push_back(pending);
}

void MpiTransport::post_send(int peer, const MessageKey& key, const void* data, std::size_t bytes, Completion* done) {
  post(true, peer, key, const_cast<void*>(data), bytes, done);  // MPI_Isend only reads it
}

void MpiTransport::post_recv(int peer, const MessageKey& key, void* data, std::size_t bytes, Completion* done) {
  post(false, peer, key, data, bytes, done);
}

void MpiTransport::release_locked(Pending& pending) {
  if (pending.type != MPI_BYTE) MPI_Type_free(&pending.type);  // MPI lets pending messages finish with it
  pending.type = MPI_BYTE;
}

void MpiTransport::post_collective(const std::function<int(MPI_Comm, MPI_Request*)>& start, const char* what,
                                   Completion* done, std::shared_ptr<void> keep) {
  done->error.clear();
  done->set(Completion::posted);
  std::lock_guard lock(mutex_);
  auto mpi_lock = serialize();
  MPI_Request request = MPI_REQUEST_NULL;
  const int rc = start(collective_, &request);
  if (rc != MPI_SUCCESS) return fail(done, std::string(what) + " failed: " + error_string(rc));
  Pending pending;
  pending.done = done;
  pending.collective = what;
  pending.keep = std::move(keep);
  requests_.push_back(request);
  pending_.push_back(std::move(pending));
}

void MpiTransport::finish_locked(const Pending& pending, MPI_Status& status, int error) {
  Completion* done = pending.done;
  if (pending.collective != nullptr) {
    if (error != MPI_SUCCESS) return fail(done, std::string(pending.collective) + " failed: " + error_string(error));
    return done->set(Completion::done);
  }
  const std::string peer = std::to_string(pending.peer);
  if (done->is_send) {
    if (error != MPI_SUCCESS) return fail(done, "MPI_Isend to rank " + peer + " failed: " + error_string(error));
    return done->set(Completion::done);
  }
  if (error != MPI_SUCCESS) {
    int error_class = 0;
    MPI_Error_class(error, &error_class);
    if (error_class == MPI_ERR_TRUNCATE)
      return fail(done, size_mismatch(pending.peer, std::nullopt, rank_, pending.bytes, done->key));
    return fail(done, "MPI_Irecv from rank " + peer + " failed: " + error_string(error));
  }
  MPI_Count received = 0;
  MPI_Get_elements_x(&status, pending.type, &received);
  if (received != static_cast<MPI_Count>(pending.bytes))
    return fail(done, size_mismatch(pending.peer, static_cast<std::size_t>(received), rank_, pending.bytes, done->key));
  done->set(Completion::done);
}

void MpiTransport::poll_control_locked() const {
  std::optional<Failure> failure;
  {
    auto mpi_lock = serialize();
    failure = control_.poll();
  }
  if (!failure || failure_) return;
  failure_ = std::move(failure);  // a peer failed first: its error is this rank's too
  has_failure_.store(true, std::memory_order_release);
  generation_.fetch_add(1, std::memory_order_acq_rel);
}

void MpiTransport::test_locked() {
  poll_control_locked();
  if (requests_.empty() && detached_.empty()) return;
  auto mpi_lock = serialize();
  std::erase_if(detached_, [](MPI_Request& request) {
    int flag = 0;
    MPI_Test(&request, &flag, MPI_STATUS_IGNORE);
    return flag != 0;
  });
  if (requests_.empty()) return;
  const int n = static_cast<int>(requests_.size());
  indices_.resize(requests_.size());
  statuses_.resize(requests_.size());
  int completed = 0;
  const int rc = MPI_Testsome(n, requests_.data(), &completed, indices_.data(), statuses_.data());
  if (rc != MPI_SUCCESS && rc != MPI_ERR_IN_STATUS) {
    // MPI gave no per-request answer: fail every posted operation rather than wait forever.
    for (Pending& pending : pending_) {
      release_locked(pending);
      fail(pending.done, "MPI_Testsome failed: " + error_string(rc));
    }
    requests_.clear();
    pending_.clear();
    return;
  }
  if (completed == MPI_UNDEFINED || completed == 0) return;
  indices_.resize(static_cast<std::size_t>(completed));
  for (int k = 0; k < completed; ++k) {
    const auto i = static_cast<std::size_t>(indices_[static_cast<std::size_t>(k)]);
    MPI_Status& status = statuses_[static_cast<std::size_t>(k)];
    finish_locked(pending_[i], status, rc == MPI_ERR_IN_STATUS ? status.MPI_ERROR : MPI_SUCCESS);
    release_locked(pending_[i]);
  }
  // Remove from the back so that each swap brings in an element still pending.
  std::sort(indices_.begin(), indices_.end(), std::greater<>());
  for (int index : indices_) {
    const auto i = static_cast<std::size_t>(index);
    requests_[i] = requests_.back();
    requests_.pop_back();
    pending_[i] = pending_.back();
    pending_.pop_back();
  }
  wake();
}

void MpiTransport::progress() {
  std::lock_guard lock(mutex_);
  test_locked();
}

std::pair<MPI_Request, MpiTransport::Pending> MpiTransport::take_locked(std::vector<Pending>::iterator it) {
  const auto i = static_cast<std::size_t>(it - pending_.begin());
  std::pair<MPI_Request, Pending> taken{requests_[i], *it};
  requests_[i] = requests_.back();
  requests_.pop_back();
  pending_[i] = pending_.back();
  pending_.pop_back();
  return taken;
}

void MpiTransport::cancel(Completion* done) {
  std::lock_guard lock(mutex_);
  const auto it = std::find_if(pending_.begin(), pending_.end(), [&](const Pending& p) { return p.done == done; });
  if (it == pending_.end()) return;       // completed (or never reached MPI)
  if (it->collective != nullptr) return;  // MPI cannot cancel a collective: it stays (see post_collective)
  auto [request, pending] = take_locked(it);
  {
    auto mpi_lock = serialize();
    MPI_Cancel(&request);
    release_locked(pending);
  }
  // A cancelled receive completes at once; a send may not be cancellable at all.
  const auto give_up = clock::now() + cancel_grace;
  for (;;) {
    int flag = 0;
    {
      auto mpi_lock = serialize();
      MPI_Test(&request, &flag, MPI_STATUS_IGNORE);
    }
    if (flag) break;
    if (clock::now() >= give_up) {
      detached_.push_back(request);
      break;
    }
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
  done->set(Completion::cancelled);
  wake();
}

// MPI cancels a receive only while no message matched it; a matched one completes (its message
// in flight finishes arriving) and is reported as done, so nothing is lost.
bool MpiTransport::withdraw_recv(Completion* done) {
  std::lock_guard lock(mutex_);
  const auto it = std::find_if(pending_.begin(), pending_.end(), [&](const Pending& p) { return p.done == done; });
  if (it == pending_.end() || it->collective != nullptr || done->is_send) return false;
  auto [request, pending] = take_locked(it);
  MPI_Status status{};
  int cancelled = 0;
  int rc = MPI_SUCCESS;
  {
    auto mpi_lock = serialize();
    MPI_Cancel(&request);
    rc = MPI_Wait(&request, &status);
    MPI_Test_cancelled(&status, &cancelled);
    if (!cancelled) finish_locked(pending, status, rc);
    release_locked(pending);
  }
  if (cancelled) done->set(Completion::cancelled);
  wake();
  return cancelled != 0;
}

void MpiTransport::wait(std::uint64_t seen, clock::time_point deadline) {
  // MPI has no blocking wait with a deadline: poll, yielding the core between polls for up to
  // 500 µs, then napping (50 to 200 µs) so that more ranks than cores still run well. MPI moves a
  // message only while some rank polls (its TCP transport reads the socket inside MPI_Test), so a
  // rank that naps holds up its peers too: with 20 µs before the first nap, an 8-byte allreduce of
  // 2 ranks on 2 hosts took 173-178 µs a call on average against MPI's own 12; with 500 µs, 38-40
  // (docs/performance.md, 2026-12-07, later).
  const auto spin_until = clock::now() + std::chrono::microseconds(500);
  auto nap = std::chrono::microseconds(50);
  while (generation() == seen) {
    {
      std::lock_guard lock(mutex_);
      test_locked();
    }
    const auto now = clock::now();
    if (generation() != seen || now >= deadline) return;
    if (now < spin_until) {
      std::this_thread::yield();
      continue;
    }
    std::this_thread::sleep_for(std::min<clock::duration>(nap, deadline - now));
    nap = std::min(nap * 2, std::chrono::microseconds(200));
  }
}

std::optional<Failure> MpiTransport::aborted() const {
  std::lock_guard lock(mutex_);
  if (!has_failure_.load(std::memory_order_acquire)) poll_control_locked();  // a peer's abort, if one came
  return failure_;
}

void MpiTransport::abort(const Error& error, std::uint64_t seq) {
  {
    std::lock_guard lock(mutex_);
    poll_control_locked();  // a peer's earlier abort is the first error
    if (failure_) return;
    failure_ = Failure{error, seq};
    has_failure_.store(true, std::memory_order_release);
    auto mpi_lock = serialize();
    control_.send_abort(*failure_, rank_, size_);
  }
  wake();
}

}  // namespace tutti::transport::mpi
