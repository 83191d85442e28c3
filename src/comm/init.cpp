// tutti::init(): joining the job the environment describes.
//
// 1. bootstrap::detect_job() reads tutti-run's, mpirun's or srun's variables.
// 2. Under mpirun without TUTTI_STORE (built with MPI), MPI itself bootstraps (MPI_Init_thread if
//    the program has not): ranks all on one host connect through shared memory, over a private
//    store directory rank 0 makes and names to the others through MPI; ranks across hosts (or
//    TUTTI_TRANSPORT=mpi) get the world communicator over the mpi transport.
// 3. Otherwise the store (TUTTI_STORE; rank 0 hosts a tcp:// store itself when nobody else does)
//    exchanges host names; ranks all on one host use shared memory, else TCP (TUTTI_TRANSPORT
//    forces one).
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <set>

#include "bootstrap/job.hpp"
#include "bootstrap/store.hpp"
#include "comm/comm_impl.hpp"
#include "comm/tuning.hpp"
#include "core/env.hpp"
#include "core/log.hpp"
#include "transport/shm/shm.hpp"
#include "transport/tcp/tcp.hpp"

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

// A store directory of the job's own: rank 0 makes it (mode 0700, in $TMPDIR or /tmp) and names
// it to the others through MPI. Rank 0 removes it once the world communicator is up.
class MpiStoreDirectory {
 public:
  MpiStoreDirectory() {
    int rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    char path[512] = {};
    if (rank == 0) {
      std::string pattern = (std::filesystem::temp_directory_path() / "tutti-XXXXXX").string();
      if (pattern.size() < sizeof(path) && ::mkdtemp(pattern.data()) != nullptr)
        std::memcpy(path, pattern.c_str(), pattern.size());
      owned_ = path;
    }
    MPI_Bcast(path, sizeof(path), MPI_CHAR, 0, MPI_COMM_WORLD);
    if (path[0] == '\0')
      throw Error(ErrorCode::system, "init: rank 0 could not make a store directory under " +
                                         std::filesystem::temp_directory_path().string());
    url_ = "file://" + std::string(path);
  }
  ~MpiStoreDirectory() {
    std::error_code ignored;
    if (!owned_.empty()) std::filesystem::remove_all(owned_, ignored);
  }
  MpiStoreDirectory(const MpiStoreDirectory&) = delete;
  MpiStoreDirectory& operator=(const MpiStoreDirectory&) = delete;
  const std::string& url() const { return url_; }

 private:
  std::string owned_;
  std::string url_;
};
#endif

Communicator init_over_store(const bootstrap::JobInfo& job);

}  // namespace

Communicator init() {
  detail::choice::load_from_environment();  // a bad TUTTI_TUNING_FILE fails here, before any connection
  bootstrap::JobInfo job = bootstrap::detect_job();
  if (job.size == 1 && job.launcher == "none" && job.transport.empty()) return local_group(1).front();
#ifdef TUTTI_WITH_MPI
  const bool mpi_bootstraps = job.launcher == "mpirun" && job.store.empty();
  if (job.transport == "mpi" || mpi_bootstraps) {
    start_mpi();
    if (job.transport == "mpi" || !mpi_one_host()) return from_mpi(MPI_COMM_WORLD);
    const MpiStoreDirectory directory;  // removed once the world is up (every rank left the store)
    job.store = directory.url();
    return init_over_store(job);
  }
#else
  if (job.transport == "mpi")
    throw Error(ErrorCode::unsupported, "init: TUTTI_TRANSPORT=mpi, but this Tutti was built without MPI");
#endif
  return init_over_store(job);
}

namespace {

// Through the store: rank 0 may host it (tcp://); ranks on one host use shared memory, else TCP.
Communicator init_over_store(const bootstrap::JobInfo& job) {
  if (job.store.empty())
    throw Error(ErrorCode::invalid_argument,
                "init: started by " + job.launcher +
                    " without TUTTI_STORE; set TUTTI_STORE=file:///shared/dir or "
                    "tcp://host:port (or use tutti-run, or mpirun with an MPI-enabled build)");
  const auto timeout = core::default_timeout();
  auto server = bootstrap::host_store(job);  // rank 0, tcp://: listens on the URL's host only
  auto store = bootstrap::connect_store(job.store, job.token, timeout);
  const std::string prefix = "tutti/" + job.job_id + "/";
  // The real host decides the transport (shared memory works within it); the topology host
  // (TUTTI_HOST, which may emulate several hosts on one) decides hierarchical algorithms.
  // Published together as "real" or "real<TAB>topology".
  const std::string real_host = host_name(), topology_host = detail::topology_host_name();
  store->set(prefix + "host/" + std::to_string(job.rank),
             topology_host == real_host ? real_host : real_host + "\t" + topology_host);
  std::set<std::string> hosts;
  std::vector<std::uint64_t> topology_hosts;
  for (int r = 0; r < job.size; ++r) {
    const std::string value = store->get(prefix + "host/" + std::to_string(r), timeout);
    const std::size_t tab = value.find('\t');
    hosts.insert(value.substr(0, tab));
    topology_hosts.push_back(detail::hash_host(tab == std::string::npos ? value : value.substr(tab + 1)));
  }
  const bool one_host = hosts.size() == 1;
  const std::string kind = job.transport.empty() ? (one_host ? "shm" : "tcp") : job.transport;
  std::unique_ptr<transport::Transport> transport;
  if (kind == "shm") {
    if (!one_host)
      throw Error(ErrorCode::invalid_argument,
                  "init: TUTTI_TRANSPORT=shm, but the ranks run on " + std::to_string(hosts.size()) + " hosts");
    transport =
        transport::shm::open_world(*store, prefix + "shm-nonce", job.job_id, job.rank, job.size, world_id, timeout);
  } else if (kind == "tcp") {
    // TUTTI_TCP_HOST picks the address to listen on and advertise (a host with several networks).
    const std::string bind_host = core::env("TUTTI_TCP_HOST").value_or(one_host ? "127.0.0.1" : "0.0.0.0");
    transport = transport::tcp::connect(*store, job.token, job.rank, job.size, world_id, bind_host, timeout);
  } else {
    throw Error(ErrorCode::invalid_argument, "TUTTI_TRANSPORT: expected shm, tcp or mpi, got '" + kind + "'");
  }
  // Everyone is connected: nobody needs the store any more, but rank 0 keeps serving until all
  // ranks have read what they needed, which the first collective guarantees.
  auto impl = std::make_shared<detail::CommImpl>(std::move(transport));
  impl->set_topology(detail::Topology(std::move(topology_hosts)));  // known: automatic may pick hierarchical
  Communicator world(impl);
  world.barrier();
  (void)server;
  return world;
}

}  // namespace

}  // namespace tutti
