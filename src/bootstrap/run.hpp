// One run of a job in a store that other jobs, and earlier runs of the same job, may share.
//
// Every key a job writes carries its job id, so concurrent jobs with distinct ids never meet.
// A job run again with the same id (a requeued batch job, a directory reused by hand) would still
// find the keys its earlier run left: host names, addresses of listeners long closed, segment
// names. So each run draws a fresh id of its own, and every key of the run lives under
// "tutti/<job id>/<run id>/". How ranks learn the run id without ever reading a stale one:
//
//   rank r > 0:  t = add("tutti/<job>/tickets", 1)      a ticket number no earlier run was given
//                run = get("tutti/<job>/welcome/<t>")    written only after ticket t was taken
//   rank 0:      run = random; until every rank has arrived (a counter under the run's prefix),
//                write "welcome/<t>" = run for every ticket t taken since it started, and for the
//                last size−1 tickets taken before (ranks that started before rank 0 did).
//
// A welcome is written only for a ticket already taken, and tickets only grow, so the welcome a
// rank waits for cannot be left over from an earlier run. Rank 0 welcomes tickets of dead earlier
// runs too, which is harmless: nobody reads them. Cost: one add per rank; rank 0 polls two
// counters until all arrived (O(size) store operations in all).
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "bootstrap/store.hpp"

namespace tutti::bootstrap {

/// A view of `inner` in which every key is prefixed with `prefix`.
class PrefixStore final : public Store {
 public:
  PrefixStore(Store& inner, std::string prefix) : inner_(inner), prefix_(std::move(prefix)) {}
  void set(const std::string& key, const std::string& value) override { inner_.set(prefix_ + key, value); }
  std::string get(const std::string& key, std::chrono::milliseconds timeout) override {
    return inner_.get(prefix_ + key, timeout);
  }
  std::int64_t add(const std::string& key, std::int64_t delta) override { return inner_.add(prefix_ + key, delta); }
  const std::string& prefix() const { return prefix_; }

 private:
  Store& inner_;
  std::string prefix_;
};

/// Joins this run of job `job_id` (may be empty only for a store private to the job) as `rank`
/// of `size`, as described above, and returns "tutti/<job id>/<run id>/", the prefix of every key
/// of the run. Throws Error(timeout) when rank 0 does not welcome this rank, or not every rank
/// arrives, within `timeout` (the message says which side waited, and names the job id).
std::string join_run(Store& store, const std::string& job_id, int rank, int size, std::chrono::milliseconds timeout);

/// Error(invalid_argument) unless `job_id` is usable in store keys and segment names: 1 to 128
/// characters of [A-Za-z0-9._@:+-]. `source` names where it came from, for the message.
void check_job_id(const std::string& job_id, const std::string& source);

}  // namespace tutti::bootstrap
