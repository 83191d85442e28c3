// tutti-bench: Tutti's collectives measured the way nccl-tests measures them, with the peers
// (OpenMPI, Gloo) and the machine's ceiling in the same run, and the tuner (--calibrate, --tune).
//
//   tutti-run -n 2 tutti-bench -b 8 -e 64M -f 2 --peers gloo --ceiling
//   mpirun -np 2 tutti-bench -b 8 -e 64M --peers mpi,gloo --ceiling --json out.json
//
// Under mpirun, MPI is initialized here and Tutti bootstraps through a store directory of its own,
// so that Tutti runs over shared memory (or TUTTI_TRANSPORT) beside MPI's own collectives.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <stdexcept>
#include <string>

#include "bench/sweep.hpp"
#include "bench/tune.hpp"
#include "bootstrap/job.hpp"
#include "comm/comm_impl.hpp"

#ifdef TUTTI_WITH_MPI
#include <mpi.h>
#endif

namespace {

using namespace tutti::bench;

// The launcher as init() sees it ("tutti-run", "mpirun", "srun" or "none").
std::string launcher() { return tutti::bootstrap::detect_job().launcher; }

// MPI up (under mpirun) and TUTTI_STORE pointing at a directory rank 0 made; returns that
// directory ("" when none was made) for removal at the end.
std::string start_mpi(int& argc, char**& argv) {
#ifdef TUTTI_WITH_MPI
  if (launcher() != "mpirun") return "";
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  if (std::getenv("TUTTI_STORE") != nullptr) return "";
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  char path[256] = {};
  if (rank == 0) {
    std::string tmpl = (std::filesystem::temp_directory_path() / "tutti-bench-XXXXXX").string();
    if (::mkdtemp(tmpl.data()) != nullptr) std::strncpy(path, tmpl.c_str(), sizeof(path) - 1);
  }
  MPI_Bcast(path, sizeof(path), MPI_CHAR, 0, MPI_COMM_WORLD);
  if (path[0] == '\0') throw std::runtime_error("cannot create a store directory");
  ::setenv("TUTTI_STORE", ("file://" + std::string(path)).c_str(), 1);
  return rank == 0 ? std::string(path) : "";
#else
  (void)argc, (void)argv;
  return "";
#endif
}

void finish_mpi(const std::string& store_dir) {
#ifdef TUTTI_WITH_MPI
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (!initialized || finalized) return;
  MPI_Barrier(MPI_COMM_WORLD);
  if (!store_dir.empty()) std::filesystem::remove_all(store_dir);
  MPI_Finalize();
#else
  (void)store_dir;
#endif
}

std::vector<std::unique_ptr<Peer>> make_peers(tutti::Communicator& world, const BenchOptions& options) {
  std::vector<std::unique_ptr<Peer>> peers;
  for (const std::string& name : options.peers) {
    std::string why;
    auto peer = name == "mpi" ? make_mpi_peer(why) : make_gloo_peer(world, why);
    if (peer)
      peers.push_back(std::move(peer));
    else if (world.rank() == 0)
      std::printf("# %s peer skipped: %s\n", name.c_str(), why.c_str());
  }
  return peers;
}

int run(tutti::Communicator& world, const BenchOptions& options) {
  if (options.calibrate && !options.tune) return calibrate(world, options);
  if (options.tune) return tune(world, options);
  if (world.rank() == 0)
    std::printf("# tutti-bench: %d ranks over %s; %s\n", world.size(),
                std::string(world.impl()->transport_name()).c_str(), options.command_line.c_str());
  if (options.root >= world.size()) throw std::invalid_argument("-r: root must be below the number of ranks");
  const auto peers = make_peers(world, options);
  std::optional<Ceiling> ceiling;
  if (options.ceiling) ceiling = measure_ceiling(world);
  Report report = run_sweep(world, options, peers, ceiling);
  if (world.rank() == 0) {
    report.footer(ceiling);
    if (!options.json_path.empty()) report.write_json(options.json_path, options.command_line, launcher(), ceiling);
  }
  return report.wrong() == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  std::optional<BenchOptions> options;
  try {
    options = parse_options(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tutti-bench: %s\n", e.what());
    return 2;
  }
  if (!options) return 0;
  std::string store_dir;
  int status = 0;
  try {
    store_dir = start_mpi(argc, argv);
    tutti::Communicator world = tutti::init();
    status = run(world, *options);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tutti-bench: %s\n", e.what());
    status = 1;
  }
  if (status == 0)
    finish_mpi(store_dir);  // after a failure, peers may never reach the barrier
  else if (!store_dir.empty())
    std::filesystem::remove_all(store_dir);
  return status;
}
