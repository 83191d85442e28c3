// How a process finds its job: from tutti-run's variables (TUTTI_*), or from mpirun's (OMPI_*,
// PMI_*) or srun's (SLURM_*).
#pragma once

#include <string>

namespace tutti::bootstrap {

struct JobInfo {
  int rank = 0;
  int size = 1;
  int local_rank = 0;
  int local_size = 1;
  std::string launcher = "none";  // "tutti-run", "mpirun", "srun" or "none"
  std::string store;              // TUTTI_STORE (may be empty under mpirun)
  std::string token;              // TUTTI_TOKEN
  std::string job_id;             // TUTTI_JOB_ID, or derived from the launcher's job id
  std::string transport;          // TUTTI_TRANSPORT: "", "shm", "tcp" or "mpi"
};

/// Reads the environment. Throws Error(invalid_argument) naming the variable when a value is
/// malformed or inconsistent (rank ≥ size, …).
JobInfo detect_job();

}  // namespace tutti::bootstrap
