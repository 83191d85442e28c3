// tutti-bench: Tutti's collectives measured the way nccl-tests measures them, with the peers
// (OpenMPI, Gloo) and the machine's ceiling in the same run, and the tuner (--calibrate, --tune).
//
//   tutti-run -n 2 tutti-bench -b 8 -e 64M -f 2 --peers gloo --ceiling
//   mpirun -np 2 tutti-bench -b 8 -e 64M --peers mpi,gloo --ceiling --json out.json
//   tutti-run -n 2 tutti-bench --device cuda -b 8 -e 64M --peers sync   (gpu::Communicator)
//
// Under mpirun, MPI is initialized here (for the MPI peer) and init() bootstraps through MPI, so
// that Tutti runs over shared memory (or TUTTI_TRANSPORT) beside MPI's own collectives.
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <stdexcept>
#include <string>

#include "bench/device_sweep.hpp"
#include "bench/sparse_bench.hpp"
#include "bench/sweep.hpp"
#include "bench/tune.hpp"

#ifdef TUTTI_WITH_MPI
#include <mpi.h>
#endif

namespace {

using namespace tutti::bench;

// MPI up under mpirun (the MPI peer needs it whoever bootstraps Tutti).
void start_mpi(int& argc, char**& argv) {
#ifdef TUTTI_WITH_MPI
  if (tutti::launcher() != "mpirun") return;
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
#else
  (void)argc, (void)argv;
#endif
}

void finish_mpi() {
#ifdef TUTTI_WITH_MPI
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (!initialized || finalized) return;
  MPI_Barrier(MPI_COMM_WORLD);
  MPI_Finalize();
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
  if (device_mode(options)) return run_device(world, options, tutti::launcher());
  if (options.sparse) return run_sparse(world, options);
  if (options.calibrate && !options.tune) return calibrate(world, options);
  if (options.tune) return tune(world, options);
  if (world.rank() == 0)
    std::printf("# tutti-bench: %d ranks over %s; %s\n", world.size(), std::string(world.transport_name()).c_str(),
                options.command_line.c_str());
  if (options.root >= world.size()) throw std::invalid_argument("-r: root must be below the number of ranks");
  const auto peers = make_peers(world, options);
  std::optional<Ceiling> ceiling;
  if (options.ceiling) ceiling = measure_ceiling(world);
  Report report = run_sweep(world, options, peers, ceiling);
  if (world.rank() == 0) {
    report.footer(ceiling);
    if (!options.json_path.empty())
      report.write_json(options.json_path, options.command_line, tutti::launcher(), ceiling);
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
  int status = 0;
  try {
    start_mpi(argc, argv);
    tutti::Communicator world = tutti::init();
    status = run(world, *options);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tutti-bench: %s\n", e.what());
    status = 1;
  }
  if (status == 0) finish_mpi();  // after a failure, peers may never reach the barrier
  return status;
}
