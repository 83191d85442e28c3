// MpiTransport's setting up and tearing down (mpi_transport.hpp): the constructors, which
// duplicate the caller's communicator into a data and a control communicator, the destructor,
// split() into a sub-job, and the barrier it and set-up use. Messages, progress, cancellation and
// abort are in mpi_transport.cpp.
#include <algorithm>
#include <random>
#include <span>

#include "core/env.hpp"
#include "transport/mpi/mpi_support.hpp"
#include "transport/mpi/mpi_transport.hpp"

namespace tutti::transport::mpi {

namespace {

using clock = std::chrono::steady_clock;

// Bits of tag space: the largest b with 2^b - 1 <= MPI_TAG_UB.
int tag_bits() {
  int* tag_ub = nullptr;
  int flag = 0;
  MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &tag_ub, &flag);
  const long long ub = flag && tag_ub != nullptr ? *tag_ub : 32767;
  int bits = 0;
  while (bits < 31 && (1LL << (bits + 1)) - 1 <= ub) ++bits;
  return bits;
}

}  // namespace

MpiTransport::MpiTransport(MPI_Comm comm) : MpiTransport(comm, core::default_timeout()) {}

MpiTransport::MpiTransport(MPI_Comm comm, std::chrono::milliseconds timeout) : timeout_(timeout) {
  require_usable_mpi("MpiTransport");
  if (comm == MPI_COMM_NULL) throw Error(ErrorCode::invalid_argument, "MpiTransport: comm is MPI_COMM_NULL");
  const auto deadline = clock::now() + timeout_;
  set_up(comm, deadline, "from_mpi");
  // An id no other communicator of the job is likely to draw: rank 0's random draw, shared.
  auto value = std::make_shared<std::uint64_t>(0);
  if (rank_ == 0) {
    std::random_device device;
    *value = (static_cast<std::uint64_t>(device()) << 32) ^ device() ^
             static_cast<std::uint64_t>(clock::now().time_since_epoch().count());
  }
  try {
    MPI_Request request = MPI_REQUEST_NULL;
    {
      auto lock = serialize();
      check(MPI_Ibcast(value.get(), 1, MPI_UINT64_T, 0, collective_, &request), "MPI_Ibcast");
    }
    if (!poll(std::span(&request, 1), deadline, "MPI_Ibcast")) {
      abandon(request, value);
      throw Error(ErrorCode::timeout, "from_mpi: rank " + std::to_string(rank_) + " of " + std::to_string(size_) +
                                          ": MPI_Ibcast of the communicator's id did not complete within " +
                                          std::to_string(timeout_.count()) +
                                          " ms (TUTTI_TIMEOUT_MS): a rank has stopped or left during set-up");
    }
  } catch (...) {
    auto lock = serialize();
    control_.close();
    MPI_Comm_free(&collective_);
    MPI_Comm_free(&point_to_point_);
    throw;
  }
  id_ = *value;
}

MpiTransport::MpiTransport(MPI_Comm comm, std::uint64_t id, std::chrono::milliseconds timeout,
                           clock::time_point deadline)
    : timeout_(timeout), id_(id) {
  set_up(comm, deadline, "split");
}

namespace {

// MPI_Comm_idup polled against `deadline`: the duplicate, or Error(timeout) naming `who` (the
// request is abandoned to MPI with the handle it will write).
MPI_Comm duplicate(MPI_Comm comm, clock::time_point deadline, const char* who, int rank, int size,
                   std::chrono::milliseconds timeout) {
  auto out = std::make_shared<MPI_Comm>(MPI_COMM_NULL);
  MPI_Request request = MPI_REQUEST_NULL;
  {
    auto lock = serialize();
    check(MPI_Comm_idup(comm, out.get(), &request), "MPI_Comm_idup");
  }
  if (!poll(std::span(&request, 1), deadline, "MPI_Comm_idup")) {
    abandon(request, out);
    throw Error(ErrorCode::timeout, std::string(who) + ": rank " + std::to_string(rank) + " of " +
                                        std::to_string(size) + ": MPI_Comm_idup did not complete within " +
                                        std::to_string(timeout.count()) +
                                        " ms (TUTTI_TIMEOUT_MS): some rank of the communicator has not called " + who +
                                        " yet, or has stopped");
  }
  return *out;
}

}  // namespace

void MpiTransport::set_up(MPI_Comm comm, clock::time_point deadline, const char* who) {
  const int bits = tag_bits();
  if (bits < 20)
    throw Error(ErrorCode::unsupported, "MpiTransport: MPI_TAG_UB is below 2^20 - 1; Tutti needs 20 bits of tag");
  index_bits_ = std::min(16, bits - 8);
  seq_bits_ = std::min(15, bits - index_bits_);
  tag_ub_ = static_cast<int>((1LL << bits) - 1);
  {
    auto lock = serialize();
    check(MPI_Comm_rank(comm, &rank_), "MPI_Comm_rank");
    check(MPI_Comm_size(comm, &size_), "MPI_Comm_size");
  }
  // Only the first duplicate is a collective over the caller's communicator, which therefore sees
  // one collective per rank even when a rank comes too late; the others duplicate the first.
  MPI_Comm control = MPI_COMM_NULL;
  try {
    collective_ = duplicate(comm, deadline, who, rank_, size_, timeout_);
    point_to_point_ = duplicate(collective_, deadline, who, rank_, size_, timeout_);
    control = duplicate(collective_, deadline, who, rank_, size_, timeout_);
    auto lock = serialize();
    // Errors come back as codes (and then as tutti::Error), never as MPI's default abort.
    for (MPI_Comm c : {collective_, point_to_point_, control})
      check(MPI_Comm_set_errhandler(c, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler");
    control_.open(control);
    control = MPI_COMM_NULL;
  } catch (...) {
    auto lock = serialize();
    for (MPI_Comm* c : {&collective_, &point_to_point_, &control})
      if (*c != MPI_COMM_NULL) MPI_Comm_free(c);
    throw;
  }
}

MpiTransport::~MpiTransport() {
  if (!mpi_active()) return;  // MPI_Finalize has released everything already
  std::lock_guard lock(mutex_);
  auto mpi_lock = serialize();
  // Operations fail (and cancel their steps) before their queue lets go of the transport, so
  // these are leftovers at most: collectives given up on, which MPI keeps.
  for (std::size_t i = 0; i < requests_.size(); ++i) {
    if (pending_[i].collective != nullptr) {
      abandon(requests_[i], std::move(pending_[i].keep));
      continue;
    }
    MPI_Cancel(&requests_[i]);
    MPI_Request_free(&requests_[i]);
    release_locked(pending_[i]);
  }
  for (MPI_Request& request : detached_) MPI_Request_free(&request);
  control_.close();
  MPI_Comm_free(&collective_);
  MPI_Comm_free(&point_to_point_);
}

// A dissemination barrier of empty messages among the members (parent ranks `ranks`; this rank is
// ranks[index]) on the control communicator, polled against `deadline` and for an abort; `phase`
// keeps the tags of split's two barriers apart.
void MpiTransport::arrive(const std::vector<int>& ranks, int index, int phase, clock::time_point deadline) {
  const int n = static_cast<int>(ranks.size());
  for (int round = 0, step = 1; step < n; ++round, step *= 2) {
    const int to = ranks[static_cast<std::size_t>((index + step) % n)];
    const int from = ranks[static_cast<std::size_t>((index - step + n) % n)];
    MPI_Request requests[2] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL};
    {
      std::lock_guard lock(mutex_);  // the control communicator is the transport's
      auto mpi_lock = serialize();
      const int tag = ControlChannel::barrier_tag + phase * ControlChannel::barrier_rounds + round;
      check(MPI_Isend(nullptr, 0, MPI_BYTE, to, tag, control_.comm(), &requests[0]), "MPI_Isend");
      check(MPI_Irecv(nullptr, 0, MPI_BYTE, from, tag, control_.comm(), &requests[1]), "MPI_Irecv");
    }
    if (poll(requests, deadline, "split", [this] { return aborted().has_value(); })) continue;
    {
      auto mpi_lock = serialize();
      MPI_Cancel(&requests[1]);
      MPI_Wait(&requests[1], MPI_STATUS_IGNORE);                            // a cancelled receive completes at once
      if (requests[0] != MPI_REQUEST_NULL) MPI_Request_free(&requests[0]);  // empty: nothing to keep
    }
    if (auto failure = aborted()) throw failure->error;
    Error error(ErrorCode::timeout, "split: rank " + std::to_string(rank_) + " waited " +
                                        std::to_string(timeout_.count()) + " ms (TUTTI_TIMEOUT_MS) for rank " +
                                        std::to_string(from) + (phase == 0 ? " to arrive" : " to confirm") +
                                        "; the communicator is aborted");
    abort(error, no_seq);
    throw error;
  }
}

std::unique_ptr<Transport> MpiTransport::split(std::uint64_t id, const std::vector<int>& ranks, int new_rank) {
  if (auto failure = aborted()) throw failure->error;
  const auto deadline = clock::now() + timeout_;
  // Only the members call split, so the group-collective MPI_Comm_create_group, not
  // MPI_Comm_split. It has no nonblocking form, so no member may call it unless every member will.
  // One barrier cannot promise that: a late member can pass it on messages its peers sent before
  // they timed out, and would then wait in MPI_Comm_create_group for ever. Hence two. A member
  // leaves the first only once every member has entered it, and enters the second only after
  // leaving the first; so a member that leaves the second knows every member left the first and is
  // waiting in the second, with a fresh deadline that only a member dying now can exhaust. A member
  // that timed out in the first aborts the communicator instead, which ends the others' second.
  arrive(ranks, new_rank, 0, deadline);
  arrive(ranks, new_rank, 1, std::max(deadline, clock::now() + timeout_));
  MPI_Comm sub = MPI_COMM_NULL;
  {
    auto lock = serialize();
    MPI_Group parent = MPI_GROUP_NULL, group = MPI_GROUP_NULL;
    check(MPI_Comm_group(collective_, &parent), "MPI_Comm_group");
    int rc = MPI_Group_incl(parent, static_cast<int>(ranks.size()), ranks.data(), &group);
    MPI_Group_free(&parent);
    check(rc, "MPI_Group_incl");
    rc = MPI_Comm_create_group(collective_, group, static_cast<int>(id % static_cast<std::uint64_t>(tag_ub_)), &sub);
    MPI_Group_free(&group);
    check(rc, "MPI_Comm_create_group");
  }
  std::unique_ptr<MpiTransport> transport;
  try {
    transport.reset(new MpiTransport(sub, id, timeout_, deadline));
  } catch (const Error& error) {
    {
      auto lock = serialize();
      MPI_Comm_free(&sub);
    }
    if (error.code() == ErrorCode::timeout) abort(error, no_seq);  // a member stopped after arriving
    throw;
  }
  {
    auto lock = serialize();
    MPI_Comm_free(&sub);
  }
  if (transport->rank() != new_rank)
    throw Error(ErrorCode::system, "MpiTransport::split: MPI placed this rank at " + std::to_string(transport->rank()) +
                                       ", expected " + std::to_string(new_rank));
  return transport;
}

}  // namespace tutti::transport::mpi
