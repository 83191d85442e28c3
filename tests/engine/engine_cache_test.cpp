// The engine's response cache and the negotiation round built on it: tensors the cache describes
// cost a count in one allreduce per cycle, whose payload does not grow with the ranks; the full
// exchange runs only for what is not cached (and for stalls and errors); the cache evicts at
// capacity, replaces a reshaped tensor's entry, and ranks whose caches differ are detected.
// Ranks are simulated table by table (as the engine runs them) and, at the end, as threads.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "engine/engine_core.hpp"
#include "engine/negotiation.hpp"
#include "harness.hpp"

namespace tutti {
namespace {

using engine::Decision;
using engine::Descriptor;
using engine::Ledger;
using engine::Message;
using engine::Table;
using engine::Tally;
using testing::run_ranks;
using Clock = std::chrono::steady_clock;

Descriptor allreduce(std::string name, std::uint64_t count) {
  return Descriptor{std::move(name), Collective::allreduce, DataType::f32, ReduceOp::sum, 0, count};
}

std::vector<std::string> names(const std::vector<Descriptor>& ds) {
  std::vector<std::string> out;
  for (const auto& d : ds) out.push_back(d.name);
  return out;
}

// Every rank's Table and Ledger, one cycle at a time as EngineCore::cycle runs it: enqueue, the
// allreduce (summed here), the full exchange where some rank asks for it, apply, settle.
struct Ranks {
  explicit Ranks(int p, std::size_t capacity = 65536)
      : tables(static_cast<std::size_t>(p), Table(p, capacity)), ledgers(static_cast<std::size_t>(p)) {}

  struct Cycle {
    Decision decision;  // rank 0's; every rank's is checked to be the same
    bool exchanged = false;
    std::size_t payload = 0;  // bytes of the allreduce
  };

  Cycle cycle(const std::vector<std::vector<Descriptor>>& enqueued, Clock::time_point stale = Clock::time_point::min(),
              Clock::time_point now = Clock::now()) {
    const std::size_t p = tables.size();
    for (std::size_t r = 0; r < p && r < enqueued.size(); ++r)
      for (const auto& d : enqueued[r]) ledgers[r].enqueue(d, tables[r], now);
    std::vector<std::uint32_t> sums;
    for (std::size_t r = 0; r < p; ++r) {
      const auto part = ledgers[r].contribution(tables[r], ledgers[r].needs_exchange(stale), false);
      sums.resize(std::max(sums.size(), part.size()), 0);
      for (std::size_t k = 0; k < part.size(); ++k) sums[k] += part[k];
    }
    Cycle c;
    c.payload = sums.size() * sizeof(std::uint32_t);
    const Tally tally = tables[0].tally(sums);
    std::vector<Message> messages;
    if (tally.exchange > 0) {
      messages.resize(p);
      for (std::size_t r = 0; r < p; ++r) ledgers[r].announce(tables[r].tally(sums), tables[r], messages[r]);
      c.exchanged = true;
    }
    for (std::size_t r = 0; r < p; ++r) {
      const auto d = tables[r].apply(tables[r].tally(sums), messages, now);
      ledgers[r].settle(tally, !messages.empty(), p);
      if (r == 0) {
        c.decision = d;
      } else {
        EXPECT_EQ(names(d.ready), names(c.decision.ready)) << "rank " << r << " decided otherwise";
        EXPECT_EQ(d.failed.size(), c.decision.failed.size());
      }
      EXPECT_EQ(tables[r].cache_size(), tables[0].cache_size());
      EXPECT_EQ(tables[r].cache_hash(), tables[0].cache_hash());
    }
    return c;
  }

  std::vector<Table> tables;
  std::vector<Ledger> ledgers;
};

TEST(EngineCache, CachedTensorsCostOneAllreduceAndRunInSlotOrder) {
  Ranks ranks(3);
  const auto a = allreduce("a", 4), b = allreduce("b", 8), c = allreduce("c", 2);
  // First time: described, so the full exchange runs; ready in order of first announcement.
  auto first = ranks.cycle({{b, a}, {a, b}, {b, a}});
  EXPECT_TRUE(first.exchanged);
  EXPECT_EQ(names(first.decision.ready), (std::vector<std::string>{"b", "a"}));
  ranks.cycle({{c}, {c}, {c}});
  // Cached now: announced over cycles in any order, no exchange until every rank holds them;
  // then they run in slot order (b, a, c), the same on every rank.
  auto partly = ranks.cycle({{c, a}, {b}, {}});
  EXPECT_FALSE(partly.exchanged);
  EXPECT_TRUE(partly.decision.ready.empty());
  EXPECT_FALSE(ranks.tables[0].idle());  // some rank holds something: not idle
  partly = ranks.cycle({{b}, {a, c}, {a, c}});
  EXPECT_FALSE(partly.exchanged);
  EXPECT_EQ(names(partly.decision.ready), (std::vector<std::string>{"a", "c"}));
  auto last = ranks.cycle({{}, {}, {b}});
  EXPECT_FALSE(last.exchanged);
  EXPECT_EQ(names(last.decision.ready), (std::vector<std::string>{"b"}));
  EXPECT_TRUE(ranks.tables[0].idle());
  // The ready tensors fuse as before: plan_fusion groups them whatever the order.
  const std::vector<Descriptor> ready = {b, a, c};
  EXPECT_EQ(engine::plan_fusion(ready, 1 << 20, 1 << 20, false), (std::vector<std::vector<std::size_t>>{{0, 1, 2}}));
}

TEST(EngineCache, TheRoundsPayloadDoesNotGrowWithTheRanks) {
  std::vector<std::size_t> payloads;
  for (int p : {2, 16, 256}) {
    Ranks ranks(p);
    std::vector<std::vector<Descriptor>> all(static_cast<std::size_t>(p));
    for (auto& e : all) e = {allreduce("x", 1000), allreduce("y", 10)};
    ranks.cycle(all);
    const auto steady = ranks.cycle(all);
    EXPECT_FALSE(steady.exchanged);
    EXPECT_EQ(steady.decision.ready.size(), 2u);
    payloads.push_back(steady.payload);
  }
  EXPECT_EQ(payloads, std::vector<std::size_t>(3, (Tally::kHeader + 2) * sizeof(std::uint32_t)));
}

TEST(EngineCache, EvictsTheLeastRecentlyReadyAtCapacity) {
  Ranks ranks(2, 2);
  const auto a = allreduce("a", 4), b = allreduce("b", 4), c = allreduce("c", 4);
  ranks.cycle({{a, b}, {a, b}});
  ASSERT_EQ(ranks.tables[0].cache_size(), 2u);
  ASSERT_TRUE(ranks.tables[0].cached_slot(a));
  const auto slot_a = *ranks.tables[0].cached_slot(a);
  EXPECT_FALSE(ranks.cycle({{b}, {b}}).exchanged);  // b ready again: a is the least recent
  EXPECT_TRUE(ranks.cycle({{c}, {c}}).exchanged);
  for (auto& t : ranks.tables) {
    EXPECT_EQ(t.cache_size(), 2u);
    EXPECT_FALSE(t.cached_slot(a));
    EXPECT_EQ(t.cached_slot(c), slot_a);  // c took a's slot
    EXPECT_TRUE(t.cached_slot(b));
  }
  // a again: described afresh (never a's old slot, now c's), and cached in place of b.
  const auto again = ranks.cycle({{a}, {a}});
  EXPECT_TRUE(again.exchanged);
  EXPECT_EQ(names(again.decision.ready), (std::vector<std::string>{"a"}));
  EXPECT_FALSE(ranks.tables[1].cached_slot(b));
  EXPECT_FALSE(ranks.cycle({{c, a}, {a, c}}).exchanged);
  // Everything ready in one cycle beyond the capacity: the last goes uncached, nothing is lost.
  const auto d = allreduce("d", 4);
  const auto crowded = ranks.cycle({{c, a, d}, {d, a, c}});
  EXPECT_TRUE(crowded.exchanged);
  EXPECT_EQ(crowded.decision.ready.size(), 3u);
  EXPECT_EQ(ranks.tables[0].cache_size(), 2u);
}

TEST(EngineCache, AReshapedTensorReplacesItsEntryAndAStaleShapeMismatches) {
  Ranks ranks(2);
  auto t = allreduce("t", 24);
  t.dims = {6, 4};
  ranks.cycle({{t}, {t}});
  const auto slot = ranks.tables[0].cached_slot(t);
  ASSERT_TRUE(slot);
  // Every rank reshapes it: not the cached description, so the full exchange; the entry is
  // replaced in its slot, and the new shape is what runs.
  auto reshaped = t;
  reshaped.dims = {4, 6};
  EXPECT_FALSE(ranks.tables[0].cached_slot(reshaped));
  const auto c = ranks.cycle({{reshaped}, {reshaped}});
  EXPECT_TRUE(c.exchanged);
  ASSERT_EQ(c.decision.ready.size(), 1u);
  EXPECT_EQ(c.decision.ready[0].dims, reshaped.dims);
  for (auto& table : ranks.tables) {
    EXPECT_EQ(table.cached_slot(reshaped), slot);
    EXPECT_FALSE(table.cached_slot(t));
    EXPECT_EQ(table.cached(*slot).dims, reshaped.dims);
  }
  EXPECT_FALSE(ranks.cycle({{reshaped}, {reshaped}}).exchanged);
  // One rank with the old shape (not cached any more: described), one with the cached one: the
  // full exchange judges them, and both learn the mismatch naming both shapes.
  const auto m = ranks.cycle({{t}, {reshaped}});
  EXPECT_TRUE(m.exchanged);
  EXPECT_TRUE(m.decision.ready.empty());
  ASSERT_EQ(m.decision.failed.size(), 1u);
  EXPECT_EQ(m.decision.failed[0].code, ErrorCode::mismatch);
  EXPECT_NE(m.decision.failed[0].message.find("rank 0 enqueued allreduce of 24 f32 [6, 4]"), std::string::npos)
      << m.decision.failed[0].message;
  EXPECT_NE(m.decision.failed[0].message.find("rank 1 enqueued allreduce of 24 f32 [4, 6]"), std::string::npos);
}

TEST(EngineCache, AMismatchAgainstACachedTensorIsJudgedByTheFullExchange) {
  Ranks ranks(3);
  const auto x = allreduce("x", 10);
  ranks.cycle({{x}, {x}, {x}});
  // Rank 0 holds x on the cached path; rank 1 enqueues another count: the exchange moves rank 0's
  // x into the table; rank 2, enqueuing x later, must announce it there too (no cached path for
  // a name the table holds), and then all three are judged.
  const auto first = ranks.cycle({{x}, {allreduce("x", 11)}, {}});
  EXPECT_TRUE(first.exchanged);
  EXPECT_TRUE(first.decision.failed.empty());
  EXPECT_TRUE(ranks.tables[2].has_entry("x"));
  const auto second = ranks.cycle({{}, {}, {x}});
  EXPECT_TRUE(second.exchanged);
  ASSERT_EQ(second.decision.failed.size(), 1u);
  EXPECT_EQ(second.decision.failed[0].message,
            "engine: mismatched tensor 'x': ranks 0, 2 enqueued allreduce of 10 f32 (sum); rank 1 enqueued allreduce "
            "of 11 f32 (sum)");
}

TEST(EngineCache, ATensorHeldTooLongGoesToTheExchangeToNameTheMissingRanks) {
  Ranks ranks(3);
  const auto x = allreduce("x", 10);
  ranks.cycle({{x}, {x}, {x}});
  const auto t0 = Clock::now();
  EXPECT_FALSE(ranks.cycle({{x}, {}, {}}, t0 - std::chrono::seconds(1), t0).exchanged);
  EXPECT_TRUE(ranks.tables[0].waiting().empty());  // the table does not know who holds it
  // Rank 0's x is stale now: the full exchange, and the table names who has not enqueued it,
  // counting from when rank 0 enqueued it.
  const auto later = t0 + std::chrono::seconds(5);
  EXPECT_TRUE(ranks.cycle({}, t0 + std::chrono::seconds(1), later).exchanged);
  // Ranks::cycle does not backdate (the engine does, with what Ledger::announce returns).
  ranks.tables[0].backdate("x", t0);
  const auto w = ranks.tables[0].waiting();
  ASSERT_EQ(w.size(), 1u);
  EXPECT_EQ(w[0].name, "x");
  EXPECT_EQ(w[0].enqueued, std::vector<int>{0});
  EXPECT_EQ(w[0].missing, (std::vector<int>{1, 2}));
  EXPECT_EQ(w[0].since, t0);
  // The others enqueue it (through the exchange: the table holds it) and it runs.
  const auto done = ranks.cycle({{}, {x}, {x}});
  EXPECT_TRUE(done.exchanged);
  EXPECT_EQ(names(done.decision.ready), std::vector<std::string>{"x"});
}

TEST(EngineCache, RanksWhoseCachesDifferAreDetected) {
  // The rules make it impossible (every Table starts empty with the engine and sees the same
  // rounds); were it otherwise, the round's size and hash of the cache tell.
  Table a(2), b(2);
  std::vector<Message> both(2);
  both[0].described = both[1].described = {allreduce("x", 4)};
  a.apply(both, Clock::now());
  both[0].described = both[1].described = {allreduce("y", 4)};  // b cached y where a cached x
  b.apply(both, Clock::now());
  ASSERT_EQ(a.cache_size(), b.cache_size());
  ASSERT_NE(a.cache_hash(), b.cache_hash());
  Ledger la, lb;
  auto sums = la.contribution(a, false, false);
  const auto part = lb.contribution(b, false, false);
  for (std::size_t k = 0; k < sums.size(); ++k) sums[k] += part[k];
  EXPECT_THROW(a.tally(sums), Error);
  EXPECT_THROW(b.tally(sums), Error);
  // A rank that would come late, with an empty cache: its size disagrees.
  Table late(2);
  auto mixed = la.contribution(a, false, false);
  const auto empty = lb.contribution(late, false, false);
  for (std::size_t k = 0; k < empty.size(); ++k) mixed[k] += empty[k];
  EXPECT_THROW(a.tally(mixed), Error);
  EXPECT_THROW(late.tally(mixed), Error);
}

// The engine itself (ranks as threads): once its tensors are cached, every cycle is one
// allreduce of the same few bytes and the full exchange never runs, at p = 2 and p = 4.
TEST(EngineCache, TheEnginesSteadyStateIsOneSmallAllreducePerCycle) {
  for (int p : {2, 4}) {
    std::mutex mutex;
    std::vector<engine::EngineCore::Rounds> warm(static_cast<std::size_t>(p)), steady(warm);
    const auto failures = run_ranks(p, [&](Communicator& comm) {
      EngineOptions o;
      o.cycle_time = std::chrono::microseconds(500);
      engine::EngineCore core(comm, o);
      std::vector<std::vector<float>> x(3, std::vector<float>(100));
      auto step = [&](int s) {
        std::vector<Handle> hs;
        for (std::size_t t = 0; t < x.size(); ++t) {
          std::fill(x[t].begin(), x[t].end(), static_cast<float>(comm.rank() + s));
          hs.push_back(core.enqueue(allreduce("g" + std::to_string(t), 100), x[t].data(), x[t].data()));
        }
        for (auto& h : hs) h.wait();
        for (const auto& v : x) EXPECT_EQ(v[0], static_cast<float>(p * (p - 1) / 2 + p * s));
      };
      step(0);
      comm.barrier();
      const auto before = core.rounds();
      for (int s = 1; s <= 5; ++s) step(s);
      const auto after = core.rounds();  // before any rank's engine starts shutting down
      comm.barrier();
      std::lock_guard lock(mutex);
      warm[static_cast<std::size_t>(comm.rank())] = before;
      steady[static_cast<std::size_t>(comm.rank())] = after;
    });
    ASSERT_EQ(failures, "");
    for (int r = 0; r < p; ++r) {
      const auto& b = warm[static_cast<std::size_t>(r)];
      const auto& a = steady[static_cast<std::size_t>(r)];
      EXPECT_GE(b.exchanges, 1u);  // the first step described its tensors
      EXPECT_EQ(a.allreduces, a.cycles);
      EXPECT_GT(a.cycles, b.cycles);
      EXPECT_EQ(a.exchanges, b.exchanges) << "p " << p << " rank " << r;
      EXPECT_EQ(a.allgathers, b.allgathers);
      EXPECT_EQ(a.allreduce_bytes, (Tally::kHeader + 3) * sizeof(std::uint32_t));
    }
  }
}

// A tensor held on the cached path by one rank past the stall warning: the warning names the
// ranks that have not enqueued it, as for a tensor never cached, and it then completes.
TEST(EngineCache, AStalledCachedTensorIsReportedWithTheMissingRanks) {
  std::mutex mutex;
  std::vector<std::string> reports;
  const auto failures = run_ranks(3, [&](Communicator& comm) {
    EngineOptions o;
    o.stall_warning = std::chrono::milliseconds(150);
    o.on_stall = [&](const std::string& m) {
      std::lock_guard lock(mutex);
      reports.push_back(m);
    };
    engine::EngineCore core(comm, o);
    std::vector<float> x(2, 1.f);
    core.enqueue(allreduce("late", 2), x.data(), x.data()).wait();  // cached from now on
    comm.barrier();
    Handle h;
    if (comm.rank() == 0) {
      h = core.enqueue(allreduce("late", 2), x.data(), x.data());
      EXPECT_FALSE(h.wait_for(std::chrono::milliseconds(500)));
    }
    comm.barrier();
    if (comm.rank() != 0) h = core.enqueue(allreduce("late", 2), x.data(), x.data());
    h.wait();
    EXPECT_EQ(x, std::vector<float>(2, 9.f));
  });
  EXPECT_EQ(failures, "");
  ASSERT_FALSE(reports.empty());
  EXPECT_NE(reports[0].find("tensor 'late'"), std::string::npos) << reports[0];
  EXPECT_NE(reports[0].find("enqueued by rank 0, still missing on ranks 1, 2"), std::string::npos) << reports[0];
}

}  // namespace
}  // namespace tutti
