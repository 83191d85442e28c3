// One rank of an elastic job (include/tutti/elastic.hpp), started by elastic_test.sh with the
// launcher's variables (TUTTI_STORE, TUTTI_JOB_ID, TUTTI_RANK and TUTTI_SIZE, or
// TUTTI_ELASTIC_JOIN=1 for a rank that joins).
//
//   elastic_program STEPS COMMIT_EVERY SLEEP_MS [VICTIMS DIE_AT kill|stop|leave]
//
// Each step allreduces a vector of ones and checks every element equals the world's size, then
// adds sum/size (exactly 1) to the state, so the state after any number of failures, rollbacks
// and joins is exactly STEPS in every element. At step DIE_AT of generation 0, the ranks VICTIMS
// ("2", or "2,3") kill themselves (SIGKILL), stop themselves (SIGSTOP) or leave the job
// (Job::leave) and exit. Each rank also counts the steps it did in a local part of the state
// (State::save_local), which rollbacks restore and syncs leave alone: it must end as the steps
// since this process began training. At the end every rank checks that all ranks hold the same
// state, and prints "done rank R of P generation G steps S recovered_ms T name NAME"; with
// ELASTIC_LINGER_MS set, it then stays that long before it exits (a rank slow to end).
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "tutti/elastic.hpp"

namespace {

constexpr std::size_t elements = 257;

struct Counters final : tutti::elastic::State {
  std::uint64_t step = 0;
  std::vector<double> x = std::vector<double>(elements, 0.0);
  std::uint64_t own = 0;  // the local part: steps this rank did

  std::vector<std::byte> save_local() const override {
    std::vector<std::byte> bytes(sizeof own);
    std::memcpy(bytes.data(), &own, sizeof own);
    return bytes;
  }
  void load_local(std::span<const std::byte> bytes) override {
    if (bytes.size() != sizeof own) {
      std::fprintf(stderr, "FAILED: a local state of %zu bytes\n", bytes.size());
      std::exit(3);
    }
    std::memcpy(&own, bytes.data(), sizeof own);
  }

  std::vector<std::byte> save() const override {
    std::vector<std::byte> bytes(sizeof(step) + x.size() * sizeof(double));
    std::memcpy(bytes.data(), &step, sizeof(step));
    std::memcpy(bytes.data() + sizeof(step), x.data(), x.size() * sizeof(double));
    return bytes;
  }
  void load(std::span<const std::byte> bytes) override {
    if (bytes.size() != sizeof(step) + elements * sizeof(double)) {
      std::fprintf(stderr, "FAILED: a state of %zu bytes\n", bytes.size());
      std::exit(3);
    }
    std::memcpy(&step, bytes.data(), sizeof(step));
    std::memcpy(x.data(), bytes.data() + sizeof(step), x.size() * sizeof(double));
  }
};

[[noreturn]] void failed(const std::string& what) {
  std::fprintf(stderr, "FAILED: %s\n", what.c_str());
  std::exit(3);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 4 && argc != 7) {
    std::fprintf(stderr, "usage: %s STEPS COMMIT_EVERY SLEEP_MS [VICTIMS DIE_AT kill|stop|leave]\n", argv[0]);
    return 2;
  }
  const std::uint64_t steps = std::strtoull(argv[1], nullptr, 10);
  const std::uint64_t commit_every = std::strtoull(argv[2], nullptr, 10);
  const auto pause = std::chrono::milliseconds(std::atoi(argv[3]));
  std::vector<int> victims;  // "2" or "2,3"
  if (argc == 7) {
    const std::string list = argv[4];
    for (std::size_t at = 0; at <= list.size();) {
      const std::size_t comma = std::min(list.find(',', at), list.size());
      victims.push_back(std::atoi(list.substr(at, comma - at).c_str()));
      at = comma + 1;
    }
  }
  const std::uint64_t die_at = argc == 7 ? std::strtoull(argv[5], nullptr, 10) : 0;
  const std::string how = argc == 7 ? argv[6] : "";
  using clock = std::chrono::steady_clock;
  try {
    tutti::elastic::Options options;
    if (const char* path = std::getenv("ELASTIC_CHECKPOINT")) options.checkpoint = path;
    tutti::elastic::Job job(options);
    Counters state;
    auto last_step = clock::now();
    long long recovered_ms = -1;
    int calls = 0;
    std::uint64_t first_step = 0;  // where this process began training
    tutti::elastic::run(job, state, [&](tutti::Communicator& world) {
      if (calls == 0) first_step = state.step;
      if (calls++ > 0 && job.generation() > 0)
        recovered_ms = std::chrono::duration_cast<std::chrono::milliseconds>(clock::now() - last_step).count();
      // After a failure: the time from the last step done to training again (detection, the
      // rendezvous, the new world, the state's broadcast).
      std::printf("generation %d: rank %d of %d from step %llu after %lld ms\n", job.generation(), world.rank(),
                  world.size(), static_cast<unsigned long long>(state.step), recovered_ms);
      std::fflush(stdout);
      while (state.step < steps) {
        if (job.generation() == 0 && state.step == die_at &&
            std::find(victims.begin(), victims.end(), world.rank()) != victims.end()) {
          if (how == "kill") ::raise(SIGKILL);
          if (how == "stop") ::raise(SIGSTOP);
          if (how == "leave") {
            job.leave();
            std::_Exit(0);
          }
        }
        std::vector<double> ones(elements, 1.0);
        world.allreduce(std::span<double>(ones), tutti::ReduceOp::sum);
        for (std::size_t i = 0; i < elements; ++i) {
          if (ones[i] != world.size())
            failed("step " + std::to_string(state.step) + ": element " + std::to_string(i) + " is " +
                   std::to_string(ones[i]) + ", not " + std::to_string(world.size()));
          state.x[i] += ones[i] / world.size();
        }
        ++state.step;
        ++state.own;
        last_step = clock::now();
        if (state.step % commit_every == 0) state.commit();
        std::this_thread::sleep_for(pause);
      }
      for (std::size_t i = 0; i < elements; ++i)
        if (state.x[i] != static_cast<double>(steps))
          failed("element " + std::to_string(i) + " of the state is " + std::to_string(state.x[i]) + ", not " +
                 std::to_string(steps));
      if (state.own != steps - first_step)
        failed("the local part counts " + std::to_string(state.own) + " steps, this rank did " +
               std::to_string(steps - first_step));
      // Every rank holds the same state: the sum over ranks is size() times this rank's.
      std::vector<double> sum = state.x;
      world.allreduce(std::span<double>(sum), tutti::ReduceOp::sum);
      for (std::size_t i = 0; i < elements; ++i)
        if (sum[i] != state.x[i] * world.size()) failed("the ranks' states differ at element " + std::to_string(i));
      std::printf("done rank %d of %d generation %d steps %llu recovered_ms %lld name %s\n", world.rank(), world.size(),
                  job.generation(), static_cast<unsigned long long>(state.step), recovered_ms, job.name().c_str());
    });
  } catch (const tutti::Error& e) {
    std::printf("error: %s\n", e.what());
    return 1;
  }
  if (const char* linger = std::getenv("ELASTIC_LINGER_MS")) {
    std::fflush(stdout);
    std::this_thread::sleep_for(std::chrono::milliseconds(std::atoi(linger)));
  }
  return 0;
}
