// Elastic training: a job that loses a rank goes on with the survivors, in process, from its last
// committed state, and takes in new ranks at its next commit (docs/elastic.md).
//
//   tutti::elastic::Job job;                        // from the launcher's environment
//   MyState state(model);                           // a tutti::elastic::State: save() and load()
//   tutti::elastic::run(job, state, [&](tutti::Communicator& world) {
//     for (; state.step < steps; ++state.step) {
//       train_one_step(world);
//       if (state.step % 10 == 0) state.commit();  // the point to return to; joiners come in here
//     }
//   });
//
// Membership changes in generations. Generation 0 is the launcher's ranks. When a collective
// fails (peer_failure, timeout or aborted: a rank died, hung or left), every survivor leaves the
// training function within the failure-detection time (an error aborts the communicator for every
// rank), goes back to its last commit and meets the others in the job's store: the first to arrive
// closes the next generation once every member of the last one has arrived, is known dead (its
// process is gone, on this host) or has left, or the rendezvous timeout has passed; ranks waiting
// to join are admitted (up to max_ranks). A rank of an older generation that arrives late is
// refused by name. The new world is built, rank 0's state is broadcast (State::sync) and the
// training function runs again. At a commit, ranks waiting to join make every member rebuild the
// same way, without going back.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "tutti/rendezvous.hpp"
#include "tutti/tutti.hpp"

namespace tutti::elastic {

struct Options {
  /// Fewer survivors than this end the job: run() throws Error(aborted) on every survivor, after
  /// the one that closed the rendezvous wrote the last committed state to `checkpoint`.
  int min_ranks = 1;
  /// Joiners past this many ranks wait for a later generation. 0: no maximum.
  int max_ranks = 0;
  /// How long the rendezvous of a new generation waits for members of the last one that neither
  /// arrive nor are known to be gone, and bounds every other wait of the rendezvous.
  /// 0: TUTTI_ELASTIC_TIMEOUT_MS, else TUTTI_TIMEOUT_MS.
  std::chrono::milliseconds timeout{0};
  /// Where the last committed state goes when the job falls below min_ranks ("": nowhere;
  /// default TUTTI_ELASTIC_CHECKPOINT). When the file exists as a job starts, run() starts from
  /// it: rank 0 loads it and State::sync gives it to every rank, so the same command goes on.
  std::string checkpoint;
};

/// Thrown by State::commit() on every rank when ranks wait to join (Horovod's
/// HostsUpdatedInterrupt); run() catches it and rebuilds without going back.
class MembershipChanged : public Error {
 public:
  explicit MembershipChanged(const std::string& what) : Error(ErrorCode::aborted, what) {}
};

class Job;

/// Everything the job needs to go on, as bytes: parameters, optimizer state, buffers, the
/// compressor's memory, the sampler's position, the step, RNG states. save() must give the same
/// layout on every rank; load() takes what some rank's save() gave.
class State {
 public:
  virtual ~State() = default;
  /// This rank's state, to return to after a failure. Collective (every rank at the same point):
  /// when ranks wait to join and the job has room, throws MembershipChanged on every rank.
  void commit();
  /// Back to the last commit (run() does it after a failure).
  void restore();
  /// Rank 0's state to every rank, committed there (run() does it in every new generation).
  void sync();
  /// How many commits this rank made (sync counts as one).
  std::uint64_t commits() const { return commits_; }
  /// The last commit, as save() gave it (empty before the first).
  std::span<const std::byte> committed() const { return committed_; }

 protected:
  virtual std::vector<std::byte> save() const = 0;
  virtual void load(std::span<const std::byte> bytes) = 0;
  /// This rank's own part, which differs from rank to rank (a compressor's error-feedback
  /// residuals): commit() keeps it and restore() gives it back with the rest, but sync() does not
  /// send it, and neither does the checkpoint below min_ranks. A rank that joins starts from
  /// load_local of nothing (empty bytes). Default: none.
  virtual std::vector<std::byte> save_local() const { return {}; }
  virtual void load_local(std::span<const std::byte> bytes) { (void)bytes; }

 private:
  friend void run(Job&, State&, const std::function<void(Communicator&)>&);
  Job* job_ = nullptr;
  std::vector<std::byte> committed_, committed_local_;
  std::uint64_t commits_ = 0;
};

/// One rank's membership in an elastic job.
class Job {
 public:
  /// From the launcher's environment (TUTTI_STORE, TUTTI_TOKEN, TUTTI_JOB_ID, TUTTI_RANK,
  /// TUTTI_SIZE): a member of generation 0. With TUTTI_ELASTIC_JOIN=1 instead of a rank: a rank
  /// that joins the running job at its next commit (it waits until admitted, or the job ends).
  /// TUTTI_ELASTIC_MIN_RANKS and TUTTI_ELASTIC_MAX_RANKS set the bounds that `options` leaves at
  /// their defaults.
  explicit Job(Options options = {});
  /// Over a store the caller provides: a member of generation 0 as `rank` of `size`, or (rank <
  /// 0) a joiner.
  Job(KeyValueStore& store, int rank, int size, Options options = {});
  ~Job();
  Job(const Job&) = delete;
  Job& operator=(const Job&) = delete;

  /// The current generation's world.
  Communicator& communicator();
  /// 0 for the launcher's ranks; one more at each change of membership.
  int generation() const;
  /// This rank's name in the job ("host:pid:id"), as errors and the membership name it.
  const std::string& name() const;
  /// The members of the current generation, in rank order.
  const std::vector<std::string>& members() const;
  /// Options::checkpoint, as the job resolved it.
  const std::string& checkpoint() const;
  /// Ranks waiting to join that the next rebuild would admit (reads the store).
  std::int64_t waiting() const;

  /// Leaves the current generation and meets the others in the next one: every survivor calls
  /// it (run() does). `failure` says why ("": ranks joined). Throws Error(aborted) when this rank
  /// was left out (it came late) or the job fell below min_ranks.
  void rebuild(const std::string& failure, const State* state = nullptr);
  /// Tells the store that this rank is gone for good (a finished or leaving rank): a rendezvous
  /// does not wait for it. Local.
  void leave();
  /// Leaves; on rank 0, also tells ranks still waiting to join that training is over (run() does
  /// it when `train` returns). Local.
  void finish();

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

/// Whether the launcher started this process as a rank of an elastic job: TUTTI_ELASTIC=1 (what
/// tutti-run --elastic sets for every rank) or TUTTI_ELASTIC_JOIN=1 (a rank that joins).
bool launched_elastic();

/// Runs `train(world)` until it returns: on peer_failure, timeout or aborted (and
/// MembershipChanged) every survivor rebuilds the job (Job::rebuild), goes back to the last commit
/// (not for MembershipChanged), takes rank 0's state (State::sync) and calls `train` again with
/// the new world. Other errors (mismatch, invalid_argument, ...) end it. On return the rank
/// leaves the job.
void run(Job& job, State& state, const std::function<void(Communicator&)>& train);

}  // namespace tutti::elastic
