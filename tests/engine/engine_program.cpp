// The training engine with ranks as processes: run under tutti-run (shm or tcp).
//
//   engine_program steps      30 "training steps" of 40 mixed tensors each, enqueued in a different
//                             order on every rank and by two threads per rank; results checked exactly
//   engine_program mismatch   rank 1 enqueues a tensor with another count: every rank gets the error
//   engine_program stall      rank 0 enqueues a tensor the others enqueue 1 s later: rank 0 reports
//                             the stall (tensor and missing ranks), then the tensor completes
//
// Every rank checks its own results and prints what failed; the exit status is non-zero if
// anything failed on this rank (tutti-run then fails the job).
#include <algorithm>
#include <cstdio>
#include <mutex>
#include <numeric>
#include <random>
#include <string>
#include <thread>

#include "tutti/engine.hpp"

namespace {

using namespace tutti;

int failures = 0;
void fail(const std::string& what) {
  std::printf("FAIL %s\n", what.c_str());
  ++failures;
}

float value(int step, int t, int r, std::size_t i) {
  return static_cast<float>((step + t * 5 + r * 3 + static_cast<int>(i % 17)) % 9);
}

void steps(Communicator& world) {
  EngineOptions o = EngineOptions::from_environment();
  o.fusion_threshold = 64 << 10;  // several buckets per step
  o.first_bucket_bytes = 8 << 10;
  Engine engine(world, o);
  const int r = world.rank(), p = world.size();
  constexpr int tensors = 40;
  std::mt19937 rng(static_cast<unsigned>(r) * 7919u + 1);
  for (int step = 0; step < 30; ++step) {
    std::vector<std::vector<float>> data(tensors);
    std::vector<Handle> handles(tensors);
    for (int t = 0; t < tensors; ++t) {
      auto& d = data[static_cast<std::size_t>(t)];
      d.resize(1 + static_cast<std::size_t>((t * 3331 + step) % 9000));
      for (std::size_t i = 0; i < d.size(); ++i) d[i] = value(step, t, r, i);
    }
    std::vector<int> order(tensors);
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), rng);
    // Two threads enqueue halves of the shuffled order, as two framework threads would.
    auto enqueue = [&](std::size_t from, std::size_t to) {
      for (std::size_t k = from; k < to; ++k) {
        const int t = order[k];
        auto& d = data[static_cast<std::size_t>(t)];
        handles[static_cast<std::size_t>(t)] =
            engine.enqueue_allreduce("grad." + std::to_string(t), d.data(), d.size(), DataType::f32, ReduceOp::sum);
      }
    };
    std::thread other(enqueue, 0, order.size() / 2);
    enqueue(order.size() / 2, order.size());
    other.join();
    for (int k = tensors - 1; k >= 0; --k) handles[static_cast<std::size_t>(order[static_cast<std::size_t>(k)])].wait();
    for (int t = 0; t < tensors; ++t) {
      const auto& d = data[static_cast<std::size_t>(t)];
      for (std::size_t i = 0; i < d.size(); ++i) {
        float expect = 0;
        for (int q = 0; q < p; ++q) expect += value(step, t, q, i);
        if (d[i] != expect) {
          fail("step " + std::to_string(step) + " grad." + std::to_string(t) + "[" + std::to_string(i) +
               "] = " + std::to_string(d[i]) + ", expected " + std::to_string(expect));
          return;
        }
      }
    }
  }
  const auto s = engine.stats();
  if (s.tensors != 30u * tensors) fail("stats.tensors = " + std::to_string(s.tensors));
  if (s.collectives >= s.tensors) fail("no fusion: " + std::to_string(s.collectives) + " calls");
  if (r == 0)
    std::printf("steps: %llu tensors in %llu collective calls, %llu negotiation cycles\n",
                static_cast<unsigned long long>(s.tensors), static_cast<unsigned long long>(s.collectives),
                static_cast<unsigned long long>(s.cycles));
}

void mismatch(Communicator& world) {
  Engine engine(world);
  std::vector<double> w(world.rank() == 1 ? 8 : 16, 1.0);
  try {
    engine.enqueue_allreduce("conv1.weight", w.data(), w.size(), DataType::f64, ReduceOp::avg).wait();
    fail("the mismatched tensor completed");
  } catch (const Error& e) {
    const std::string expect = world.size() == 2
                                   ? "engine: mismatched tensor 'conv1.weight': rank 0 enqueued allreduce "
                                     "of 16 f64 (avg); rank 1 enqueued allreduce of 8 f64 (avg)"
                                   : "engine: mismatched tensor 'conv1.weight': ranks 0, 2";
    if (e.code() != ErrorCode::mismatch || std::string(e.what()).rfind(expect, 0) != 0)
      fail(std::string("unexpected error: ") + e.what());
  }
  std::vector<double> ok(4, 1.0);
  engine.enqueue_allreduce("after", ok.data(), 4, DataType::f64, ReduceOp::sum).wait();
  if (ok != std::vector<double>(4, world.size())) fail("the tensor after the mismatch is wrong");
}

void stall(Communicator& world) {
  EngineOptions o = EngineOptions::from_environment();
  o.stall_warning = std::chrono::milliseconds(300);
  std::mutex mutex;
  std::vector<std::string> reports;
  o.on_stall = [&](const std::string& m) {
    std::lock_guard lock(mutex);
    reports.push_back(m);
  };
  Engine engine(world, o);
  std::vector<float> x(3, 1.f);
  if (world.rank() != 0) std::this_thread::sleep_for(std::chrono::seconds(1));
  engine.enqueue_allreduce("late", x.data(), 3, DataType::f32, ReduceOp::sum).wait();
  if (x != std::vector<float>(3, static_cast<float>(world.size()))) fail("the late tensor is wrong");
  if (world.rank() == 0) {
    std::string missing = "ranks 1";
    for (int q = 2; q < world.size(); ++q) missing += ", " + std::to_string(q);
    if (world.size() == 2) missing = "rank 1";
    const std::string expect = "enqueued by rank 0, still missing on " + missing;
    if (reports.empty() || reports[0].find("tensor 'late'") == std::string::npos ||
        reports[0].find(expect) == std::string::npos)
      fail("rank 0 did not report the stall: " + (reports.empty() ? std::string("(none)") : reports[0]));
  }
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  try {
    Communicator world = init();
    if (mode == "steps")
      steps(world);
    else if (mode == "mismatch")
      mismatch(world);
    else if (mode == "stall")
      stall(world);
    else {
      std::fprintf(stderr, "usage: engine_program steps|mismatch|stall\n");
      return 2;
    }
  } catch (const std::exception& e) {
    fail(std::string("exception: ") + e.what());
  }
  std::fflush(stdout);
  return failures == 0 ? 0 : 1;
}
