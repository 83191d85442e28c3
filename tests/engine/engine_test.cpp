// The training engine, with ranks as threads: negotiation (message format, the table's decisions),
// fusion, enqueue orders that differ across ranks, handles completing in any order, mismatch,
// stall and abort errors, allgather and broadcast, the timeline, and the environment settings.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <random>
#include <set>
#include <thread>

#include "engine/negotiation.hpp"
#include "harness.hpp"
#include "tutti/engine.hpp"

namespace tutti {
namespace {

using engine::Descriptor;
using engine::Message;
using engine::Table;
using testing::run_ranks;
using Clock = std::chrono::steady_clock;

Descriptor allreduce(std::string name, std::uint64_t count, DataType type = DataType::f32,
                     ReduceOp op = ReduceOp::sum) {
  return Descriptor{std::move(name), Collective::allreduce, type, op, 0, count};
}

// ---- negotiation: messages and the table --------------------------------------------------------

TEST(EngineNegotiation, MessageRoundTrip) {
  Message m;
  m.shutting_down = true;
  m.cached = {0, 3, 9};
  m.described = {allreduce("a", 7, DataType::f64, ReduceOp::max),
                 Descriptor{"b\"q", Collective::broadcast, DataType::i32, ReduceOp::sum, 2, 5}};
  m.expired = {"x"};
  const auto bytes = m.encode(10);
  const auto back = Message::decode(bytes, 10);
  EXPECT_TRUE(back.shutting_down);
  EXPECT_FALSE(back.aborting);
  EXPECT_EQ(back.cached, m.cached);
  ASSERT_EQ(back.described.size(), 2u);
  EXPECT_EQ(back.described[0].name, "a");
  EXPECT_TRUE(back.described[0].same_shape(m.described[0]));
  EXPECT_EQ(back.described[1].name, "b\"q");
  EXPECT_EQ(back.described[1].root, 2);
  EXPECT_EQ(back.expired, m.expired);
  // A message for another cache size, or cut short, is refused.
  EXPECT_THROW(Message::decode(bytes, 11), Error);
  EXPECT_THROW(Message::decode(std::span(bytes).first(bytes.size() - 1), 10), Error);
}

TEST(EngineNegotiation, ReadyInOneOrderWhateverTheRanksOrder) {
  // Three ranks announce a, b, c in different orders and cycles; every table decides alike.
  std::vector<Table> tables(3, Table(3));
  auto now = Clock::now();
  std::vector<Message> cycle1(3), cycle2(3);
  cycle1[0].described = {allreduce("c", 1), allreduce("a", 1)};
  cycle1[1].described = {allreduce("a", 1)};
  cycle2[0].described = {allreduce("b", 1)};
  cycle2[1].described = {allreduce("b", 1), allreduce("c", 1)};
  cycle2[2].described = {allreduce("b", 1), allreduce("a", 1), allreduce("c", 1)};
  for (auto& t : tables) {
    EXPECT_TRUE(t.apply(cycle1, now).ready.empty());
    const auto waiting = t.waiting();
    ASSERT_EQ(waiting.size(), 2u);
    EXPECT_EQ(waiting[0].name, "a");
    EXPECT_EQ(waiting[0].missing, std::vector<int>{2});
    EXPECT_EQ(waiting[1].name, "c");
    EXPECT_EQ(waiting[1].enqueued, std::vector<int>{0});
    const auto d = t.apply(cycle2, now);
    std::vector<std::string> names;
    for (const auto& r : d.ready) names.push_back(r.name);
    EXPECT_EQ(names, (std::vector<std::string>{"c", "a", "b"}));  // order of first announcement
    EXPECT_TRUE(t.idle());
    EXPECT_EQ(t.cache_size(), 3u);
    EXPECT_EQ(t.cached_slot(allreduce("a", 1)), 1u);
    EXPECT_FALSE(t.cached_slot(allreduce("a", 2)).has_value());  // reshaped: described in full
  }
  // Steady state: the cached names travel as bits and come out ready again.
  std::vector<Message> cycle3(3);
  for (auto& m : cycle3) m.cached = {0, 1, 2};
  for (auto& t : tables) EXPECT_EQ(t.apply(cycle3, now).ready.size(), 3u);
}

TEST(EngineNegotiation, MismatchNamesTheTensorTheRanksAndBothShapes) {
  Table table(3);
  std::vector<Message> m(3);
  m[0].described = {allreduce("fc1.weight", 100)};
  m[1].described = {allreduce("fc1.weight", 200)};
  m[2].described = {allreduce("fc1.weight", 100)};
  const auto d = table.apply(m, Clock::now());
  EXPECT_TRUE(d.ready.empty());
  ASSERT_FALSE(d.failed.empty());
  EXPECT_EQ(d.failed.back().code, ErrorCode::mismatch);
  EXPECT_EQ(d.failed.back().message,
            "engine: mismatched tensor 'fc1.weight': ranks 0, 2 enqueued allreduce of 100 f32 (sum); rank 1 enqueued "
            "allreduce of 200 f32 (sum)");
  EXPECT_TRUE(table.idle());
}

TEST(EngineNegotiation, ShapesOfTheSameCountMismatchAndTravel) {
  // Tensors given with their dims: [6, 4] and [4, 6] (24 elements each) are not the same tensor.
  auto shaped = [](std::vector<std::int64_t> dims) {
    Descriptor d = allreduce("t", 24);
    d.dims = std::move(dims);
    return d;
  };
  Message m;
  m.described = {shaped({6, 4}), allreduce("u", 3)};
  const auto bytes = m.encode(0);
  const auto back = Message::decode(bytes, 0);
  ASSERT_EQ(back.described.size(), 2u);
  EXPECT_EQ(back.described[0].dims, (std::vector<std::int64_t>{6, 4}));
  EXPECT_TRUE(back.described[1].dims.empty());
  Table table(2);
  std::vector<Message> cycle(2);
  cycle[0].described = {shaped({6, 4})};
  cycle[1].described = {shaped({4, 6})};
  const auto d = table.apply(cycle, Clock::now());
  ASSERT_EQ(d.failed.size(), 1u);
  EXPECT_EQ(d.failed[0].code, ErrorCode::mismatch);
  EXPECT_EQ(d.failed[0].message,
            "engine: mismatched tensor 't': rank 0 enqueued allreduce of 24 f32 [6, 4] (sum); rank 1 enqueued "
            "allreduce of 24 f32 [4, 6] (sum)");
  cycle[1].described = {shaped({6, 4})};
  EXPECT_EQ(table.apply(cycle, Clock::now()).ready.size(), 1u);
}

TEST(EngineNegotiation, ExpiredNamesFailWithTheMissingRanks) {
  Table table(2);
  std::vector<Message> m(2);
  m[1].described = {allreduce("lonely", 4)};
  table.apply(m, Clock::now());
  std::vector<Message> verdict(2);
  verdict[0].expired = {"lonely"};
  const auto d = table.apply(verdict, Clock::now());
  ASSERT_EQ(d.failed.size(), 1u);
  EXPECT_EQ(d.failed[0].code, ErrorCode::timeout);
  EXPECT_NE(d.failed[0].message.find("enqueued by rank 1 but never by rank 0"), std::string::npos)
      << d.failed[0].message;
}

TEST(EngineNegotiation, AVerdictThatCrossesTheLastAnnouncementIsVoid) {
  // Rank 0 judged "late" stalled from its table, while in the same cycle rank 1 announced it:
  // every rank has it now, so it runs; the verdict is dropped on every table alike.
  std::vector<Table> tables(2, Table(2));
  std::vector<Message> first(2);
  first[0].described = {allreduce("late", 4)};
  std::vector<Message> crossing(2);
  crossing[0].expired = {"late"};
  crossing[1].described = {allreduce("late", 4)};
  for (auto& t : tables) {
    t.apply(first, Clock::now());
    const auto d = t.apply(crossing, Clock::now());
    EXPECT_TRUE(d.failed.empty()) << d.failed[0].message;
    ASSERT_EQ(d.ready.size(), 1u);
    EXPECT_EQ(d.ready[0].name, "late");
    EXPECT_TRUE(t.idle());
  }
}

TEST(EngineNegotiation, WaitingAndLeavingRanksAreCounted) {
  // What an engine reads to ring for a round at once when it enqueues: how many ranks wait (a
  // rank shutting down sends waiting too). A tensor a leaving rank never announced fails at once.
  Table table(3);
  std::vector<Message> m(3);
  m[0].waiting = true;
  m[0].described = {allreduce("w", 1)};
  m[2].waiting = m[2].shutting_down = true;
  const auto d = table.apply(m, Clock::now());
  EXPECT_EQ(d.waiting_ranks, 2);
  EXPECT_FALSE(d.all_waiting);
  EXPECT_FALSE(d.shutdown);
  ASSERT_EQ(d.failed.size(), 1u);
  EXPECT_EQ(d.failed[0].code, ErrorCode::aborted);
  EXPECT_EQ(d.failed[0].message,
            "engine: tensor 'w' can never complete: rank 2 destroyed the engine without enqueuing it");
  // Rank 1, announcing it later, learns the failure too; nothing is ready.
  std::vector<Message> later(3);
  later[1].described = {allreduce("w", 1)};
  later[2].shutting_down = true;
  const auto d2 = table.apply(later, Clock::now());
  EXPECT_TRUE(d2.ready.empty());
  ASSERT_EQ(d2.failed.size(), 1u);
  EXPECT_EQ(d2.failed[0].name, "w");
  EXPECT_EQ(d2.waiting_ranks, 0);
}

// ---- the engine, ranks as threads ----------------------------------------------------------------

EngineOptions quiet(std::chrono::microseconds cycle = std::chrono::microseconds(1000)) {
  EngineOptions o;
  o.cycle_time = cycle;
  return o;
}

// Value of element i of tensor t on rank r (small integers: exact in every type and op below).
double value(int t, int r, std::size_t i) { return static_cast<double>((t * 7 + r * 3 + static_cast<int>(i)) % 5); }

TEST(Engine, FusesManyMixedTensorsEnqueuedInDifferentOrders) {
  constexpr int tensors = 200;
  for (int p : {2, 3, 4}) {
    const auto failures = run_ranks(p, [&](Communicator& comm) {
      Engine engine(comm, quiet(std::chrono::microseconds(100'000)));
      const int r = comm.rank();
      // Mixed sizes (1 .. 5000 elements), types and ops; a per-rank shuffled enqueue order.
      struct T {
        int id;
        std::size_t n;
        DataType type;
        ReduceOp op;
        std::vector<double> f64;
        std::vector<float> f32;
        std::vector<std::int32_t> i32;
        Handle h;
      };
      std::vector<T> ts(tensors);
      for (int t = 0; t < tensors; ++t) {
        auto& x = ts[static_cast<std::size_t>(t)];
        x.id = t;
        x.n = 1 + static_cast<std::size_t>((t * 7919) % 5000);
        x.type = t % 3 == 0 ? DataType::f64 : t % 3 == 1 ? DataType::f32 : DataType::i32;
        x.op = t % 2 == 0 ? ReduceOp::sum : ReduceOp::max;
        for (std::size_t i = 0; i < x.n; ++i) {
          if (x.type == DataType::f64) x.f64.push_back(value(t, r, i));
          if (x.type == DataType::f32) x.f32.push_back(static_cast<float>(value(t, r, i)));
          if (x.type == DataType::i32) x.i32.push_back(static_cast<std::int32_t>(value(t, r, i)));
        }
      }
      std::vector<int> order(tensors);
      std::iota(order.begin(), order.end(), 0);
      std::shuffle(order.begin(), order.end(), std::mt19937(static_cast<unsigned>(r) + 1));
      for (int t : order) {
        auto& x = ts[static_cast<std::size_t>(t)];
        void* buf = x.type == DataType::f64   ? static_cast<void*>(x.f64.data())
                    : x.type == DataType::f32 ? static_cast<void*>(x.f32.data())
                                              : static_cast<void*>(x.i32.data());
        x.h = engine.enqueue_allreduce("t" + std::to_string(t), buf, x.n, x.type, x.op);
      }
      // Handles complete in any order: wait in yet another order.
      std::shuffle(order.begin(), order.end(), std::mt19937(static_cast<unsigned>(r) + 100));
      for (int t : order) ts[static_cast<std::size_t>(t)].h.wait();
      for (auto& x : ts) {
        for (std::size_t i = 0; i < x.n; ++i) {
          double expect = x.op == ReduceOp::sum ? 0 : -1e9;
          for (int q = 0; q < p; ++q)
            expect = x.op == ReduceOp::sum ? expect + value(x.id, q, i) : std::max(expect, value(x.id, q, i));
          const double got = x.type == DataType::f64   ? x.f64[i]
                             : x.type == DataType::f32 ? static_cast<double>(x.f32[i])
                                                       : static_cast<double>(x.i32[i]);
          if (got != expect)
            throw std::runtime_error("tensor t" + std::to_string(x.id) + "[" + std::to_string(i) +
                                     "] = " + std::to_string(got) + ", expected " + std::to_string(expect));
        }
      }
      const auto s = engine.stats();
      EXPECT_EQ(s.tensors, static_cast<std::uint64_t>(tensors));
      // Six (type, op) groups; fusion packs 200 tensors into far fewer calls.
      EXPECT_LE(s.collectives, static_cast<std::uint64_t>(tensors / 4)) << "p=" << p;
      EXPECT_GE(s.collectives, 6u);
    });
    EXPECT_EQ(failures, "") << "p=" << p;
  }
}

TEST(Engine, SteadyStateStepsReuseTheCacheAndStayCorrect) {
  const auto failures = run_ranks(3, [&](Communicator& comm) {
    Engine engine(comm, quiet());
    for (int step = 0; step < 20; ++step) {
      std::vector<std::vector<float>> grads(8);
      std::vector<Handle> hs;
      for (int t = 7; t >= 0; --t) {  // "backward": last layer first
        grads[static_cast<std::size_t>(t)].assign(static_cast<std::size_t>(100 * (t + 1)),
                                                  static_cast<float>(comm.rank() + step + t));
        hs.push_back(engine.enqueue_allreduce("layer" + std::to_string(t), grads[static_cast<std::size_t>(t)].data(),
                                              grads[static_cast<std::size_t>(t)].size(), DataType::f32, ReduceOp::avg));
      }
      for (auto& h : hs) h.wait();
      for (int t = 0; t < 8; ++t)
        for (float v : grads[static_cast<std::size_t>(t)])
          ASSERT_EQ(v, static_cast<float>(1 + step + t));  // mean of rank+step+t over ranks 0..2
    }
    EXPECT_EQ(engine.stats().tensors, 160u);
  });
  EXPECT_EQ(failures, "");
}

TEST(Engine, AllgatherBroadcastAndOutOfPlaceAllreduce) {
  const auto failures = run_ranks(3, [&](Communicator& comm) {
    Engine engine(comm, quiet());
    const int r = comm.rank();
    std::vector<std::int64_t> mine(5, r * 10), all(15, -1);
    std::vector<double> b(4, r == 2 ? 3.5 : 0.0);
    std::vector<float> in(6, static_cast<float>(r + 1)), out(6, 0.f);
    auto h1 = engine.enqueue_allgather("g", mine.data(), all.data(), 5, DataType::i64);
    auto h2 = engine.enqueue_broadcast("b", b.data(), 4, DataType::f64, 2);
    auto h3 = engine.enqueue_allreduce("a", in.data(), out.data(), 6, DataType::f32, ReduceOp::prod);
    auto h4 = engine.enqueue_allreduce("empty", nullptr, nullptr, 0, DataType::f32, ReduceOp::sum);
    h3.wait();
    h4.wait();
    h2.wait();
    h1.wait();
    for (int q = 0; q < 3; ++q)
      for (int i = 0; i < 5; ++i) EXPECT_EQ(all[static_cast<std::size_t>(q * 5 + i)], q * 10);
    EXPECT_EQ(b, std::vector<double>(4, 3.5));
    EXPECT_EQ(out, std::vector<float>(6, 6.f));
    EXPECT_EQ(in, std::vector<float>(6, static_cast<float>(r + 1)));
  });
  EXPECT_EQ(failures, "");
}

TEST(Engine, MismatchFailsOnEveryRankAndTheEngineGoesOn) {
  std::mutex mutex;
  std::vector<std::string> messages;
  const auto failures = run_ranks(3, [&](Communicator& comm) {
    Engine engine(comm, quiet());
    const int r = comm.rank();
    std::vector<float> w(r == 1 ? 10 : 20, 1.f);
    std::vector<double> v(4, 1.0);
    auto h = engine.enqueue_allreduce("w", w.data(), w.size(), DataType::f32, ReduceOp::sum);
    auto hv = engine.enqueue_allreduce("v", v.data(), 4, DataType::f64, r == 2 ? ReduceOp::max : ReduceOp::sum);
    for (Handle* x : {&h, &hv}) {
      try {
        x->wait();
        ADD_FAILURE() << "rank " << r << ": a mismatched tensor completed";
      } catch (const Error& e) {
        EXPECT_EQ(e.code(), ErrorCode::mismatch);
        std::lock_guard lock(mutex);
        messages.push_back(e.what());
      }
    }
    // A later, matching tensor of the same name works.
    std::vector<float> ok(3, static_cast<float>(r));
    engine.enqueue_allreduce("w", ok.data(), 3, DataType::f32, ReduceOp::sum).wait();
    EXPECT_EQ(ok, std::vector<float>(3, 3.f));
  });
  EXPECT_EQ(failures, "");
  ASSERT_EQ(messages.size(), 6u);
  const std::set<std::string> distinct(messages.begin(), messages.end());
  EXPECT_EQ(distinct, (std::set<std::string>{
                          "engine: mismatched tensor 'w': ranks 0, 2 enqueued allreduce of 20 f32 (sum); rank 1 "
                          "enqueued allreduce of 10 f32 (sum)",
                          "engine: mismatched tensor 'v': ranks 0, 1 enqueued allreduce of 4 f64 (sum); rank 2 "
                          "enqueued allreduce of 4 f64 (max)"}));
}

TEST(Engine, AllreduceWithDimsChecksTheShapeOnEveryRank) {
  const auto failures = run_ranks(2, [&](Communicator& comm) {
    Engine engine(comm, quiet());
    const int r = comm.rank();
    std::vector<float> x(24, 1.f);
    const std::vector<std::int64_t> dims = r == 0 ? std::vector<std::int64_t>{6, 4} : std::vector<std::int64_t>{4, 6};
    try {
      engine.enqueue_allreduce("x", x.data(), x.data(), dims, DataType::f32, ReduceOp::sum).wait();
      ADD_FAILURE() << "rank " << r << ": tensors of different shapes were reduced";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::mismatch);
    }
    const std::vector<std::int64_t> same{2, 12};
    engine.enqueue_allreduce("x", x.data(), x.data(), same, DataType::f32, ReduceOp::sum).wait();
    EXPECT_EQ(x, std::vector<float>(24, 2.f));
    const std::vector<std::int64_t> negative{-1, 3};
    EXPECT_THROW(engine.enqueue_allreduce("y", x.data(), x.data(), negative, DataType::f32, ReduceOp::sum), Error);
  });
  EXPECT_EQ(failures, "");
}

TEST(Engine, AJoinedRankReducesZerosAndRefusesGathersUntilEveryRankJoined) {
  const auto failures = run_ranks(3, [&](Communicator& comm) {
    Engine engine(comm, quiet());
    const int r = comm.rank();
    if (r == 0) {
      Handle joined = engine.join();
      EXPECT_THROW(engine.join(), Error);  // joined already
      joined.wait();
    } else {
      std::vector<std::int32_t> x(5, r + 1);
      engine.enqueue_allreduce("x", x.data(), x.size(), DataType::i32, ReduceOp::sum).wait();
      EXPECT_EQ(x, std::vector<std::int32_t>(5, 2 + 3));  // rank 0 gave zeros
      std::vector<std::int32_t> mine(2, r), all(6, -1);
      try {
        engine.enqueue_allgather("g", mine.data(), all.data(), 2, DataType::i32).wait();
        ADD_FAILURE() << "rank " << r << ": an allgather with a joined rank completed";
      } catch (const Error& e) {
        EXPECT_EQ(e.code(), ErrorCode::mismatch);
        EXPECT_NE(std::string(e.what()).find("rank 0 joined"), std::string::npos) << e.what();
      }
      if (r == 2) {
        // Rank 2 joins last, whatever the timing: an allreduce of its own completes only once ranks
        // 0 and 1 have joined (they give zeros), so their joins were decided before rank 2's.
        std::vector<std::int32_t> alone(4, 7);
        engine.enqueue_allreduce("alone", alone.data(), alone.size(), DataType::i32, ReduceOp::sum).wait();
        EXPECT_EQ(alone, std::vector<std::int32_t>(4, 7));
      }
      engine.join().wait();
    }
    EXPECT_EQ(engine.last_joined(), 2);
    // Every rank is back: the next allreduce is everyone's.
    std::vector<std::int32_t> y(3, r);
    engine.enqueue_allreduce("y", y.data(), y.size(), DataType::i32, ReduceOp::sum).wait();
    EXPECT_EQ(y, std::vector<std::int32_t>(3, 0 + 1 + 2));
  });
  EXPECT_EQ(failures, "");
}

TEST(Engine, StallWarningNamesTheTensorAndTheMissingRanksThenCompletes) {
  std::mutex mutex;
  std::vector<std::string> reports;
  const auto failures = run_ranks(3, [&](Communicator& comm) {
    EngineOptions o = quiet();
    o.stall_warning = std::chrono::milliseconds(150);
    o.on_stall = [&](const std::string& m) {
      std::lock_guard lock(mutex);
      reports.push_back(m);
    };
    Engine engine(comm, o);
    std::vector<float> x(2, 1.f);
    Handle h;
    if (comm.rank() == 0) {
      h = engine.enqueue_allreduce("late", x.data(), 2, DataType::f32, ReduceOp::sum);
      EXPECT_FALSE(h.wait_for(std::chrono::milliseconds(500)));
    }
    comm.barrier();  // rank 0 has waited past the warning
    if (comm.rank() != 0) h = engine.enqueue_allreduce("late", x.data(), 2, DataType::f32, ReduceOp::sum);
    h.wait();
    EXPECT_EQ(x, std::vector<float>(2, 3.f));
  });
  EXPECT_EQ(failures, "");
  ASSERT_FALSE(reports.empty());
  EXPECT_NE(reports[0].find("tensor 'late'"), std::string::npos) << reports[0];
  EXPECT_NE(reports[0].find("enqueued by rank 0, still missing on ranks 1, 2"), std::string::npos) << reports[0];
}

TEST(Engine, StallLimitFailsTheTensorWithTimeout) {
  const auto failures = run_ranks(2, [&](Communicator& comm) {
    EngineOptions o = quiet();
    o.stall_warning = std::chrono::milliseconds(0);
    // Long enough that "after", which both ranks enqueue right after a barrier, never waits that
    // long for the second rank, even under a sanitizer on a loaded machine.
    o.stall_error = std::chrono::milliseconds(1000);
    Engine engine(comm, o);
    std::vector<float> x(2, 1.f);
    if (comm.rank() == 1) {
      try {
        engine.enqueue_allreduce("never", x.data(), 2, DataType::f32, ReduceOp::sum).wait();
        ADD_FAILURE() << "the stalled tensor completed";
      } catch (const Error& e) {
        EXPECT_EQ(e.code(), ErrorCode::timeout);
        EXPECT_NE(std::string(e.what()).find("'never' was enqueued by rank 1 but never by rank 0"), std::string::npos)
            << e.what();
      }
    }
    comm.barrier();
    engine.enqueue_allreduce("after", x.data(), 2, DataType::f32, ReduceOp::sum).wait();
    EXPECT_EQ(x, std::vector<float>(2, 2.f));
  });
  EXPECT_EQ(failures, "");
}

TEST(Engine, BadArgumentsAreRefusedAtOnce) {
  const auto failures = run_ranks(2, [&](Communicator& comm) {
    Engine engine(comm, quiet());
    std::vector<float> x(4, 1.f);
    auto code = [](auto&& f) {
      try {
        f();
      } catch (const Error& e) {
        return e.code();
      }
      return ErrorCode::system;
    };
    EXPECT_EQ(code([&] { engine.enqueue_allreduce("", x.data(), 4, DataType::f32, ReduceOp::sum); }),
              ErrorCode::invalid_argument);
    EXPECT_EQ(code([&] { engine.enqueue_allreduce("n", nullptr, 4, DataType::f32, ReduceOp::sum); }),
              ErrorCode::invalid_argument);
    EXPECT_EQ(code([&] { engine.enqueue_broadcast("b", x.data(), 4, DataType::f32, 2); }), ErrorCode::invalid_argument);
    std::vector<float> all(8);
    EXPECT_EQ(code([&] { engine.enqueue_allgather("g", all.data() + 1, all.data(), 4, DataType::f32); }),
              ErrorCode::invalid_argument);
    auto h = engine.enqueue_allreduce("dup", x.data(), 4, DataType::f32, ReduceOp::sum);
    EXPECT_EQ(code([&] { engine.enqueue_allreduce("dup", x.data(), 4, DataType::f32, ReduceOp::sum); }),
              ErrorCode::invalid_argument);
    h.wait();
    EXPECT_EQ(x, std::vector<float>(4, 2.f));
  });
  EXPECT_EQ(failures, "");
}

TEST(Engine, PendingTensorsFailWhenTheEngineIsDestroyed) {
  const auto failures = run_ranks(2, [&](Communicator& comm) {
    std::vector<float> x(2, 1.f);
    Handle h;
    {
      Engine engine(comm, quiet());
      if (comm.rank() == 0) h = engine.enqueue_allreduce("orphan", x.data(), 2, DataType::f32, ReduceOp::sum);
    }
    try {
      h.wait();
      if (comm.rank() == 0) ADD_FAILURE() << "the orphan completed";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::aborted);
    }
  });
  EXPECT_EQ(failures, "");
}

TEST(Engine, ATensorARankLeftWithoutFailsAtOnceAndNoDestructorWaitsForTheCycle) {
  // Rank 1 destroys its engine without enqueuing "left-behind": rank 0's tensor can never
  // complete and fails with the rank named. With a 600 s cycle, both this and the collective
  // destruction must come from the doorbells alone.
  const auto start = Clock::now();
  const auto failures = run_ranks(2, [&](Communicator& comm) {
    std::vector<float> x(2, 1.f);  // outlives the engine
    Engine engine(comm, quiet(std::chrono::seconds(600)));
    if (comm.rank() == 1) return;
    try {
      engine.enqueue_allreduce("left-behind", x.data(), 2, DataType::f32, ReduceOp::sum).wait();
      ADD_FAILURE() << "completed without rank 1";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::aborted);
      EXPECT_EQ(std::string(e.what()),
                "engine: tensor 'left-behind' can never complete: rank 1 destroyed the engine without enqueuing it");
    }
  });
  EXPECT_EQ(failures, "");
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(300)) << "waited for the cycle";
}

TEST(Engine, AnEngineDestroyedByAnErrorStopsEveryRank) {
  const auto failures = run_ranks(2, [&](Communicator& comm) {
    std::vector<float> x(2, 1.f);
    if (comm.rank() == 1) {
      try {
        Engine engine(comm, quiet());
        throw std::runtime_error("the model diverged");
      } catch (const std::runtime_error&) {
      }
      return;
    }
    Engine engine(comm, quiet());
    try {
      engine.enqueue_allreduce("x", x.data(), 2, DataType::f32, ReduceOp::sum).wait();
      ADD_FAILURE() << "completed without rank 1";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::aborted);
      EXPECT_NE(std::string(e.what()).find("rank 1 destroyed the engine while handling an error"), std::string::npos)
          << e.what();
    }
    try {  // the engine stays stopped
      engine.enqueue_allreduce("y", x.data(), 2, DataType::f32, ReduceOp::sum);
      ADD_FAILURE() << "enqueue after the engine stopped";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::aborted);
    }
  });
  EXPECT_EQ(failures, "");
}

TEST(Engine, TimelineIsChromeTraceJsonWithEveryPhase) {
  const auto dir = std::filesystem::temp_directory_path() / ("tutti_timeline_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const auto failures = run_ranks(2, [&](Communicator& comm) {
    EngineOptions o = quiet(std::chrono::microseconds(20'000));
    o.timeline_path = (dir / "tl_{rank}.json").string();
    Engine engine(comm, o);
    std::vector<std::vector<float>> g(4, std::vector<float>(64, 1.f));
    std::vector<float> big(1 << 16, 1.f);
    const auto t0 = Clock::now();
    std::vector<Handle> hs;
    for (int t = 0; t < 4; ++t)
      hs.push_back(engine.enqueue_allreduce("g" + std::to_string(t), g[static_cast<std::size_t>(t)].data(), 64,
                                            DataType::f32, ReduceOp::sum));
    hs.push_back(engine.enqueue_allreduce("big", big.data(), big.size(), DataType::f32, ReduceOp::max));
    engine.record_phase("BACKWARD", t0, Clock::now());
    for (auto& h : hs) h.wait();
    const auto t1 = Clock::now();
    engine.record_phase("OPTIMIZER", t1, Clock::now());
  });
  ASSERT_EQ(failures, "");
  for (int r = 0; r < 2; ++r) {
    std::ifstream in(dir / ("tl_" + std::to_string(r) + ".json"));
    ASSERT_TRUE(in) << "rank " << r << " wrote no timeline";
    const auto events = nlohmann::json::parse(in);  // throws on invalid JSON
    ASSERT_TRUE(events.is_array());
    std::map<std::string, std::set<std::string>> phases;  // lane name -> phases
    std::map<int, std::string> lanes;
    for (const auto& e : events)
      if (e["ph"] == "M" && e["name"] == "thread_name") lanes[e["tid"].get<int>()] = e["args"]["name"];
    for (const auto& e : events) {
      if (e["ph"] != "X") continue;
      EXPECT_EQ(e["pid"], r);
      EXPECT_GE(e["dur"].get<double>(), 0.0);
      phases[lanes.at(e["tid"].get<int>())].insert(e["name"].get<std::string>());
    }
    const std::set<std::string> fused{"NEGOTIATE", "QUEUE", "MEMCPY_IN_FUSION_BUFFER", "ALLREDUCE",
                                      "MEMCPY_OUT_FUSION_BUFFER"};
    for (int t = 0; t < 4; ++t) EXPECT_EQ(phases["g" + std::to_string(t)], fused) << "rank " << r;
    EXPECT_EQ(phases["big"], (std::set<std::string>{"NEGOTIATE", "QUEUE", "ALLREDUCE"}));  // another op: alone
    EXPECT_EQ(phases["step"], (std::set<std::string>{"BACKWARD", "OPTIMIZER"}));
  }
  std::filesystem::remove_all(dir);
}

// Engines on sub-communicators (two groups of one rank each, as a pipeline's data groups) name
// their timelines by the rank they are told (timeline_rank), not by their group rank (0 for both).
TEST(Engine, TimelineRankNamesTheFileAndThePid) {
  const auto dir = std::filesystem::temp_directory_path() / ("tutti_timeline_rank_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const auto failures = run_ranks(2, [&](Communicator& comm) {
    Communicator group = comm.split(comm.rank(), 0);
    EngineOptions o = quiet(std::chrono::microseconds(20'000));
    o.timeline_path = (dir / "tl_{rank}.json").string();
    o.timeline_rank = 10 + comm.rank();
    Engine engine(group, o);
    engine.record_phase("PIPELINE", Clock::now(), Clock::now());
  });
  ASSERT_EQ(failures, "");
  EXPECT_FALSE(std::filesystem::exists(dir / "tl_0.json"));
  for (int r = 10; r < 12; ++r) {
    std::ifstream in(dir / ("tl_" + std::to_string(r) + ".json"));
    ASSERT_TRUE(in) << "rank " << r << " wrote no timeline";
    const auto events = nlohmann::json::parse(in);
    int phases = 0;
    for (const auto& e : events) {
      EXPECT_EQ(e["pid"], r);
      phases += e["ph"] == "X" && e["name"] == "PIPELINE";
    }
    EXPECT_EQ(phases, 1) << "rank " << r;
  }
  std::filesystem::remove_all(dir);
}

TEST(Engine, OptionsFromTheEnvironment) {
  ::setenv("TUTTI_CYCLE_TIME_MS", "2.5", 1);
  ::setenv("TUTTI_FUSION_THRESHOLD", "1048576", 1);
  ::setenv("TUTTI_STALL_WARNING_S", "7", 1);
  ::setenv("TUTTI_TIMELINE", "/tmp/x.json", 1);
  auto o = EngineOptions::from_environment();
  EXPECT_EQ(o.cycle_time, std::chrono::microseconds(2500));
  EXPECT_EQ(o.fusion_threshold, 1048576u);
  EXPECT_EQ(o.stall_warning, std::chrono::milliseconds(7000));
  EXPECT_EQ(o.timeline_path, "/tmp/x.json");
  ::setenv("TUTTI_FUSION_THRESHOLD", "64M", 1);
  try {
    EngineOptions::from_environment();
    ADD_FAILURE() << "a malformed TUTTI_FUSION_THRESHOLD was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::invalid_argument);
    EXPECT_NE(std::string(e.what()).find("TUTTI_FUSION_THRESHOLD"), std::string::npos);
  }
  for (const char* v : {"TUTTI_CYCLE_TIME_MS", "TUTTI_FUSION_THRESHOLD", "TUTTI_STALL_WARNING_S", "TUTTI_TIMELINE"})
    ::unsetenv(v);
  const EngineOptions d = EngineOptions::from_environment();
  EXPECT_EQ(d.cycle_time, std::chrono::microseconds(1000));
  EXPECT_EQ(d.fusion_threshold, 64u << 20);
  EXPECT_EQ(d.stall_warning, std::chrono::milliseconds(60'000));
  EXPECT_TRUE(d.timeline_path.empty());
}

}  // namespace
}  // namespace tutti
