// How a process finds its job: from tutti-run's variables (TUTTI_*), or from mpirun's (OMPI_*,
// PMI_*), torchrun's (RANK, WORLD_SIZE, …) or srun's (SLURM_*).
#pragma once

#include <memory>
#include <string>

namespace tutti::bootstrap {

struct JobInfo {
  int rank = 0;
  int size = 1;
  int local_rank = 0;
  int local_size = 1;
  std::string launcher = "none";  // "tutti-run", "mpirun", "torchrun", "srun" or "none"
  std::string store;              // TUTTI_STORE (may be empty under mpirun)
  std::string token;              // TUTTI_TOKEN
  std::string job_id;             // TUTTI_JOB_ID, or derived from the launcher's job id
  std::string transport;          // TUTTI_TRANSPORT: "", "shm", "tcp" or "mpi"
};

/// Reads the environment. Throws Error(invalid_argument) naming the variable when a value is
/// malformed or inconsistent (rank ≥ size, …). `ranks_from_caller`: the caller knows rank and size
/// (tutti::init(store, rank, size), the torch backend), so the launcher's rank variables are not
/// read, and a harness that sets only some of them (WORLD_SIZE without RANK) is no error; the
/// launcher, its job id, the store, token and transport are read as always.
JobInfo detect_job(bool ranks_from_caller = false);

/// Under srun without TUTTI_STORE: the URL of the job step's own file store,
/// file://${TUTTI_RENDEZVOUS_DIR:-$HOME/.tutti/rendezvous}/slurm-<job id>, which must lie on a file
/// system every node of the step sees (home directories on clusters do). Makes the missing
/// directories with mode 0700. Throws Error(invalid_argument) when Slurm gave no job id, no
/// directory is named, or the step's directory exists but belongs to another user or others may
/// read or write it (it carries the job's token).
std::string srun_store(const JobInfo& job);

/// Removes the directory srun_store() made, once the world is connected (rank 0, after the others
/// stopped reading it). Best effort: a failure is logged, never thrown.
void remove_srun_store(const std::string& url, int rank);

class StoreServer;

/// Rank 0's part of a tcp:// rendezvous: a StoreServer listening on the URL's host and port
/// (that host only: tcp://127.0.0.1:port is reachable from this host alone), or nullptr on other
/// ranks, for other stores, and when the port is served already (someone else hosts the store).
/// Throws Error(invalid_argument) for a malformed URL or a missing token (see require_token).
std::shared_ptr<StoreServer> host_store(const JobInfo& job);

}  // namespace tutti::bootstrap
