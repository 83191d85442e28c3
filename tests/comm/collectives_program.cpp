// The collective sweep with ranks as processes: run under tutti-run (shm or tcp) or mpirun.
//
//   collectives_program sweep    every collective × algorithm × count × in place, f32 sum, at this p
//   collectives_program types    every type × op for the reductions (every algorithm), p as given
//   collectives_program split    several split communicators used at once from two threads per rank
//   collectives_program overlap  a nonblocking allreduce proceeds while the rank is away
//   collectives_program direct   the shared-memory direct algorithms (shm only), every count and form
//   collectives_program cluster  the sweep, large automatic allreduces (hierarchical where the ranks
//                                 span hosts) and split: the emulated cluster's run (cluster_test.sh)
//
// Every rank checks its own results; rank 0 prints "N passed, M failed" over all ranks and the
// exit status is non-zero if anything failed on any rank.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>

#include "collective_cases.hpp"
#include "mp_tally.hpp"

namespace {

using namespace tutti;
using namespace tutti::testing;

// Runs every case of `cases` made for this communicator's size.
Tally run_cases(Communicator& world, const std::vector<Case>& cases) {
  Tally tally;
  for (Case c : cases)
    if (c.p == world.size()) tally.record(name_of(c), [&] { return run_rank(world, c); });
  return tally;
}

std::vector<Case> with_size(std::vector<Case> cases, int p) {
  for (Case& c : cases) {
    c.p = p;
    if (c.root >= p) c.root = p - 1;
  }
  return cases;
}

// The sweep's cases for the collectives the shared-memory direct algorithms serve, forced to direct.
std::vector<Case> direct_cases(int p) {
  std::vector<Case> out;
  for (Case c : sweep_cases({p})) {
    const bool served = c.collective != Collective::alltoallv;
    if (!served || c.algorithm != Algorithm::automatic) continue;
    c.algorithm = Algorithm::direct;
    out.push_back(c);
    if (c.collective == Collective::barrier) continue;
    for (std::size_t n : {std::size_t{100003}, std::size_t{1} << 20}) {  // several chunks
      c.count = n;
      out.push_back(c);
    }
    const bool zero_copy = c.collective == Collective::allreduce || c.collective == Collective::reduce_scatter ||
                           c.collective == Collective::allgather || c.collective == Collective::broadcast;
    if (!zero_copy) continue;
    // Zero copy: every rank's buffers in shared memory, on both sides of zero_copy_bytes (4096
    // floats of input or result, whichever is larger).
    c.shared = true;
    const std::size_t edge = (c.collective == Collective::allgather || c.collective == Collective::reduce_scatter)
                                 ? 4096 / static_cast<std::size_t>(p)
                                 : 4096;
    for (std::size_t n : {std::size_t{1}, edge - 1, edge, std::size_t{100003}, std::size_t{1} << 18}) {
      c.count = n;
      out.push_back(c);
    }
  }
  return out;
}

// A barrier lets no rank through before every rank entered it: rank r enters round i after
// (r + i) mod p ms and leaves a marker file first; past the barrier every marker of the round
// must be there. With `algorithm` forced (direct) and automatic.
Tally run_barrier(Communicator& world, Algorithm algorithm) {
  const int p = world.size(), r = world.rank();
  char dir[256] = {};
  if (r == 0) {
    std::string tmpl = (std::filesystem::temp_directory_path() / "tutti-barrier-XXXXXX").string();
    if (::mkdtemp(tmpl.data()) != nullptr) std::strncpy(dir, tmpl.c_str(), sizeof(dir) - 1);
  }
  world.broadcast(dir, sizeof(dir), DataType::u8, 0);
  if (dir[0] == '\0') return Tally{0, 1};
  const auto marker = [&](int round, int q) {
    return std::filesystem::path(dir) / (std::to_string(round) + "." + std::to_string(q));
  };
  int missing = 0;
  for (int round = 0; round < 20; ++round) {
    std::this_thread::sleep_for(std::chrono::milliseconds((r + round) % p));
    std::ofstream(marker(round, r)).put('x');
    world.barrier({algorithm, test_timeout});
    for (int q = 0; q < p; ++q) missing += std::filesystem::exists(marker(round, q)) ? 0 : 1;
  }
  world.allreduce(std::span<int>(&missing, 1), ReduceOp::sum);
  world.barrier();  // every rank has looked before the markers go
  if (r == 0) std::filesystem::remove_all(dir);
  if (missing > 0 && r == 0)
    std::printf("barrier (%s): %d markers missing past the barrier\n", std::string(to_string(algorithm)).c_str(),
                missing);
  return Tally{missing == 0 ? 1 : 0, missing == 0 ? 0 : 1};
}

// Allreduces large enough for automatic to choose hierarchical when the ranks span hosts with
// several on one: in place and not, a count the ranks per host divide and a prime, sum and max.
std::vector<Case> large_allreduce_cases(int p) {
  std::vector<Case> out;
  for (std::size_t n : {std::size_t{1} << 16, std::size_t{1000003}})
    for (int place : {0, 1})
      for (ReduceOp op : {ReduceOp::sum, ReduceOp::max})
        out.push_back({Collective::allreduce, Algorithm::automatic, DataType::f32, op, p, n, place, 0, place == 1});
  return out;
}

Tally run_split(Communicator& world) {
  const int r = world.rank();
  Communicator halves = world.split(r % 2, -r);
  Communicator thirds = world.split(r % 3 == 0 ? -1 : r % 3, r);
  int failed = 0;
  std::thread other([&] {
    if (thirds.size() == 0) return;
    for (int i = 0; i < 20; ++i) {
      std::vector<std::int64_t> v(1000 + static_cast<std::size_t>(i), thirds.rank() + 1);
      thirds.allreduce(v.data(), v.data(), v.size(), DataType::i64, ReduceOp::sum, {Algorithm::ring, test_timeout});
      const std::int64_t want = static_cast<std::int64_t>(thirds.size()) * (thirds.size() + 1) / 2;
      for (auto x : v) failed += x != want;
    }
  });
  for (int i = 0; i < 20; ++i) {
    std::vector<float> v(777, static_cast<float>(halves.rank()));
    halves.allreduce(v.data(), v.data(), v.size(), DataType::f32, ReduceOp::max, {{}, test_timeout});
    for (float x : v) failed += x != static_cast<float>(halves.size() - 1);
  }
  other.join();
  std::vector<int> ranks(static_cast<std::size_t>(halves.size()));
  halves.allgather(&r, ranks.data(), 1, DataType::i32, {{}, test_timeout});
  for (std::size_t i = 1; i < ranks.size(); ++i) failed += ranks[i] >= ranks[i - 1];  // key -r: descending
  return Tally{failed == 0 ? 1 : 0, failed == 0 ? 0 : 1};
}

// Issue an allreduce, stay away (sleep) for three times what it takes when waited on at once,
// then wait: with background progress the wait is short.
Tally run_overlap(Communicator& world) {
  const std::size_t n = std::size_t{1} << 23;
  std::vector<float> a(n, 1.0f), b(n);
  using clock = std::chrono::steady_clock;
  const Options o{Algorithm::ring, test_timeout};
  world.allreduce(a.data(), b.data(), n, DataType::f32, ReduceOp::sum, o);  // warm-up
  world.barrier();
  auto t0 = clock::now();
  world.allreduce(a.data(), b.data(), n, DataType::f32, ReduceOp::sum, o);
  double blocking = std::chrono::duration<double>(clock::now() - t0).count();
  world.allreduce(&blocking, &blocking, 1, DataType::f64, ReduceOp::max);
  Request r = world.iallreduce(a.data(), b.data(), n, DataType::f32, ReduceOp::sum, o);
  std::this_thread::sleep_for(std::chrono::duration<double>(3 * blocking + 0.2));
  t0 = clock::now();
  r.wait();
  const double waited = std::chrono::duration<double>(clock::now() - t0).count();
  bool ok = waited < blocking / 2;
  for (std::size_t i = 0; i < n; i += 4097) ok &= b[i] == static_cast<float>(world.size());
  std::printf("overlap: blocking allreduce %.1f ms, wait after being away %.2f ms\n", blocking * 1e3, waited * 1e3);
  return Tally{ok ? 1 : 0, ok ? 0 : 1};
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "sweep";
  try {
    Communicator world = init();
    Tally tally;
    if (mode == "sweep")
      tally = run_cases(world, sweep_cases({world.size()}));
    else if (mode == "direct") {
      tally = run_cases(world, direct_cases(world.size()));
      for (Algorithm a : {Algorithm::direct, Algorithm::automatic}) tally += run_barrier(world, a);
    } else if (mode == "types")
      tally = run_cases(world, with_size(type_cases(), world.size()));
    else if (mode == "split")
      tally = run_split(world);
    else if (mode == "cluster") {
      std::vector<Case> cases = sweep_cases({world.size()});
      for (const Case& c : large_allreduce_cases(world.size())) cases.push_back(c);
      tally = run_cases(world, cases);
      tally += run_split(world);
    } else if (mode == "overlap")
      tally = run_overlap(world);
    else {
      std::fprintf(stderr, "collectives_program: unknown mode '%s'\n", mode.c_str());
      return 2;
    }
    return finish(world, tally);
  } catch (const std::exception& e) {
    std::printf("FAIL %s: %s\n", mode.c_str(), e.what());
    return 1;
  }
}
