// The environment variables Tutti parses (core/env.hpp, bootstrap/job.hpp, TUTTI_ALGO, the
// engine's options): the fuzzer's bytes are lines NAME=VALUE, each setting one of the variables
// below (other names are ignored; every variable is unset before each input). Each reader either
// returns something consistent or throws Error(invalid_argument) naming the variable.
#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <string>
#include <string_view>

#include "bootstrap/job.hpp"
#include "comm/comm_impl.hpp"
#include "core/env.hpp"
#include "fuzz_support.hpp"
#include "tutti/engine.hpp"

using tutti::fuzz::require;

namespace {

constexpr const char* variables[] = {"TUTTI_RANK",
                                     "TUTTI_SIZE",
                                     "TUTTI_LOCAL_RANK",
                                     "TUTTI_LOCAL_SIZE",
                                     "TUTTI_STORE",
                                     "TUTTI_TOKEN",
                                     "TUTTI_JOB_ID",
                                     "TUTTI_TRANSPORT",
                                     "TUTTI_TIMEOUT_MS",
                                     "TUTTI_ALGO",
                                     "TUTTI_CYCLE_TIME_MS",
                                     "TUTTI_FUSION_THRESHOLD",
                                     "TUTTI_FIRST_BUCKET_BYTES",
                                     "TUTTI_STALL_WARNING_S",
                                     "TUTTI_STALL_SHUTDOWN_S",
                                     "OMPI_COMM_WORLD_RANK",
                                     "OMPI_COMM_WORLD_SIZE",
                                     "OMPI_COMM_WORLD_LOCAL_RANK",
                                     "OMPI_COMM_WORLD_LOCAL_SIZE",
                                     "OMPI_MCA_ess_base_jobid",
                                     "PMIX_NAMESPACE",
                                     "PMI_RANK",
                                     "PMI_SIZE",
                                     "MPI_LOCALRANKID",
                                     "MPI_LOCALNRANKS",
                                     "SLURM_PROCID",
                                     "SLURM_NTASKS",
                                     "SLURM_LOCALID",
                                     "SLURM_NTASKS_PER_NODE",
                                     "SLURM_TASKS_PER_NODE",
                                     "SLURM_NODEID",
                                     "SLURM_JOB_ID",
                                     "SLURM_STEP_ID"};

bool known(std::string_view name) {
  for (const char* v : variables)
    if (name == v) return true;
  return false;
}

void set_from_input(std::string_view text) {
  for (const char* v : variables) ::unsetenv(v);
  while (!text.empty()) {
    const std::size_t end = std::min(text.find('\n'), text.size());
    const std::string_view line = text.substr(0, end);
    text.remove_prefix(std::min(end + 1, text.size()));
    const std::size_t equals = line.find('=');
    if (equals == std::string_view::npos) continue;
    const std::string name(line.substr(0, equals));
    // setenv stops at a NUL; that is all a real environment can hold anyway.
    const std::string value(line.substr(equals + 1));
    if (known(name)) ::setenv(name.c_str(), value.c_str(), 1);
  }
}

// Runs `read`; an Error must be invalid_argument, and name the variable.
template <typename Read>
void expect_valid_or_named(Read read, const char* what) {
  try {
    read();
  } catch (const tutti::Error& error) {
    require(error.code() == tutti::ErrorCode::invalid_argument, what);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  set_from_input(std::string_view(reinterpret_cast<const char*>(data), size));

  expect_valid_or_named(
      [] {
        const auto job = tutti::bootstrap::detect_job();
        require(job.size >= 1 && job.rank >= 0 && job.rank < job.size, "detect_job: rank outside 0..size-1");
        require(
            job.local_size >= 1 && job.local_size <= job.size && job.local_rank >= 0 && job.local_rank < job.local_size,
            "detect_job: local rank or size inconsistent");
      },
      "detect_job: an error other than invalid_argument");
  expect_valid_or_named(
      [] {
        const auto timeout = tutti::core::default_timeout();
        require(timeout.count() >= 0, "TUTTI_TIMEOUT_MS: a negative timeout");
        // What every operation does with it (UBSan reports an overflow here).
        const auto deadline = std::chrono::steady_clock::now() + timeout;
        require(deadline >= std::chrono::steady_clock::time_point{}, "TUTTI_TIMEOUT_MS: a deadline before the epoch");
      },
      "TUTTI_TIMEOUT_MS: an error other than invalid_argument");
  expect_valid_or_named(
      [] {
        if (const auto algo = tutti::core::env("TUTTI_ALGO")) tutti::comm::choice::parse_forced_algorithms(*algo);
      },
      "TUTTI_ALGO: an error other than invalid_argument");
  expect_valid_or_named(
      [] {
        const auto options = tutti::EngineOptions::from_environment();
        require(options.cycle_time.count() >= 0, "engine: a negative cycle time");
        require(options.stall_warning.count() >= 0 && options.stall_error.count() >= 0,
                "engine: a negative stall time");
      },
      "engine options: an error other than invalid_argument");
  return 0;
}
