// A small side-by-side allreduce benchmark (the full one is tutti-bench, later): Tutti over the
// transport the environment selects (TUTTI_TRANSPORT=shm|tcp, TUTTI_STORE) and OpenMPI's own
// MPI_Allreduce, on the same ranks and buffers, alternating size by size. Run under mpirun:
//
//   TUTTI_STORE=file://$(mktemp -d) TUTTI_TRANSPORT=shm mpirun --oversubscribe -np 2 build/bench/allreduce_peers
//
// Prints, per size, the mean time per allreduce (f32 sum, out of place; the slowest rank's mean
// over the timed iterations, after warm-up) for Tutti and for MPI, and the ratio MPI / Tutti.
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "tutti/tutti.hpp"

namespace {

template <class Fn>
double mean_seconds(int iterations, Fn&& call) {
  for (int i = 0; i < std::max(2, iterations / 10); ++i) call();  // warm-up
  MPI_Barrier(MPI_COMM_WORLD);
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < iterations; ++i) call();
  double mean = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / iterations;
  MPI_Allreduce(MPI_IN_PLACE, &mean, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return mean;
}

}  // namespace

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  {
    tutti::Communicator world = tutti::init();
    const char* transport = std::getenv("TUTTI_TRANSPORT");
    if (rank == 0)
      std::printf("allreduce f32 sum, %d ranks, Tutti over %s vs MPI_Allreduce (OpenMPI)\n%12s %14s %14s %10s\n", size,
                  transport ? transport : "default", "bytes", "tutti (us)", "mpi (us)", "mpi/tutti");
    for (std::size_t bytes : {std::size_t{8}, std::size_t{1} << 20, std::size_t{64} << 20}) {
      const std::size_t n = bytes / sizeof(float);
      std::vector<float> send(n, 1.0f), recv(n, 0.0f);
      const int iterations = bytes <= 8 ? 2000 : bytes <= (1 << 20) ? 200 : 10;
      const double t = mean_seconds(iterations, [&] {
        world.allreduce(send.data(), recv.data(), n, tutti::DataType::f32, tutti::ReduceOp::sum);
      });
      const bool tutti_ok = recv[n - 1] == static_cast<float>(size);
      const double m = mean_seconds(iterations, [&] {
        MPI_Allreduce(send.data(), recv.data(), static_cast<int>(n), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
      });
      if (rank == 0)
        std::printf("%12zu %14.2f %14.2f %10.2f%s\n", bytes, t * 1e6, m * 1e6, m / t, tutti_ok ? "" : "  TUTTI WRONG");
    }
  }
  MPI_Finalize();
  return 0;
}
