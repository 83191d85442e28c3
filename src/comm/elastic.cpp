// Elastic jobs (include/tutti/elastic.hpp): membership in generations, agreed through the job's
// store, which offers only set, get (waiting) and add, so every decision is a counter.
//
// Generation 0's ranks meet as any run does (bootstrap::join_run: a fresh run id, so that an
// earlier run of the same job id is never read) and publish E = "<run prefix>elastic/" at
// "tutti/<job>/elastic" for joiners. Under E:
//   g<G>/arrived             counter: members of generation G−1 that came to G's rendezvous
//   g<G>/arrival/<a>         the name of the a-th of them
//   g<G>/closers             counter: ranks that took on closing G; g<G>/closer/<k>: the k-th
//   g<G>/c<k>/member/<r>     generation G's rank r, as closer k decided it
//   g<G>/c<k>/admitted       how many tickets are admitted up to G
//   g<G>/c<k>/size           G's size, written last by closer k (0: the job ended there,
//                            g<G>/c<k>/reason says why)
//   g<G>/decided             counter: the first closer to add to it decided G ...
//   g<G>/winner              ... and writes its k here: every rank reads G from c<k>
//   g<G>/world/...           the rendezvous of G's communicator (tutti::init over the store)
//   tickets                  counter: ranks that asked to join
//   joiner/<t>               the name of ticket t's rank; joiner/<t>/generation: G that admitted it
//   left/<name>              counter above 0: that rank is gone for good (finished, or left)
//   finished                 counter above 0: training ended (joiners stop waiting)
//
// The first member of G−1 to arrive at G's rendezvous closes it: once every member of G−1 has
// arrived, is known gone (a leave marker; or, on this host, its process no longer runs) or the
// timeout passed. Survivors keep their order; admitted joiners follow in ticket order. A member
// that arrives after the close finds itself missing from G and is refused by name. A closer that
// dies while closing (known gone, or not done by the timeout and a grace) is replaced by the
// first waiting member to claim the next closers count; it leaves the closers before it out.
// Several closers may then finish, but only the first to add to `decided` decides G.
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <set>
#include <thread>

#include "bootstrap/auth.hpp"
#include "bootstrap/job.hpp"
#include "bootstrap/run.hpp"
#include "bootstrap/store.hpp"
#include "comm/topology.hpp"
#include "core/deadline.hpp"
#include "core/env.hpp"
#include "core/log.hpp"
#include "tutti/elastic.hpp"

namespace tutti::elastic {

namespace {

using clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

[[noreturn]] void ended(const std::string& what) { throw Error(ErrorCode::aborted, "elastic: " + what); }

// A name is "host:pid:id", the host as topology names it (TUTTI_HOST where hosts are emulated):
// whether its process is known to be gone (only on this host: a pid elsewhere says nothing here). A zombie is gone too
// (its parent has not reaped it yet).
bool process_gone(const std::string& name, const std::string& host) {
  const std::size_t last = name.rfind(':');
  const std::size_t middle = last == std::string::npos || last == 0 ? std::string::npos : name.rfind(':', last - 1);
  if (middle == std::string::npos || name.substr(0, middle) != host) return false;
  const pid_t pid = static_cast<pid_t>(std::strtol(name.c_str() + middle + 1, nullptr, 10));
  if (pid <= 0) return false;
  if (::kill(pid, 0) != 0) return errno == ESRCH;
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string text((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
  const std::size_t close = text.rfind(')');
  return close != std::string::npos && close + 2 < text.size() && text[close + 2] == 'Z';
}

// A rank that joins a running job (tutti-run's joiners; a rank started by hand from join.env).
bool joining() { return core::env("TUTTI_ELASTIC_JOIN").value_or("0") == "1"; }

// The option as given, else the variable's value where the option is at its default.
int bound(int value, int default_value, const char* variable) {
  if (value != default_value) return value;
  const auto text = core::env(variable);
  return text ? static_cast<int>(std::min<long long>(core::parse_count(*text, variable), 1 << 30)) : value;
}

// Writes `bytes` to `path` through a file of its own (mode 0600, never through a link), renamed
// into place: a reader sees the old file or the new one, never half.
void write_checkpoint(const std::string& path, std::span<const std::byte> bytes) {
  const std::string part = path + ".part" + std::to_string(::getpid());
  const int fd = ::open(part.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0) ended("cannot write the checkpoint '" + part + "': " + std::strerror(errno));
  std::size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    done += static_cast<std::size_t>(n);
  }
  const bool ok = done == bytes.size() && ::fsync(fd) == 0;
  ::close(fd);
  if (!ok || ::rename(part.c_str(), path.c_str()) != 0) {
    ::unlink(part.c_str());
    ended("cannot write the checkpoint '" + path + "'");
  }
}

}  // namespace

struct Job::Impl {
  std::unique_ptr<KeyValueStore> owned;
  KeyValueStore* store = nullptr;
  Options options;
  std::string host = comm::topology_host_name();  // TUTTI_HOST where hosts are emulated
  std::string name;
  std::string prefix;  // E
  int generation = -1;
  std::vector<std::string> members;
  std::int64_t admitted = 0;
  std::vector<std::unique_ptr<bootstrap::PrefixStore>> worlds;  // each generation's, alive with its world
  Communicator world;

  std::string key(int g, const std::string& rest) const { return prefix + "g" + std::to_string(g) + "/" + rest; }
  // What closer k decided of generation g.
  std::string decision(int g, std::int64_t k, const std::string& rest) const {
    return key(g, "c" + std::to_string(k) + "/" + rest);
  }
  std::int64_t counter(const std::string& k) const { return store->add(k, 0); }
  bool gone(const std::string& member) const {
    return counter(prefix + "left/" + member) > 0 || process_gone(member, host);
  }

  void start(const std::string& job_id, int rank, int size) {
    if (options.timeout.count() == 0) {
      const auto text = core::env("TUTTI_ELASTIC_TIMEOUT_MS");
      options.timeout = text ? milliseconds(core::parse_count(*text, "TUTTI_ELASTIC_TIMEOUT_MS")) : milliseconds(0);
      if (options.timeout.count() == 0) options.timeout = core::default_timeout();
    }
    if (options.checkpoint.empty()) options.checkpoint = core::env("TUTTI_ELASTIC_CHECKPOINT").value_or("");
    options.min_ranks = bound(options.min_ranks, 1, "TUTTI_ELASTIC_MIN_RANKS");
    options.max_ranks = bound(options.max_ranks, 0, "TUTTI_ELASTIC_MAX_RANKS");
    if (options.min_ranks < 1 || (options.max_ranks != 0 && options.max_ranks < options.min_ranks))
      throw Error(ErrorCode::invalid_argument, "elastic: min_ranks " + std::to_string(options.min_ranks) +
                                                   " and max_ranks " + std::to_string(options.max_ranks) +
                                                   " (0: none) do not bound any size");
    name = host + ":" + std::to_string(::getpid()) + ":" + bootstrap::random_hex(4);
    const std::string pointer = "tutti/" + job_id + "/elastic";
    if (rank >= 0) {
      if (size < 1 || rank >= size)
        throw Error(ErrorCode::invalid_argument,
                    "elastic: rank " + std::to_string(rank) + " is not in 0.." + std::to_string(size - 1));
      prefix = bootstrap::join_run(*store, job_id, rank, size, options.timeout) + "elastic/";
      store->set(decision(0, 1, "member/" + std::to_string(rank)), name);
      if (rank == 0) {
        store->set(decision(0, 1, "admitted"), "0");
        store->set(decision(0, 1, "size"), std::to_string(size));
        store->set(key(0, "winner"), "1");
        store->set(pointer, prefix);
      }
      enter(0, "");
      return;
    }
    prefix = store->get(pointer, options.timeout);
    const std::int64_t ticket = store->add(prefix + "tickets", 1);
    const std::string admission = prefix + "joiner/" + std::to_string(ticket);
    store->set(admission, name);
    if (core::log_enabled(core::LogLevel::info))
      core::log(core::LogLevel::info, -1,
                "elastic: " + name + " waits to join (ticket " + std::to_string(ticket) + ")");
    for (;;) {
      try {
        enter(static_cast<int>(core::parse_count(store->get(admission + "/generation", milliseconds(200)),
                                                 "the generation that admitted this rank")),
              "");
        return;
      } catch (const Error& e) {
        if (e.code() != ErrorCode::timeout) throw;
      }
      if (counter(prefix + "finished") > 0) ended(name + " asked to join, but the job finished first");
    }
  }

  // The closer that decided generation g. A member of g−1 waiting for it takes over from a
  // closer that is gone, or that has not decided within the timeout and a grace of its own
  // wait, leaving it out; joiners (admitted by the winner, which wrote it first) never wait.
  std::int64_t winner(int g, const State* state) {
    const milliseconds grace = options.timeout + milliseconds(2000);
    const auto give_up = clock::now() + (static_cast<std::int64_t>(members.size()) + 2) * grace;
    std::int64_t watched = 0;  // the closer this rank waits for
    std::string closer;
    auto since = clock::now();
    for (;;) {
      try {
        return core::parse_count(store->get(key(g, "winner"), milliseconds(100)), "an elastic generation's closer");
      } catch (const Error& e) {
        if (e.code() != ErrorCode::timeout) throw;
      }
      if (clock::now() >= give_up)
        ended("generation " + std::to_string(g) + "'s rendezvous was never closed: " + std::to_string(watched) +
              " rank(s) took it on and none finished");
      // Generation 0 is decided by rank 0 right after the launcher's rendezvous, and a joiner is
      // admitted only once its generation is decided: they wait, never take over.
      if (g == 0 || members.empty()) continue;
      const std::int64_t k = counter(key(g, "closers"));
      if (k != watched) {
        watched = k;
        closer.clear();
        since = clock::now();
      }
      if (k > 0 && closer.empty()) {
        try {
          closer = store->get(key(g, "closer/" + std::to_string(k)), milliseconds(100));
        } catch (const Error& e) {
          if (e.code() != ErrorCode::timeout) throw;
        }
      }
      // No closer yet (the first to arrive died before it took it on), or one that is gone or late.
      const bool closer_gone = !closer.empty() && gone(closer);
      if (!closer_gone && clock::now() - since < grace) continue;
      if (store->add(key(g, "closers"), 1) != k + 1) continue;  // another rank took over first
      core::log(core::LogLevel::warn, -1,
                "elastic: " + name + " takes over closing generation " + std::to_string(g) + " from " +
                    (closer.empty() ? std::string("a rank that never began") : closer) +
                    (closer_gone ? ", which is gone" : ", which did not finish within the timeout"));
      store->set(key(g, "closer/" + std::to_string(k + 1)), name);
      close(g, k + 1, std::string(), state, closer);
    }
  }

  // Takes this rank's place in generation g, once g is decided, and builds g's communicator. A
  // member of g that dies before it is built (between the rendezvous and tutti::init) fails the
  // others' init: they meet again in generation g + 1, as after any failure (generation 0, the
  // launch itself, fails instead).
  void enter(int g, const std::string& refused_as, const State* state = nullptr) {
    std::string was = refused_as;
    for (;;) {
      const std::int64_t k = winner(g, state);
      const int size = static_cast<int>(
          core::parse_count(store->get(decision(g, k, "size"), options.timeout), "an elastic generation's size"));
      if (size == 0) ended(store->get(decision(g, k, "reason"), options.timeout));
      std::vector<std::string> roster;
      int rank = -1;
      for (int r = 0; r < size; ++r) {
        roster.push_back(store->get(decision(g, k, "member/" + std::to_string(r)), options.timeout));
        if (roster.back() == name) rank = r;
      }
      if (rank < 0)
        ended(name + was + " is not a member of generation " + std::to_string(g) +
              ": the others went on without it (it arrived after generation " + std::to_string(g) +
              "'s rendezvous closed)");
      admitted = core::parse_count(store->get(decision(g, k, "admitted"), options.timeout), "admitted");
      generation = g;
      members = std::move(roster);
      worlds.push_back(std::make_unique<bootstrap::PrefixStore>(*store, key(g, "world/")));
      try {
        world = tutti::init(*worlds.back(), rank, size, options.timeout);
        return;
      } catch (const Error& e) {
        const bool lost = e.code() == ErrorCode::peer_failure || e.code() == ErrorCode::timeout;
        if (g == 0 || !lost) throw;
        core::log(core::LogLevel::warn, -1,
                  "elastic: generation " + std::to_string(g) + "'s communicator was not built (" + e.what() +
                      "): its ranks meet again");
        was = " (rank " + std::to_string(rank) + " of generation " + std::to_string(g) + ")";
        const std::string failure = "generation " + std::to_string(g) + " not built: " + e.what();
        arrive(++g, failure, state);
      }
    }
  }

  // This rank comes to generation g's rendezvous; the first to come closes it.
  void arrive(int g, const std::string& failure, const State* state) {
    const std::int64_t arrival = store->add(key(g, "arrived"), 1);
    store->set(key(g, "arrival/" + std::to_string(arrival)), name);
    if (arrival == 1 && store->add(key(g, "closers"), 1) == 1) {
      store->set(key(g, "closer/1"), name);
      close(g, 1, failure, state);
    }
  }

  // Generation g's rendezvous, closed as its k-th closer (the first member of g−1 to arrive, or
  // one that took over from `replaced`, which it leaves out).
  void close(int g, std::int64_t k, const std::string& failure, const State* state, const std::string& replaced = "") {
    if (core::log_enabled(core::LogLevel::info))
      core::log(core::LogLevel::info, -1, "elastic: " + name + " closes generation " + std::to_string(g));
    const auto start_time = clock::now();
    const auto deadline = start_time + options.timeout;
    const std::set<std::string> previous(members.begin(), members.end());
    std::set<std::string> arrived, gone;
    std::int64_t seen = 0;
    for (;;) {
      for (const std::int64_t n = counter(key(g, "arrived")); seen < n; ++seen) {
        const std::string who = store->get(key(g, "arrival/" + std::to_string(seen + 1)), options.timeout);
        if (previous.count(who) > 0) arrived.insert(who);
      }
      for (const std::string& m : members)
        if (gone.count(m) == 0 && (m == replaced || ((arrived.count(m) == 0 || k > 1) && this->gone(m))))
          gone.insert(m);
      std::size_t settled = gone.size();
      for (const std::string& m : arrived) settled += gone.count(m) == 0;
      if (settled >= members.size() || clock::now() >= deadline) break;
      std::this_thread::sleep_for(milliseconds(20));
    }
    std::vector<std::string> roster;
    std::string lost;
    for (const std::string& m : members)
      if (arrived.count(m) > 0 && gone.count(m) == 0)
        roster.push_back(m);
      else
        lost += (lost.empty() ? "" : ", ") + m + (gone.count(m) > 0 ? " (gone)" : " (did not arrive in time)");
    const std::int64_t tickets = counter(prefix + "tickets");
    std::int64_t admit = tickets - admitted;
    if (options.max_ranks > 0)
      admit = std::clamp<std::int64_t>(options.max_ranks - static_cast<std::int64_t>(roster.size()), 0, admit);
    std::vector<std::int64_t> joined;
    for (std::int64_t t = admitted + 1; t <= admitted + admit; ++t) {
      roster.push_back(store->get(prefix + "joiner/" + std::to_string(t), options.timeout));
      joined.push_back(t);
    }
    const auto took = std::chrono::duration_cast<milliseconds>(clock::now() - start_time).count();
    const std::string what = "generation " + std::to_string(g) + ": " + std::to_string(roster.size()) + " rank(s)" +
                             (lost.empty() ? "" : "; lost " + lost) +
                             (joined.empty() ? "" : "; " + std::to_string(joined.size()) + " joined") +
                             (failure.empty() ? "" : "; after: " + failure) + " (rendezvous closed in " +
                             std::to_string(took) + " ms)";
    if (static_cast<int>(roster.size()) < options.min_ranks) {
      std::string reason =
          what + ": fewer than the minimum of " + std::to_string(options.min_ranks) + " ranks, the job ends";
      if (!options.checkpoint.empty() && state != nullptr && !state->committed().empty()) {
        write_checkpoint(options.checkpoint, state->committed());
        reason += "; the last committed state is in " + options.checkpoint;
      }
      store->set(decision(g, k, "reason"), reason);
      store->set(decision(g, k, "size"), "0");
      decide(g, k, {});
      return;
    }
    for (std::size_t r = 0; r < roster.size(); ++r)
      store->set(decision(g, k, "member/" + std::to_string(r)), roster[r]);
    store->set(decision(g, k, "admitted"), std::to_string(admitted + admit));
    store->set(decision(g, k, "size"), std::to_string(roster.size()));
    if (decide(g, k, joined)) core::log(core::LogLevel::warn, -1, "elastic: " + what);
  }

  // Closer k's decision becomes generation g's, unless another closer's did first; the winner
  // tells its joiners they are admitted.
  bool decide(int g, std::int64_t k, const std::vector<std::int64_t>& joined) {
    if (store->add(key(g, "decided"), 1) != 1) return false;
    store->set(key(g, "winner"), std::to_string(k));
    for (const std::int64_t t : joined)
      store->set(prefix + "joiner/" + std::to_string(t) + "/generation", std::to_string(g));
    return true;
  }
};

Job::Job(Options options) : impl_(std::make_unique<Impl>()) {
  impl_->options = std::move(options);
  const bootstrap::JobInfo info = bootstrap::detect_job(/*ranks_from_caller=*/true);
  if (info.store.empty())
    throw Error(ErrorCode::invalid_argument,
                "elastic: no TUTTI_STORE: an elastic job needs a store that outlives "
                "its ranks (tutti-run gives one)");
  impl_->owned = bootstrap::connect_store(info.store, info.token, core::default_timeout());
  impl_->store = impl_->owned.get();
  int rank = -1, size = 0;
  if (!joining()) {
    const bootstrap::JobInfo ranks = bootstrap::detect_job();
    rank = ranks.rank;
    size = ranks.size;
  }
  impl_->start(info.job_id, rank, size);
}

Job::Job(KeyValueStore& store, int rank, int size, Options options) : impl_(std::make_unique<Impl>()) {
  impl_->options = std::move(options);
  impl_->store = &store;
  impl_->start(bootstrap::detect_job(/*ranks_from_caller=*/true).job_id, rank < 0 ? -1 : rank, size);
}

Job::~Job() = default;

bool launched_elastic() { return joining() || core::env("TUTTI_ELASTIC").value_or("0") == "1"; }

Communicator& Job::communicator() { return impl_->world; }
int Job::generation() const { return impl_->generation; }
const std::string& Job::name() const { return impl_->name; }
const std::vector<std::string>& Job::members() const { return impl_->members; }
const std::string& Job::checkpoint() const { return impl_->options.checkpoint; }

std::int64_t Job::waiting() const {
  const std::int64_t size = static_cast<std::int64_t>(impl_->members.size());
  if (impl_->options.max_ranks > 0 && size >= impl_->options.max_ranks) return 0;
  return impl_->counter(impl_->prefix + "tickets") - impl_->admitted;
}

void Job::rebuild(const std::string& failure, const State* state) {
  Impl& job = *impl_;
  const int g = job.generation + 1;
  const std::string was =
      " (rank " + std::to_string(job.world.rank()) + " of generation " + std::to_string(job.generation) + ")";
  job.world = Communicator();
  job.arrive(g, failure, state);
  job.enter(g, was, state);
}

void Job::leave() { impl_->store->add(impl_->prefix + "left/" + impl_->name, 1); }

void Job::finish() {
  leave();
  if (impl_->world.rank() == 0) impl_->store->add(impl_->prefix + "finished", 1);
}

}  // namespace tutti::elastic
