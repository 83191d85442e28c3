// tutti::init(): joining the job the environment describes.
//
// 1. bootstrap::detect_job() reads tutti-run's, mpirun's, torchrun's or srun's variables. A job of
//    one rank without a store needs nobody. More ranks and no store refuses, saying what to set —
//    never a quiet job of one — except under srun, whose ranks meet in a directory of the user's
//    (bootstrap::srun_store) that rank 0 removes once the world is up.
// 2. Under mpirun without TUTTI_STORE (built with MPI), MPI itself bootstraps (MPI_Init_thread if
//    the program has not): rank 0 serves a TCP store with a token of its own and names both to
//    the others through MPI; from there as in 3, so ranks of one host connect through shared
//    memory and ranks of different hosts through TCP. TUTTI_TRANSPORT=mpi gives the world
//    communicator over the mpi transport instead.
// 3. Otherwise the store (TUTTI_STORE; rank 0 hosts a tcp:// store itself when nobody else does)
//    exchanges host names; ranks all on one host use shared memory, ranks each on a host of their
//    own TCP, and otherwise ranks of one host talk through shared memory and ranks of different
//    hosts through TCP (the routed transport). TUTTI_TRANSPORT forces shm or tcp for all pairs.
//    TCP needs TUTTI_TOKEN, unless the store is a directory only this user can read: then rank 0
//    draws the token there.
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <set>

#include "bootstrap/auth.hpp"
#include "bootstrap/job.hpp"
#include "bootstrap/run.hpp"
#include "bootstrap/store.hpp"
#include "comm/access.hpp"
#include "comm/comm_impl.hpp"
#include "comm/tuning.hpp"
#include "core/env.hpp"
#include "core/log.hpp"
#include "transport/routed/routed.hpp"
#include "transport/shm/shm.hpp"
#include "transport/tcp/tcp.hpp"
#include "tutti/rendezvous.hpp"

#ifdef TUTTI_WITH_MPI
#include "tutti/mpi.hpp"
#endif

namespace tutti {

namespace {

constexpr std::uint64_t world_id = 1;

std::string host_name() {
  char name[256] = {};
  if (::gethostname(name, sizeof(name) - 1) != 0) return "localhost";
  return name;
}

#ifdef TUTTI_WITH_MPI
void start_mpi() {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (initialized) return;
  int provided = 0;
  MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided);
  std::atexit([] {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Finalize();
  });
}

// Whether every rank of the job shares this one's host (MPI's shared-memory split says so).
bool mpi_one_host() {
  MPI_Comm local = MPI_COMM_NULL;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &local);
  int local_size = 0, world_size = 0;
  MPI_Comm_size(local, &local_size);
  MPI_Comm_size(MPI_COMM_WORLD, &world_size);
  MPI_Comm_free(&local);
  return local_size == world_size;
}

// The job's store under mpirun without TUTTI_STORE: rank 0 serves a TCP store (with TUTTI_TOKEN,
// or a token it makes) and names it and the token to the others through MPI, the channel the
// launcher already trusts. On one host it listens on loopback; across hosts on TUTTI_TCP_HOST or
// every address, advertised as TUTTI_TCP_HOST or its host name. It serves until destroyed, once
// the world is up (every rank has left the store).
class MpiHostedStore {
 public:
  MpiHostedStore(bootstrap::JobInfo& job, bool one_host) {
    int rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    std::string text;  // "URL\nTOKEN\nJOB ID", or "!" and why rank 0 could not serve
    if (rank == 0) {
      try {
        const std::string token = job.token.empty() ? bootstrap::random_hex() : job.token;
        const auto chosen = core::env("TUTTI_TCP_HOST");
        server_ =
            std::make_unique<bootstrap::StoreServer>(one_host ? "127.0.0.1" : chosen.value_or("0.0.0.0"), 0, token);
        const std::string host = one_host ? "127.0.0.1" : chosen.value_or(host_name());
        const bool ipv6 = host.find(':') != std::string::npos;
        // No job id from the launcher (MPICH's PMI_* has none): rank 0 draws one, so that the job's
        // segment names stay apart from any other job's.
        const std::string id = job.job_id.empty() ? "mpi-" + bootstrap::random_hex(8) : job.job_id;
        text = "tcp://" + (ipv6 ? "[" + host + "]" : host) + ":" + std::to_string(server_->port()) + "\n" + token +
               "\n" + id;
      } catch (const Error& e) {
        text = std::string("!") + e.what();
      }
    }
    // The length first, then the text: a token of any length arrives whole.
    unsigned long long length = text.size();
    MPI_Bcast(&length, 1, MPI_UNSIGNED_LONG_LONG, 0, MPI_COMM_WORLD);
    text.resize(static_cast<std::size_t>(length));
    MPI_Bcast(text.data(), static_cast<int>(length), MPI_CHAR, 0, MPI_COMM_WORLD);
    if (text.starts_with("!"))
      throw Error(ErrorCode::system, "init: rank 0 could not serve the job's store: " + text.substr(1));
    const std::size_t newline = text.find('\n'), last = text.rfind('\n');
    if (newline == std::string::npos || last == newline)
      throw Error(ErrorCode::system, "init: rank 0 sent no store address, token and job id");
    job.store = text.substr(0, newline);
    job.token = text.substr(newline + 1, last - newline - 1);
    job.job_id = text.substr(last + 1);
  }
  MpiHostedStore(const MpiHostedStore&) = delete;
  MpiHostedStore& operator=(const MpiHostedStore&) = delete;

 private:
  std::unique_ptr<bootstrap::StoreServer> server_;
};
#endif

Communicator init_over_store(const bootstrap::JobInfo& job, bool host_store = true);
Communicator join_over_store(const bootstrap::JobInfo& job, bootstrap::Store& store, std::chrono::milliseconds timeout,
                             bool private_store = false);

}  // namespace

Communicator init(KeyValueStore& store, int rank, int size, std::chrono::milliseconds timeout) {
  if (size < 1 || rank < 0 || rank >= size)
    throw Error(ErrorCode::invalid_argument, "init(store): rank " + std::to_string(rank) + " is not in 0.." +
                                                 std::to_string(size - 1) + " (size " + std::to_string(size) + ")");
  comm::choice::load_from_environment();
  if (size == 1) return local_group(1).front();
  // The token, transport and job id still come from the environment; rank and size are the
  // caller's (a subgroup's differ from the launcher's).
  bootstrap::JobInfo job = bootstrap::detect_job(/*ranks_from_caller=*/true);
  if (job.transport == "mpi")
    throw Error(ErrorCode::unsupported, "init(store): TUTTI_TRANSPORT=mpi cannot join through a key-value store");
  job.rank = rank;
  job.size = size;
  return join_over_store(job, store, timeout.count() > 0 ? timeout : core::default_timeout());
}

std::string launcher() { return bootstrap::detect_job().launcher; }

Communicator init() {
  comm::choice::load_from_environment();  // a bad TUTTI_TUNING_FILE fails here, before any connection
  bootstrap::JobInfo job = bootstrap::detect_job();
#ifdef TUTTI_WITH_MPI
  const bool mpi_bootstraps = job.launcher == "mpirun" && job.store.empty();
  if (job.transport == "mpi" || mpi_bootstraps) {
    start_mpi();
    if (job.transport == "mpi") return from_mpi(MPI_COMM_WORLD);
    const MpiHostedStore store(job, mpi_one_host());  // serves until the world is up
    return init_over_store(job, /*host_store=*/false);
  }
#else
  if (job.transport == "mpi")
    throw Error(ErrorCode::unsupported, "init: TUTTI_TRANSPORT=mpi, but this Tutti was built without MPI");
#endif
  // A job of one rank needs nobody: no store, no connection (tutti-run -n 1 still goes through its
  // store, and mpirun -np 1 through MPI's bootstrap above, as more ranks would).
  if (job.size == 1 && job.store.empty()) return local_group(1).front();
  if (job.launcher == "srun" && job.store.empty()) {
    // The step's own directory in the user's rendezvous directory; rank 0 removes it once the world is up.
    job.store = bootstrap::srun_store(job);
    Communicator world = init_over_store(job);
    if (job.rank == 0) bootstrap::remove_srun_store(job.store, job.rank);
    return world;
  }
  return init_over_store(job);
}

namespace {

// "ranks 0-3", "ranks 0,2,5": the ranks of a group, for the log.
std::string rank_list(const std::vector<int>& ranks) {
  const bool consecutive = !ranks.empty() && ranks.back() - ranks.front() + 1 == static_cast<int>(ranks.size());
  if (ranks.size() > 2 && consecutive)
    return "ranks " + std::to_string(ranks.front()) + "-" + std::to_string(ranks.back());
  std::string text = ranks.size() == 1 ? "rank " : "ranks ";
  for (std::size_t i = 0; i < ranks.size(); ++i) text += (i ? "," : "") + std::to_string(ranks[i]);
  return text;
}

// The world's transport. `places[r]`: rank r's host as published ("real" or "real<TAB>topology");
// ranks with equal places share a host. TUTTI_TRANSPORT forces shm or tcp for every pair; by
// default one place gives shared memory, one rank per place TCP, anything else the routed
// transport (shared memory inside a place, TCP between places).
// `private_store`: only this user can read the store (bootstrap::private_file_store), so that rank 0
// may hand the others the TCP transport's token through it when the launcher gave none.
std::unique_ptr<transport::Transport> connect_world(bootstrap::JobInfo job, bootstrap::Store& store,
                                                    const std::vector<std::string>& places, bool one_real_host,
                                                    bool private_store, std::chrono::milliseconds timeout) {
  std::vector<int> host_of;  // index of each rank's place, in order of first appearance
  std::vector<std::string> distinct;
  for (const std::string& place : places) {
    const auto it = std::find(distinct.begin(), distinct.end(), place);
    host_of.push_back(static_cast<int>(it - distinct.begin()));
    if (it == distinct.end()) distinct.push_back(place);
  }
  const int mine = host_of[static_cast<std::size_t>(job.rank)];
  std::vector<int> local;  // the ranks of my place
  for (int r = 0; r < job.size; ++r)
    if (host_of[static_cast<std::size_t>(r)] == mine) local.push_back(r);
  const bool one_place = distinct.size() == 1, spread = distinct.size() == places.size();
  std::string kind = !job.transport.empty() ? job.transport : one_place ? "shm" : spread ? "tcp" : "shm+tcp";
  const auto log = [&](const std::string& text) {
    if (core::log_enabled(core::LogLevel::info)) core::log(core::LogLevel::info, job.rank, "init: " + text);
  };
  // No token, but a private store (srun's default one): rank 0 draws the token there, as tutti-run
  // draws one for its ranks.
  if ((kind == "tcp" || kind == "shm+tcp") && job.token.empty() && private_store) {
    if (job.rank == 0) store.set("tcp-token", bootstrap::random_hex());
    job.token = store.get("tcp-token", timeout);
  }
  // Hosts emulated on one machine (TUTTI_HOST) by a launcher that gave no token: shared memory,
  // as before TCP joined such hosts, rather than a refusal to start.
  if (job.transport.empty() && one_real_host && kind != "shm" && job.token.empty() &&
      core::env("TUTTI_INSECURE").value_or("") != "1") {
    if (job.rank == 0)
      core::log(core::LogLevel::warn, job.rank,
                "init: the ranks name " + std::to_string(distinct.size()) +
                    " hosts (TUTTI_HOST) on one machine, but TCP between them needs TUTTI_TOKEN: shared "
                    "memory among all ranks");
    kind = "shm";
  }
  if (kind == "shm") {
    if (!one_real_host)
      throw Error(ErrorCode::invalid_argument, "init: TUTTI_TRANSPORT=shm, but the ranks run on several hosts");
    log("transport shm: shared memory among all " + std::to_string(job.size) + " ranks");
    return transport::shm::open_world(store, "shm-nonce", job.job_id, job.rank, job.size, world_id, timeout);
  }
  if (kind != "tcp" && kind != "shm+tcp")
    throw Error(ErrorCode::invalid_argument, "TUTTI_TRANSPORT: expected shm, tcp or mpi, got '" + kind + "'");
  // TUTTI_TCP_HOST picks the address to listen on and advertise (a host with several networks).
  const std::string bind_host = core::env("TUTTI_TCP_HOST").value_or(one_real_host ? "127.0.0.1" : "0.0.0.0");
  if (kind == "tcp") {
    log("transport tcp: TCP among all " + std::to_string(job.size) + " ranks");
    return transport::tcp::connect(store, job.token, job.rank, job.size, world_id, bind_host, timeout);
  }
  std::unique_ptr<transport::Transport> shared;  // with the ranks of my place (a world of their own)
  const auto local_rank = static_cast<int>(std::find(local.begin(), local.end(), job.rank) - local.begin());
  if (local.size() > 1)
    shared = transport::shm::open_world(store, "shm-nonce/" + std::to_string(mine), job.job_id, local_rank,
                                        static_cast<int>(local.size()), world_id, timeout);
  auto tcp = transport::tcp::connect(store, job.token, job.rank, job.size, world_id, bind_host, timeout);
  log("transport shm+tcp: shared memory with " + rank_list(local) + " (this host), TCP to the other " +
      std::to_string(job.size - static_cast<int>(local.size())) + " ranks on " + std::to_string(distinct.size() - 1) +
      (distinct.size() == 2 ? " other host" : " other hosts"));
  return transport::routed::make(std::move(host_of), job.rank, std::move(shared), std::move(tcp));
}

// How many places (hosts, real or emulated) the ranks name.
std::size_t hosts_of(const std::vector<std::string>& places) {
  return std::set<std::string>(places.begin(), places.end()).size();
}

// Through the store: rank 0 may host it (tcp://); the ranks learn each other's hosts, then connect.
Communicator init_over_store(const bootstrap::JobInfo& job, bool host_store) {
  if (job.store.empty() && job.launcher == "torchrun")
    throw Error(ErrorCode::invalid_argument,
                "init: rank " + std::to_string(job.rank) + " of " + std::to_string(job.size) +
                    " was started by torchrun (RANK, WORLD_SIZE), whose store Tutti's C++ API cannot use: set "
                    "TUTTI_STORE=file:///shared/dir (a directory of your own every node sees) or tcp://host:port "
                    "with TUTTI_TOKEN, and TUTTI_JOB_ID unless torchrun has --rdzv-id; or start the job with "
                    "tutti-run. In Python, tutti.init() and hvd.init() join through torchrun's own store.");
  if (job.store.empty())
    throw Error(ErrorCode::invalid_argument,
                "init: rank " + std::to_string(job.rank) + " of " + std::to_string(job.size) + " was started by " +
                    job.launcher +
                    " without TUTTI_STORE; set TUTTI_STORE=file:///shared/dir or "
                    "tcp://host:port (or use tutti-run, or mpirun with an MPI-enabled build)");
  // Jobs that share a store (one file:// directory, one tcp:// server) are kept apart by their ids.
  if (job.size > 1 && job.job_id.empty())
    throw Error(ErrorCode::invalid_argument,
                "init: rank " + std::to_string(job.rank) + " of " + std::to_string(job.size) + " was started by " +
                    job.launcher +
                    " with no job id, so it could join another job that shares TUTTI_STORE=" + job.store +
                    ": set TUTTI_JOB_ID on every rank, the same within a job and different for every job (and every "
                    "run of it), e.g. TUTTI_JOB_ID=$(uuidgen) in the launcher (tutti-run, Open MPI's mpirun and srun "
                    "give one)");
  const auto timeout = core::default_timeout();
  auto server = host_store ? bootstrap::host_store(job) : nullptr;  // rank 0, tcp://: listens on the URL's host only
  auto store = bootstrap::connect_store(job.store, job.token, timeout);
  // Everyone is connected when this returns: nobody needs the store any more, but rank 0 kept
  // serving until all ranks had read what they needed, which the first collective guarantees.
  return join_over_store(job, *store, timeout, bootstrap::private_file_store(job.store));
}

// The ranks join this run of the job in `store` (bootstrap/run.hpp: keys of earlier runs with the
// same job id are never read), learn each other's hosts under the run's prefix, then connect.
Communicator join_over_store(const bootstrap::JobInfo& job, bootstrap::Store& job_store,
                             std::chrono::milliseconds timeout, bool private_store) {
  bootstrap::PrefixStore store(job_store, bootstrap::join_run(job_store, job.job_id, job.rank, job.size, timeout));
  // The real host decides the transport (shared memory works within it); the topology host
  // (TUTTI_HOST, which may emulate several hosts on one) decides hierarchical algorithms.
  // Published together as "real" or "real<TAB>topology", then a line with the machine's id: ranks
  // on one machine share its cores, whatever their host names (an emulated cluster's hosts have
  // names of their own).
  const std::string real_host = host_name(), topology_host = comm::topology_host_name();
  const std::string machine = transport::shm::machine_id(real_host);
  store.set("host/" + std::to_string(job.rank),
            (topology_host == real_host ? real_host : real_host + "\t" + topology_host) + "\n" + machine);
  // Ranks that published the same place share a host for both purposes: shared memory among
  // them, TCP to the others.
  std::set<std::string> hosts;
  std::vector<std::string> places;
  std::vector<std::uint64_t> topology_hosts;
  int on_machine = 0;
  for (int r = 0; r < job.size; ++r) {
    const std::string published = store.get("host/" + std::to_string(r), timeout);
    const std::size_t line = published.find('\n');
    const std::string value = published.substr(0, line);
    on_machine += line != std::string::npos && published.substr(line + 1) == machine;
    const std::size_t tab = value.find('\t');
    hosts.insert(value.substr(0, tab));
    places.push_back(value);
    topology_hosts.push_back(comm::hash_host(tab == std::string::npos ? value : value.substr(tab + 1)));
  }
  transport::shm::set_ranks_on_machine(on_machine);
  if (core::log_enabled(core::LogLevel::info))
    core::log(core::LogLevel::info, job.rank,
              "init: " + std::to_string(on_machine) + (on_machine == 1 ? " rank" : " ranks") +
                  " of the job on this machine" +
                  (transport::shm::ranks_outnumber_cores(1) ? ", more than its cores: waits yield them" : ""));
  auto transport = connect_world(job, store, places, hosts.size() == 1, private_store, timeout);
  auto impl = std::make_shared<comm::CommImpl>(std::move(transport));
  impl->set_topology(comm::Topology(std::move(topology_hosts)));  // known: automatic may pick hierarchical
  Communicator world = comm::Access::make(impl);
  // Ranks on several hosts measure the link between them for the cost model, unless a tuning file
  // gives this transport's costs or TUTTI_LINK_PROBE=0; the ranks agree on it in a collective that
  // is also the barrier after which nobody needs the store.
  const std::string_view name = impl->transport_name();
  const transport::Kind kind = impl->transport_kind();
  int probe = hosts_of(places) > 1 && (kind == transport::Kind::tcp || kind == transport::Kind::routed) &&
              !comm::choice::active().cost_models.contains(std::string(name)) &&
              core::env("TUTTI_LINK_PROBE").value_or("1") != "0";
  world.allreduce(std::span<int>(&probe, 1), ReduceOp::min);
  if (probe != 0)
    if (const auto link = comm::choice::probe_link(world, name, kind))
      impl->set_link_cost(comm::choice::intern_cost(*link));
  return world;
}

}  // namespace

}  // namespace tutti
