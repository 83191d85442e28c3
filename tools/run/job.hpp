// What a tutti-run job owns outside its processes: its identity (job id, token), its store
// directory and the shared-memory segments its ranks create; and the environment of its ranks.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <vector>

namespace tutti::launcher {

/// `bytes` random bytes from getrandom(2), as 2*bytes lower-case hex digits. Throws
/// std::system_error if the kernel has no randomness to give.
std::string random_hex(std::size_t bytes);

/// The full path execvp would run for `program`, or an error text (why it cannot be run).
struct ProgramLookup {
  std::string path;
  std::string error;
};
ProgramLookup find_program(const std::string& program);

/// Removes the store directory `store_dir` recursively, and every /dev/shm entry whose name
/// starts with "tutti-<job_id>"; reports (on stderr) what it cannot remove.
void remove_job_files(const std::string& job_id, const std::string& store_dir);

/// A job's identity and resources. The constructor creates the store directory
/// $TMPDIR/tutti-<job id> (or /tmp/...), mode 0700; the destructor removes it recursively, with
/// every /dev/shm entry whose name starts with "tutti-<job id>", whatever the ranks did.
class Job {
 public:
  Job();  // throws std::system_error if the directory cannot be made
  ~Job();
  Job(const Job&) = delete;
  Job& operator=(const Job&) = delete;

  const std::string& id() const { return id_; }        ///< 16 hex digits
  const std::string& token() const { return token_; }  ///< 64 hex digits
  const std::string& store_dir() const { return store_dir_; }
  std::string store_url() const { return "file://" + store_dir_; }

 private:
  std::string id_;
  std::string token_;
  std::string store_dir_;
};

/// What the user asked to put in every rank's environment besides rank and size.
struct JobSettings {
  int ranks = 0;
  std::string transport;                // empty: not set
  std::optional<long long> timeout_ms;  // empty: not set
  std::vector<std::string> exported;    // -x: "NAME=value" (set for every rank) or "NAME" (passed as it is)
  bool elastic = false;                 // --elastic
  int min_ranks = 0;                    // --min-ranks (0: not set)
  int max_ranks = 0;                    // --max-ranks (0: not set)
};

/// Whether tutti-run sets the variable `name` itself (TUTTI_RANK, TUTTI_STORE, ...).
bool sets_itself(const std::string& name);

/// The environment ("NAME=value" strings) of every rank: tutti-run's own, minus the variables it
/// sets, plus TUTTI_RANK, TUTTI_SIZE, TUTTI_LOCAL_RANK, TUTTI_LOCAL_SIZE, TUTTI_JOB_ID,
/// TUTTI_TOKEN, TUTTI_STORE, and TUTTI_TRANSPORT / TUTTI_TIMEOUT_MS / TUTTI_ELASTIC=1 /
/// TUTTI_ELASTIC_MIN_RANKS / TUTTI_ELASTIC_MAX_RANKS when given.
std::vector<std::vector<std::string>> rank_environments(const Job& job, const JobSettings& settings);

/// The environment of a rank that joins an elastic job: a rank's, without rank and size, with
/// TUTTI_ELASTIC_JOIN=1.
std::vector<std::string> joiner_environment(const Job& job, const JobSettings& settings);

/// Writes STORE_DIR/join.env (mode 0600): the variables a rank started by hand needs to join the
/// elastic job, one NAME=value per line (`env $(cat join.env) PROGRAM`). Returns its path; throws
/// std::system_error.
std::string write_join_file(const Job& job, const JobSettings& settings);

}  // namespace tutti::launcher
