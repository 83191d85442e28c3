// tutti-demo: a tour of the collectives. Ranks are threads of this process (local_group), so it
// runs anywhere with no launcher. Every result is checked against its definition; the exit code
// is non-zero if any is wrong.
//
//   tutti-demo [-n RANKS] [--count ELEMENTS] [--iters N]
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include "tutti/tutti.hpp"

namespace {

struct Settings {
  int ranks = 4;
  std::size_t count = std::size_t{1} << 20;
  int iters = 5;
};

Settings parse(int argc, char** argv) {
  Settings s;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "tutti-demo: %s needs a value\n", arg.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (arg == "-n" || arg == "--ranks")
      s.ranks = std::stoi(value());
    else if (arg == "--count")
      s.count = std::stoull(value());
    else if (arg == "--iters")
      s.iters = std::stoi(value());
    else if (arg == "-h" || arg == "--help") {
      std::printf(
          "usage: tutti-demo [-n RANKS] [--count ELEMENTS] [--iters N]\n"
          "Runs every collective on RANKS threads (default 4) with f32 data of ELEMENTS per rank\n"
          "(default 1048576), checks every result, and prints time and bus bandwidth.\n");
      std::exit(0);
    } else {
      std::fprintf(stderr, "tutti-demo: unknown argument %s (see --help)\n", arg.c_str());
      std::exit(2);
    }
  }
  if (s.ranks < 1 || s.iters < 1) {
    std::fprintf(stderr, "tutti-demo: -n and --iters must be at least 1\n");
    std::exit(2);
  }
  return s;
}

struct Row {
  std::string what;
  double seconds = 0;
  double busbw = 0;
  bool ok = true;
};

// Times `iters` runs of `call` on every rank (barrier-separated); returns the slowest rank's mean.
template <class Fn>
double timed(tutti::Communicator& comm, int iters, Fn&& call) {
  call();  // warm-up, and the run whose result is checked
  comm.barrier();
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < iters; ++i) call();
  double mean = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / iters;
  comm.allreduce(&mean, &mean, 1, tutti::DataType::f64, tutti::ReduceOp::max);
  return mean;
}

void run_rank(tutti::Communicator& comm, const Settings& s, std::vector<Row>& rows, std::mutex& mutex) {
  using tutti::Algorithm;
  using tutti::DataType;
  using tutti::ReduceOp;
  const int r = comm.rank(), p = comm.size();
  const std::size_t n = s.count, bytes = n * sizeof(float);
  const double ring_factor = 2.0 * (p - 1) / p, gather_factor = double(p - 1) / p;
  std::vector<Row> mine;
  auto record = [&](std::string what, double t, double factor, std::size_t size, bool ok) {
    int good = ok ? 1 : 0;
    comm.allreduce(&good, &good, 1, DataType::i32, ReduceOp::min);
    mine.push_back({std::move(what), t, t > 0 ? size / t * factor / 1e9 : 0, good == 1});
  };

  std::vector<float> grad(n), sum(n);
  for (std::size_t i = 0; i < n; ++i) grad[i] = static_cast<float>((i + r) % 16);
  auto expected_sum = [&](std::size_t i) {
    float e = 0;
    for (int q = 0; q < p; ++q) e += static_cast<float>((i + q) % 16);
    return e;
  };
  for (Algorithm a : {Algorithm::automatic, Algorithm::ring, Algorithm::recursive_doubling, Algorithm::rabenseifner,
                      Algorithm::binomial_tree}) {
    const double t = timed(comm, s.iters, [&] {
      comm.allreduce(grad.data(), sum.data(), n, DataType::f32, ReduceOp::sum, {.algorithm = a});
    });
    bool ok = true;
    for (std::size_t i = 0; i < n; ++i) ok &= sum[i] == expected_sum(i);
    record("allreduce " + std::string(tutti::to_string(a)), t, ring_factor, bytes, ok);
  }

  std::vector<float> part(n / p);
  const double t_rs =
      timed(comm, s.iters, [&] { comm.reduce_scatter(grad.data(), part.data(), n / p, DataType::f32, ReduceOp::sum); });
  bool ok_rs = true;
  for (std::size_t i = 0; i < n / p; ++i) ok_rs &= part[i] == expected_sum(r * (n / p) + i);
  record("reduce_scatter", t_rs, gather_factor, (n / p) * p * sizeof(float), ok_rs);

  std::vector<float> all(part.size() * p);
  const double t_ag =
      timed(comm, s.iters, [&] { comm.allgather(part.data(), all.data(), part.size(), DataType::f32); });
  bool ok_ag = true;
  for (std::size_t i = 0; i < all.size(); ++i) ok_ag &= all[i] == expected_sum(i);
  record("allgather", t_ag, gather_factor, all.size() * sizeof(float), ok_ag);

  std::vector<float> weights(n, r == 0 ? 0.5f : -1.0f);
  const double t_bc = timed(comm, s.iters, [&] { comm.broadcast(weights.data(), n, DataType::f32, 0); });
  bool ok_bc = true;
  for (float w : weights) ok_bc &= w == 0.5f;
  record("broadcast", t_bc, 1.0, bytes, ok_bc);

  const std::size_t block = n / p;
  std::vector<float> a2a_in(block * p), a2a_out(block * p);
  for (std::size_t i = 0; i < a2a_in.size(); ++i) a2a_in[i] = static_cast<float>(r * 1000 + i / block);
  const double t_a2a =
      timed(comm, s.iters, [&] { comm.alltoall(a2a_in.data(), a2a_out.data(), block, DataType::f32); });
  bool ok_a2a = true;
  for (std::size_t i = 0; i < a2a_out.size(); ++i) ok_a2a &= a2a_out[i] == static_cast<float>((i / block) * 1000 + r);
  record("alltoall", t_a2a, gather_factor, a2a_out.size() * sizeof(float), ok_a2a);

  // Overlap: start an allreduce, compute, then wait.
  std::vector<float> async(n);
  const double t_nb = timed(comm, s.iters, [&] {
    tutti::Request req = comm.iallreduce(grad.data(), async.data(), n, DataType::f32, ReduceOp::avg);
    req.wait();
  });
  bool ok_nb = true;
  for (std::size_t i = 0; i < n; ++i) ok_nb &= async[i] == expected_sum(i) / static_cast<float>(p);
  record("iallreduce avg + wait", t_nb, ring_factor, bytes, ok_nb);

  const double t_bar = timed(comm, s.iters * 20, [&] { comm.barrier(); });
  record("barrier", t_bar, 0, 0, true);

  if (r == 0) {
    std::lock_guard lock(mutex);
    rows = std::move(mine);
  }
}

// Ranks as threads of this process (no launcher), or this process as one rank of a job started
// by tutti-run or mpirun. Returns the failures, one line per failed rank seen here.
std::string run(const Settings& s, std::vector<Row>& rows, bool launched) {
  std::mutex mutex;
  std::string failure;
  auto guarded = [&](tutti::Communicator comm) {
    try {
      run_rank(comm, s, rows, mutex);
    } catch (const std::exception& e) {
      std::lock_guard lock(mutex);
      failure += "rank " + std::to_string(comm.rank()) + ": " + e.what() + "\n";
    }
  };
  if (launched) {
    tutti::Communicator world = tutti::init();
    if (world.rank() == 0)
      std::printf("tutti-demo: %d ranks (processes), %zu f32 elements per rank, %d iterations\n\n", world.size(),
                  s.count, s.iters);
    guarded(world);
    return failure;
  }
  std::printf("tutti-demo: %d ranks (threads, in-process transport), %zu f32 elements per rank, %d iterations\n\n",
              s.ranks, s.count, s.iters);
  std::vector<std::thread> threads;
  for (auto& comm : tutti::local_group(s.ranks)) threads.emplace_back(guarded, comm);
  for (auto& t : threads) t.join();
  return failure;
}

}  // namespace

int main(int argc, char** argv) {
  const Settings s = parse(argc, argv);
  const bool launched = std::getenv("TUTTI_RANK") != nullptr || std::getenv("OMPI_COMM_WORLD_RANK") != nullptr ||
                        std::getenv("PMI_RANK") != nullptr || std::getenv("SLURM_PROCID") != nullptr;
  std::vector<Row> rows;
  const std::string failure = run(s, rows, launched);
  if (!failure.empty()) {
    std::fprintf(stderr, "tutti-demo failed:\n%s", failure.c_str());
    return 1;
  }
  if (rows.empty()) return 0;  // not rank 0 of a launched job: rank 0 prints the table
  std::printf("%-32s %12s %12s  %s\n", "collective", "time (us)", "busbw (GB/s)", "result");
  bool all_ok = true;
  for (const Row& row : rows) {
    std::printf("%-32s %12.1f %12.2f  %s\n", row.what.c_str(), row.seconds * 1e6, row.busbw,
                row.ok ? "correct" : "WRONG");
    all_ok &= row.ok;
  }
  std::printf("\n%s\n", all_ok ? "all results correct" : "SOME RESULTS WRONG");
  return all_ok ? 0 : 1;
}
