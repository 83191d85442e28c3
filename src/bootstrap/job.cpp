// detect_job(): the first launcher whose variables are present wins, in the order tutti-run,
// Open MPI, MPICH/Hydra (PMI), torchrun, Slurm (torchrun's workers under srun carry both; torchrun's
// describe the worker, Slurm's the agent that started it). Values are parsed strictly: a launcher that set something
// odd should fail loudly at start-up, not hang later on a wrong rank or size.
#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <climits>
#include <cstring>
#include <optional>
#include <vector>

#include "bootstrap/job.hpp"
#include "bootstrap/run.hpp"
#include "bootstrap/store.hpp"
#include "core/env.hpp"
#include "core/log.hpp"
#include "tutti/types.hpp"

namespace tutti::bootstrap {
namespace {

[[noreturn]] void bad(const std::string& what) { throw Error(ErrorCode::invalid_argument, what); }

int parse_int(const std::string& text, const char* name) {
  int value = -1;
  const char* end = text.data() + text.size();
  const auto [stop, error] = std::from_chars(text.data(), end, value);
  if (text.empty() || error != std::errc() || stop != end || value < 0)
    bad(std::string(name) + ": expected a non-negative integer, got '" + text + "'");
  return value;
}

std::optional<int> read_int(const char* name) {
  const auto text = core::env(name);
  if (!text) return std::nullopt;
  return parse_int(*text, name);
}

// Sets rank/size (both required) and local rank/size (optional: default to rank and size, right
// for a single host) from the launcher's variable names; checks they are consistent.
void read_ranks(JobInfo& job, const char* rank_name, const char* size_name, const char* local_rank_name,
                const char* local_size_name) {
  const auto rank = read_int(rank_name);
  const auto size = read_int(size_name);
  if (!rank) bad(std::string(size_name) + " is set but " + rank_name + " is not");
  if (!size) bad(std::string(rank_name) + " is set but " + size_name + " is not");
  if (*size < 1) bad(std::string(size_name) + " must be at least 1, got 0");
  if (*rank >= *size)
    bad(std::string(rank_name) + "=" + std::to_string(*rank) + " is not below " + size_name + "=" +
        std::to_string(*size));
  job.rank = *rank;
  job.size = *size;
  job.local_rank = local_rank_name ? read_int(local_rank_name).value_or(*rank) : *rank;
  job.local_size = local_size_name ? read_int(local_size_name).value_or(*size) : *size;
  if (job.local_size < 1 || job.local_size > job.size)
    bad(std::string(local_size_name) + "=" + std::to_string(job.local_size) + " is not in 1.." + size_name + "=" +
        std::to_string(job.size));
  if (job.local_rank >= job.local_size)
    bad(std::string(local_rank_name ? local_rank_name : rank_name) + "=" + std::to_string(job.local_rank) +
        " is not below the local size " + std::to_string(job.local_size));
}

// SLURM_TASKS_PER_NODE lists tasks per node, runs compressed: "2(x3),1" = 2,2,2,1. Walks the runs
// without expanding them: a repeat count comes from outside and may be huge.
int slurm_tasks_on_node(const std::string& text, int node) {
  const char* name = "SLURM_TASKS_PER_NODE";
  std::int64_t first = 0;  // the node index where the current run starts
  std::size_t start = 0;
  while (start <= text.size()) {
    const std::size_t comma = std::min(text.find(',', start), text.size());
    const std::string item = text.substr(start, comma - start);
    const std::size_t paren = item.find("(x");
    int repeat = 1;
    if (paren != std::string::npos) {
      if (item.back() != ')') bad(std::string(name) + ": malformed '" + text + "'");
      repeat = parse_int(item.substr(paren + 2, item.size() - paren - 3), name);
    }
    const int count = parse_int(item.substr(0, paren), name);
    if (node >= first && node < first + repeat) return count;
    first += repeat;  // at most INT_MAX per run and text.size() runs: no overflow in 64 bits
    start = comma + 1;
  }
  bad(std::string(name) + "='" + text + "' has no entry for SLURM_NODEID=" + std::to_string(node));
}

void read_slurm(JobInfo& job, bool ranks) {
  if (ranks) read_ranks(job, "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE");
  if (ranks && !core::env("SLURM_NTASKS_PER_NODE")) {
    if (const auto per_node = core::env("SLURM_TASKS_PER_NODE")) {
      job.local_size = slurm_tasks_on_node(*per_node, read_int("SLURM_NODEID").value_or(0));
      if (job.local_size < 1 || job.local_size > job.size || job.local_rank >= job.local_size)
        bad("SLURM_TASKS_PER_NODE='" + *per_node + "' does not fit SLURM_NTASKS=" + std::to_string(job.size) +
            " and SLURM_LOCALID=" + std::to_string(job.local_rank));
    }
  }
  if (const auto id = core::env("SLURM_JOB_ID")) {
    job.job_id = *id;
    if (const auto step = core::env("SLURM_STEP_ID")) job.job_id += "." + *step;
  }
}

// torchrun (and torch.distributed.launch): RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE. The job
// id is the rendezvous id, and each restart of the workers is a job of its own; torchrun's default
// id "none" is every job's, so it is no id.
void read_torchrun(JobInfo& job, bool ranks) {
  if (ranks) read_ranks(job, "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE");
  const auto id = core::env("TORCHELASTIC_RUN_ID");
  if (id && !id->empty() && *id != "none") {
    job.job_id = *id;
    if (const auto restart = core::env("TORCHELASTIC_RESTART_COUNT")) job.job_id += "." + *restart;
  }
}

}  // namespace

JobInfo detect_job(bool ranks_from_caller) {
  JobInfo job;
  const bool ranks = !ranks_from_caller;
  if (core::env("TUTTI_RANK") || core::env("TUTTI_SIZE")) {
    job.launcher = "tutti-run";
    if (ranks) read_ranks(job, "TUTTI_RANK", "TUTTI_SIZE", "TUTTI_LOCAL_RANK", "TUTTI_LOCAL_SIZE");
  } else if (core::env("OMPI_COMM_WORLD_RANK") || core::env("OMPI_COMM_WORLD_SIZE")) {
    job.launcher = "mpirun";
    if (ranks)
      read_ranks(job, "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
                 "OMPI_COMM_WORLD_LOCAL_SIZE");
    job.job_id = core::env("OMPI_MCA_ess_base_jobid").value_or(core::env("PMIX_NAMESPACE").value_or(""));
  } else if (core::env("PMI_RANK") || core::env("PMI_SIZE")) {
    job.launcher = "mpirun";
    if (ranks) read_ranks(job, "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS");
  } else if (core::env("RANK") || core::env("WORLD_SIZE")) {
    job.launcher = "torchrun";
    read_torchrun(job, ranks);
  } else if (core::env("SLURM_PROCID")) {  // not SLURM_NTASKS alone: sbatch sets it for the batch script too
    job.launcher = "srun";
    read_slurm(job, ranks);
  }
  job.store = core::env("TUTTI_STORE").value_or("");
  job.token = core::env("TUTTI_TOKEN").value_or("");
  if (const auto id = core::env("TUTTI_JOB_ID")) {
    job.job_id = *id;
    check_job_id(job.job_id, "TUTTI_JOB_ID");
  } else if (!job.job_id.empty()) {
    check_job_id(job.job_id, "the job id " + job.launcher + " gave (set TUTTI_JOB_ID to override it)");
  }
  job.transport = core::env("TUTTI_TRANSPORT").value_or("");
  if (!job.transport.empty() && job.transport != "shm" && job.transport != "tcp" && job.transport != "mpi")
    bad("TUTTI_TRANSPORT: expected shm, tcp or mpi, got '" + job.transport + "'");
  return job;
}

namespace {

// mkdir `dir` with mode 0700 unless it exists; true when this call made it.
bool make_directory(const std::string& dir, const char* what) {
  if (::mkdir(dir.c_str(), 0700) == 0) return true;
  if (errno == EEXIST) return false;
  throw Error(ErrorCode::invalid_argument, std::string("init: cannot make ") + what + " '" + dir +
                                               "': " + std::strerror(errno) +
                                               " (set TUTTI_RENDEZVOUS_DIR to a directory on a file system every "
                                               "node sees, or TUTTI_STORE)");
}

}  // namespace

std::string srun_store(const JobInfo& job) {
  if (job.job_id.empty())
    bad("init: started by srun without TUTTI_STORE and without SLURM_JOB_ID: set TUTTI_STORE and TUTTI_JOB_ID");
  std::string base;
  if (const auto dir = core::env("TUTTI_RENDEZVOUS_DIR"); dir && !dir->empty()) {
    base = *dir;
  } else {
    const auto home = core::env("HOME");
    if (!home || home->empty() || !home->starts_with("/"))
      bad("init: started by srun without TUTTI_STORE, and HOME does not name a directory for the rendezvous: set "
          "TUTTI_RENDEZVOUS_DIR to a directory on a file system every node sees, or TUTTI_STORE");
    base = *home + "/.tutti";
    make_directory(base, "the rendezvous directory");
    base += "/rendezvous";
  }
  if (!base.starts_with("/")) bad("TUTTI_RENDEZVOUS_DIR: expected an absolute path, got '" + base + "'");
  make_directory(base, "the rendezvous directory");
  const std::string dir = base + "/slurm-" + job.job_id;  // the id is checked: no '/' in it
  make_directory(dir, "the job's rendezvous directory");
  const std::string url = "file://" + dir;
  if (!private_file_store(url))
    bad("init: the job's rendezvous directory '" + dir +
        "' belongs to another user or others may read or write it; it carries the job's token: remove it, or "
        "set TUTTI_RENDEZVOUS_DIR");
  return url;
}

void remove_srun_store(const std::string& url, int rank) {
  const std::string dir = url.substr(std::strlen("file://"));
  std::string failed;
  if (DIR* listing = ::opendir(dir.c_str())) {
    while (const dirent* entry = ::readdir(listing)) {
      const std::string name = entry->d_name;
      if (name == "." || name == "..") continue;
      if (::unlinkat(::dirfd(listing), name.c_str(), 0) != 0 && failed.empty()) failed = name;
    }
    ::closedir(listing);
  }
  if (::rmdir(dir.c_str()) != 0 && failed.empty()) failed = std::strerror(errno);
  if (!failed.empty())
    core::log(
        core::LogLevel::warn, rank,
        "init: could not remove the job's rendezvous directory '" + dir + "' (" + failed + "); remove it by hand");
}

std::shared_ptr<StoreServer> host_store(const JobInfo& job) {
  if (job.rank != 0 || !job.store.starts_with("tcp://")) return nullptr;
  const auto [host, port] = tcp_store_address(job.store);
  std::shared_ptr<StoreServer> server;
  try {
    server = std::make_shared<StoreServer>(host, port, job.token);
  } catch (const Error& e) {
    if (e.code() != ErrorCode::system) throw;  // no token: the user must hear of it
    if (core::log_enabled(core::LogLevel::info))
      core::log(core::LogLevel::info, job.rank, std::string("not hosting the store (") + e.what() + ")");
    return nullptr;
  }
  if (job.local_size < job.size && (host == "localhost" || host.starts_with("127.") || host == "::1"))
    core::log(core::LogLevel::warn, job.rank,
              "the store listens on " + host + " only (TUTTI_STORE=" + job.store +
                  "), which ranks on other hosts cannot reach: name an address they can reach");
  return server;
}

}  // namespace tutti::bootstrap
