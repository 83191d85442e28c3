// join_run(): the run handshake described in run.hpp.
#include "bootstrap/run.hpp"

#include <algorithm>
#include <thread>

#include "bootstrap/auth.hpp"
#include "core/deadline.hpp"
#include "tutti/types.hpp"

namespace tutti::bootstrap {
namespace {

using Clock = std::chrono::steady_clock;

bool is_run_id(const std::string& text) {
  return text.size() == 16 && text.find_first_not_of("0123456789abcdef") == std::string::npos;
}

std::string job_name(const std::string& job_id) { return job_id.empty() ? "(no job id)" : "'" + job_id + "'"; }

// Claims `rank` in the run: a second process with the same rank and job id (an earlier run of the
// job still alive) is refused here rather than mixed into this run.
void claim_rank(Store& store, const std::string& run_prefix, const std::string& job_id, int rank) {
  if (store.add(run_prefix + "rank/" + std::to_string(rank), 1) != 1)
    throw Error(ErrorCode::invalid_argument,
                "init: rank " + std::to_string(rank) + " of job " + job_name(job_id) +
                    " joined its run twice: two processes have this rank and job id (is an earlier run of the job "
                    "still alive? give every job, and every run of it, its own TUTTI_JOB_ID)");
}

std::string welcome_key(const std::string& job_prefix, std::int64_t ticket) {
  return job_prefix + "welcome/" + std::to_string(ticket);
}

// Rank 0: welcomes every ticket of the job's recent past and future until size − 1 ranks arrived.
void welcome_ranks(Store& store, const std::string& job_prefix, const std::string& run, const std::string& job_id,
                   int size, Clock::time_point deadline, std::chrono::milliseconds timeout) {
  const std::string arrived_key = job_prefix + run + "/arrived";
  std::int64_t next = std::max<std::int64_t>(1, store.add(job_prefix + "tickets", 0) - (size - 2));
  auto pause = std::chrono::milliseconds(1);
  for (;;) {
    const std::int64_t taken = store.add(job_prefix + "tickets", 0);
    for (; next <= taken; ++next) store.set(welcome_key(job_prefix, next), run);
    const std::int64_t arrived = store.add(arrived_key, 0);
    if (arrived >= size - 1) return;
    if (Clock::now() >= deadline)
      throw Error(ErrorCode::timeout, "init: rank 0 of job " + job_name(job_id) + ": " + std::to_string(arrived) +
                                          " of the other " + std::to_string(size - 1) + " ranks arrived within " +
                                          std::to_string(timeout.count()) + " ms");
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::milliseconds(10));
  }
}

// Rank r > 0: the run id rank 0 gave this rank's ticket.
std::string await_welcome(Store& store, const std::string& job_prefix, const std::string& job_id, int rank,
                          Clock::time_point deadline, std::chrono::milliseconds timeout) {
  const std::int64_t ticket = store.add(job_prefix + "tickets", 1);
  std::string run;
  try {
    run = store.get(welcome_key(job_prefix, ticket), core::left_until(deadline));
  } catch (const Error& e) {
    if (e.code() != ErrorCode::timeout) throw;
    throw Error(ErrorCode::timeout, "init: rank " + std::to_string(rank) + " of job " + job_name(job_id) +
                                        ": rank 0 did not let it into the job within " +
                                        std::to_string(timeout.count()) + " ms (is rank 0 running, with this job id?)");
  }
  if (!is_run_id(run))
    throw Error(ErrorCode::invalid_argument,
                "init: the store key '" + welcome_key(job_prefix, ticket) + "' holds no run id (16 hex digits)");
  return run;
}

}  // namespace

std::string join_run(Store& store, const std::string& job_id, int rank, int size, std::chrono::milliseconds timeout) {
  const std::string job_prefix = "tutti/" + job_id + "/";
  const auto deadline = Clock::now() + timeout;
  if (rank == 0) {
    const std::string run = random_hex(8);
    claim_rank(store, job_prefix + run + "/", job_id, 0);
    welcome_ranks(store, job_prefix, run, job_id, size, deadline, timeout);
    return job_prefix + run + "/";
  }
  const std::string run_prefix = job_prefix + await_welcome(store, job_prefix, job_id, rank, deadline, timeout) + "/";
  claim_rank(store, run_prefix, job_id, rank);
  store.add(run_prefix + "arrived", 1);
  return run_prefix;
}

void check_job_id(const std::string& job_id, const std::string& source) {
  constexpr std::size_t max_length = 128;
  const bool plain = std::all_of(job_id.begin(), job_id.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
           std::string_view("._@:+-").find(c) != std::string_view::npos;
  });
  if (job_id.empty() || job_id.size() > max_length || !plain)
    throw Error(ErrorCode::invalid_argument, source + ": the job id '" + job_id.substr(0, max_length) +
                                                 (job_id.size() > max_length ? "...'" : "'") +
                                                 " is not 1 to 128 characters of letters, digits and ._@:+-");
}

}  // namespace tutti::bootstrap
