// tutti-run: starts the ranks of a Tutti job on this host and supervises them (a small mpirun).
//
//   tutti-run -n N [--transport shm|tcp] [--timeout-ms T] [--grace-period S]
//             [--tag-output | --no-tag-output] PROGRAM ARGS...
//
// See usage_text below for everything it promises; supervisor.hpp for how.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <exception>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "job.hpp"
#include "output.hpp"
#include "supervisor.hpp"
#include "watchdog.hpp"

namespace {

using namespace tutti::launcher;

constexpr int max_ranks = 1024;

constexpr std::string_view usage_line =
    "usage: tutti-run -n N [--transport shm|tcp] [--timeout-ms T] [--grace-period S] [-x NAME[=VALUE]]\n"
    "                 [--elastic [--min-ranks M] [--max-ranks M]] [--tag-output | --no-tag-output]\n"
    "                 [--] PROGRAM [ARGS...]\n";

constexpr std::string_view usage_text = R"(
Starts N ranks of PROGRAM on this host, one process each, and supervises them: their output is
forwarded line by line, the failure of one rank ends the job, and what the job made is removed.

Options (they end at PROGRAM, or at "--"):
  -n, -np, --np N       number of ranks, 1 to 1024 (required)
  --transport shm|tcp   how the ranks exchange data (sets TUTTI_TRANSPORT; default: the
                        library's choice, shared memory within a host)
  --timeout-ms T        default deadline of every operation, in milliseconds
                        (sets TUTTI_TIMEOUT_MS)
  --grace-period S      seconds the other ranks get to finish, and to report the failure, after
                        one rank fails; then those still running are killed (SIGKILL).
                        Default 10; 0 kills them at once; fractions are allowed
  -x NAME[=VALUE]       as mpirun's -x: set NAME to VALUE for every rank (NAME alone passes
                        tutti-run's own value, which the ranks get anyway); repeatable
  --elastic             an elastic job (tutti::elastic, docs/elastic.md): a rank that fails does
                        not end the job, the others go on without it; SIGUSR1 to tutti-run
                        starts a rank that joins at the job's next commit, and DIR/join.env
                        (printed at the start) holds what a rank started by hand needs to join
  --min-ranks M         with --elastic: fewer ranks end the job (sets TUTTI_ELASTIC_MIN_RANKS)
  --max-ranks M         with --elastic: joiners past M ranks wait (sets TUTTI_ELASTIC_MAX_RANKS)
  --tag-output          prefix every line a rank writes with "[RANK] " (default)
  --no-tag-output       forward the ranks' lines as they are
  -h, --help            print this help and exit

Environment of every rank (tutti-run's own environment, plus):
  TUTTI_RANK, TUTTI_LOCAL_RANK   the rank, 0 to N-1
  TUTTI_SIZE, TUTTI_LOCAL_SIZE   N
  TUTTI_JOB_ID       16 random hex digits, the same for every rank of the job
  TUTTI_TOKEN        64 random hex digits, a secret drawn afresh for every job
  TUTTI_STORE        file:///DIR, DIR a new private directory (mode 0700) named
                     tutti-JOBID in $TMPDIR (or /tmp) for the ranks' rendezvous
  TUTTI_TRANSPORT    only with --transport
  TUTTI_TIMEOUT_MS   only with --timeout-ms
  TUTTI_ELASTIC=1    only with --elastic (hvd.init() then joins the elastic job), and
                     TUTTI_ELASTIC_MIN_RANKS / TUTTI_ELASTIC_MAX_RANKS with their options;
                     a rank that joins has TUTTI_ELASTIC_JOIN=1 and no rank or size

Input and output:
  Rank 0 reads tutti-run's standard input; the other ranks read /dev/null. What a rank writes
  to stdout goes to tutti-run's stdout, stderr to stderr, a whole line at a time, so lines of
  different ranks never mix; a last line without a newline gets one.

Failures:
  When a rank exits with a non-zero status or is killed by a signal, tutti-run says so on
  stderr, gives the other ranks the grace period, then kills those still running. With
  --elastic it says so and the others go on; the job ends when every rank has exited.
  SIGINT, SIGTERM and SIGHUP sent to tutti-run are forwarded to every rank; a second one kills
  the ranks (SIGKILL).

Clean-up, whatever happened:
  processes the ranks left behind are killed (at a normal end, after 3 s for them to end by
  themselves: a rank started by hand from join.env), and every child is waited for; the store
  directory is removed, and every /dev/shm entry whose name starts with tutti-JOBID.
  If tutti-run itself is killed, even with SIGKILL, the ranks get SIGKILL, and a watchdog
  process (tutti-watchdog) sends SIGTERM to every process of the job still running (each
  process with the job's TUTTI_TOKEN in its environment, and its descendants), SIGKILL to
  those left after 2 s, then removes the same files.

Exit status:
  0          every rank exited with status 0 (with --elastic: some rank did)
  S          the status of the first rank that failed (128+SIG if killed by signal SIG)
  128+SIG    every rank exited with 0, but tutti-run received signal SIG
  1          an error of tutti-run itself
  2          wrong usage
  127        PROGRAM not found or not executable

Several hosts:
  tutti-run starts ranks on this host only. For a job across hosts launch with mpirun or srun,
  e.g. "mpirun -np 16 --hostfile HOSTS PROGRAM" or "srun -N 4 --ntasks-per-node 4 PROGRAM":
  Tutti bootstraps from their variables (OMPI_*, PMI_*, SLURM_*).
)";

struct UsageError {
  std::string message;
};

struct Options {
  JobSettings job;
  double grace_period_s = 10;
  bool tag_output = true;
  bool help = false;
  std::vector<std::string> command;
};

std::optional<long long> parse_integer(const std::string& text) {
  if (text.empty() || text.size() > 18) return std::nullopt;
  long long value = 0;
  for (char c : text) {
    if (c < '0' || c > '9') return std::nullopt;
    value = value * 10 + (c - '0');
  }
  return value;
}

int parse_ranks(const std::string& text) {
  const std::optional<long long> n = parse_integer(text);
  if (!n || *n < 1 || *n > max_ranks) {
    throw UsageError{"-n: expected a number of ranks from 1 to " + std::to_string(max_ranks) + ", got '" + text + "'"};
  }
  return static_cast<int>(*n);
}

double parse_seconds(const std::string& text) {
  char* end = nullptr;
  errno = 0;
  const double s = std::strtod(text.c_str(), &end);
  if (text.empty() || *end != '\0' || errno != 0 || !std::isfinite(s) || s < 0 || s > 1e6) {
    throw UsageError{"--grace-period: expected seconds (a number from 0 to 1e6), got '" + text + "'"};
  }
  return s;
}

// mpirun's -x: "NAME=value" sets NAME for every rank; "NAME" passes tutti-run's own NAME, which
// every rank gets anyway. The variables tutti-run sets itself cannot be overridden.
std::string parse_export(const std::string& text) {
  const std::string name = text.substr(0, text.find('='));
  const bool plain = !name.empty() && (std::isalpha(static_cast<unsigned char>(name[0])) || name[0] == '_') &&
                     std::all_of(name.begin(), name.end(),
                                 [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; });
  if (!plain) throw UsageError{"-x: expected NAME or NAME=VALUE, got '" + text + "'"};
  if (sets_itself(name)) throw UsageError{"-x: tutti-run sets " + name + " itself"};
  return text;
}

// Applies one option (`name`, with `value()` to fetch its argument); false if it is unknown.
template <class Value>
bool apply_option(Options& o, const std::string& name, Value&& value) {
  if (name == "-n" || name == "--np") {
    o.job.ranks = parse_ranks(value());
  } else if (name == "--transport") {
    o.job.transport = value();
    if (o.job.transport != "shm" && o.job.transport != "tcp") {
      throw UsageError{"--transport: expected shm or tcp, got '" + o.job.transport + "'"};
    }
  } else if (name == "--timeout-ms") {
    const std::string text = value();
    o.job.timeout_ms = parse_integer(text);
    if (!o.job.timeout_ms) throw UsageError{"--timeout-ms: expected a non-negative integer, got '" + text + "'"};
  } else if (name == "-x") {
    o.job.exported.push_back(parse_export(value()));
  } else if (name == "--grace-period") {
    o.grace_period_s = parse_seconds(value());
  } else if (name == "--elastic") {
    o.job.elastic = true;
  } else if (name == "--min-ranks" || name == "--max-ranks") {
    const std::string text = value();
    const std::optional<long long> n = parse_integer(text);
    if (!n || *n < 1 || *n > max_ranks)
      throw UsageError{name + ": expected a number of ranks from 1 to " + std::to_string(max_ranks) + ", got '" + text +
                       "'"};
    (name == "--min-ranks" ? o.job.min_ranks : o.job.max_ranks) = static_cast<int>(*n);
  } else if (name == "--tag-output" || name == "--no-tag-output") {
    o.tag_output = name == "--tag-output";
  } else if (name == "-h" || name == "--help") {
    o.help = true;
  } else {
    return false;
  }
  return true;
}

Options parse_options(int argc, char** argv) {
  Options o;
  int i = 1;
  for (; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--") {
      ++i;
      break;
    }
    if (arg.size() < 2 || arg[0] != '-') break;  // PROGRAM
    std::optional<std::string> inline_value;     // --name=value, or -nN
    if (const std::size_t eq = arg.find('='); arg.rfind("--", 0) == 0 && eq != std::string::npos) {
      inline_value = arg.substr(eq + 1);
      arg.resize(eq);
    } else if (arg == "-np") {  // mpirun's spelling
      arg = "--np";
    } else if (arg.rfind("-n", 0) == 0 && arg.size() > 2) {
      inline_value = arg.substr(2);
      arg = "-n";
    }
    auto value = [&]() -> std::string {
      if (inline_value) return *inline_value;
      if (i + 1 >= argc) throw UsageError{arg + " needs a value"};
      return argv[++i];
    };
    if (!apply_option(o, arg, value)) throw UsageError{"unknown option '" + arg + "'"};
    if (o.help) return o;
  }
  o.command.assign(argv + i, argv + argc);
  if (o.job.ranks == 0) throw UsageError{"missing -n N (the number of ranks)"};
  if (o.command.empty()) throw UsageError{"missing PROGRAM"};
  if (!o.job.elastic && (o.job.min_ranks > 0 || o.job.max_ranks > 0))
    throw UsageError{"--min-ranks and --max-ranks need --elastic"};
  if (o.job.max_ranks > 0 && o.job.min_ranks > o.job.max_ranks)
    throw UsageError{"--min-ranks " + std::to_string(o.job.min_ranks) + " is more than --max-ranks " +
                     std::to_string(o.job.max_ranks)};
  if (o.job.max_ranks > 0 && o.job.ranks > o.job.max_ranks)
    throw UsageError{"-n " + std::to_string(o.job.ranks) + " is more than --max-ranks " +
                     std::to_string(o.job.max_ranks)};
  if (o.job.min_ranks > o.job.ranks)
    throw UsageError{"--min-ranks " + std::to_string(o.job.min_ranks) + " is more than -n " +
                     std::to_string(o.job.ranks)};
  return o;
}

// A closed standard descriptor would be reused by the first pipe and confuse the ranks' set-up.
void ensure_standard_fds() {
  for (int fd = 0; fd <= 2; ++fd) {
    if (::fcntl(fd, F_GETFD) < 0 && errno == EBADF) {
      const int null_fd = ::open("/dev/null", fd == 0 ? O_RDONLY : O_WRONLY);
      if (null_fd >= 0 && null_fd != fd) ::close(null_fd);  // lowest free number: it is `fd`
    }
  }
}

int run_job(const Options& options, const sigset_t& original_mask) {
  Job job;  // declared before the supervisor: removed after every process is gone
  // Started before the supervisor makes tutti-run a child subreaper, so that it is not adopted by
  // tutti-run; ends after the supervisor, checking that no process of the job is left.
  Watchdog watchdog(job);
  LaunchSpec spec{options.command, rank_environments(job, options.job), options.grace_period_s, options.tag_output,
                  options.job.elastic ? joiner_environment(job, options.job) : std::vector<std::string>{}};
  if (options.job.elastic) {
    report("elastic job: send SIGUSR1 to tutti-run (pid " + std::to_string(::getpid()) +
           ") to start a rank that joins, or start one by hand: env $(cat " + write_join_file(job, options.job) +
           ") PROGRAM");
  }
  Supervisor supervisor(std::move(spec), original_mask);
  return supervisor.run();
}

}  // namespace

int main(int argc, char** argv) {
  ensure_standard_fds();
  Options options;
  try {
    options = parse_options(argc, argv);
  } catch (const UsageError& e) {
    write_all(STDERR_FILENO, "tutti-run: " + e.message + "\n" + std::string(usage_line) +
                                 "Try 'tutti-run --help' for more information.\n");
    return 2;
  }
  if (options.help) {
    write_all(STDOUT_FILENO, std::string(usage_line) + std::string(usage_text));
    return 0;
  }
  const ProgramLookup program = find_program(options.command[0]);
  if (!program.error.empty()) {
    report("cannot run '" + options.command[0] + "': " + program.error);
    return 127;
  }
  const sigset_t original_mask = block_job_signals();
  try {
    return run_job(options, original_mask);
  } catch (const std::exception& e) {
    report(std::string("error: ") + e.what());
    return 1;
  }
}
