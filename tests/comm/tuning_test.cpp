// The algorithm tuner: the tuning file (parse, write, look up, load from the environment), the
// cost model, the order of precedence in choose_algorithm, and that every rank chooses alike.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <optional>
#include <random>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

#include "comm/access.hpp"
#include "comm/comm_impl.hpp"
#include "comm/tuning.hpp"
#include "core/env.hpp"
#include "harness.hpp"
#include "transport/shm/direct.hpp"

namespace tutti::comm::choice {
namespace {

constexpr std::size_t MiB = std::size_t{1} << 20;

// Every test starts from the empty table (the cost model's defaults) and fresh caches.
class Tuning : public ::testing::Test {
 protected:
  void SetUp() override { set_active(Table{}); }
  void TearDown() override { set_active(Table{}); }
};

Table sample_table() {
  Table t;
  t.cost_models["shm"] = {2.0e-6, 1.0e-10, 2.5e-10};
  t.cost_models["tcp"] = {4.0e-5, 5.0e-10, 0};
  t.entries.push_back({Collective::allreduce, "shm", 2, 0, 65536, Algorithm::direct});
  t.entries.push_back({Collective::allreduce, "shm", 2, 65537, 1 << 30, Algorithm::ring});
  t.entries.push_back({Collective::allgather, "tcp", 4, 8, 8, Algorithm::bruck});
  return t;
}

void expect_same(const Table& a, const Table& b) {
  ASSERT_EQ(a.entries.size(), b.entries.size());
  for (std::size_t i = 0; i < a.entries.size(); ++i) {
    const Entry &x = a.entries[i], &y = b.entries[i];
    EXPECT_EQ(std::tie(x.collective, x.transport, x.ranks, x.min_bytes, x.max_bytes, x.algorithm),
              std::tie(y.collective, y.transport, y.ranks, y.min_bytes, y.max_bytes, y.algorithm))
        << i;
  }
  ASSERT_EQ(a.cost_models.size(), b.cost_models.size());
  for (const auto& [name, c] : a.cost_models) {
    ASSERT_TRUE(b.cost_models.count(name)) << name;
    const CostParams& d = b.cost_models.at(name);
    EXPECT_EQ(std::tie(c.alpha, c.beta, c.gamma), std::tie(d.alpha, d.beta, d.gamma)) << name;
  }
}

TEST_F(Tuning, JsonRoundTrip) {
  const Table t = sample_table();
  const Table back = Table::parse(t.to_json(), "round-trip.json");
  expect_same(t, back);
  EXPECT_EQ(back.origin, "round-trip.json");
  EXPECT_EQ(Table::parse(back.to_json(), "again").to_json(), t.to_json());
  // The documented example parses as written.
  const Table doc = Table::parse(R"({"version": 1,
      "cost_model": {"shm": {"alpha_s": 2.0e-6, "beta_s_per_byte": 1.0e-10, "gamma_s_per_element": 2.5e-10}},
      "entries": [{"collective": "allreduce", "transport": "shm", "ranks": 2, "min_bytes": 0,
                   "max_bytes": 65536, "algorithm": "direct"}]})",
                                 "doc");
  ASSERT_EQ(doc.entries.size(), 1u);
  EXPECT_EQ(doc.entries[0].algorithm, Algorithm::direct);
  EXPECT_EQ(doc.cost_models.at("shm").gamma, 2.5e-10);
  EXPECT_TRUE(Table::parse(R"({"version": 1})", "bare").entries.empty());
}

TEST_F(Tuning, MalformedFilesNameTheOriginAndTheDefect) {
  const std::string entry_head = R"({"version": 1, "entries": [{"transport": "shm", "ranks": 2, )";
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"{\"version\": 1, ", "not valid JSON"},
      {"[1, 2]", "expected a JSON object"},
      {R"({"entries": []})", "missing field 'version'"},
      {R"({"version": 2})", "unsupported version"},
      {entry_head + R"("collective": "allsum", "min_bytes": 0, "max_bytes": 1, "algorithm": "ring"}]})",
       "unknown collective 'allsum'"},
      {entry_head + R"("collective": "allreduce", "min_bytes": 0, "max_bytes": 1, "algorithm": "fast"}]})",
       "unknown algorithm 'fast'"},
      {entry_head + R"("collective": "allreduce", "min_bytes": 9, "max_bytes": 8, "algorithm": "ring"}]})",
       "min_bytes is greater than max_bytes"},
      {entry_head + R"("collective": "allreduce", "min_bytes": 0, "algorithm": "ring"}]})",
       "entries[0]: missing field 'max_bytes'"},
      {entry_head + R"("collective": "allreduce", "min_bytes": -1, "max_bytes": 1, "algorithm": "ring"}]})",
       "'min_bytes' must be a non-negative integer"},
      {R"({"version": 1, "cost_model": {"shm": {"alpha_s": 1e-6, "beta_s_per_byte": 1e-10}}})",
       "cost_model.shm: missing field 'gamma_s_per_element'"},
  };
  for (const auto& [text, defect] : bad) {
    try {
      Table::parse(text, "/tmp/bad-tuning.json");
      ADD_FAILURE() << "accepted: " << text;
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::invalid_argument) << text;
      EXPECT_NE(std::string(e.what()).find("/tmp/bad-tuning.json"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(defect), std::string::npos) << e.what();
    }
  }
}

TEST_F(Tuning, LookupMatchesRangeTransportAndRanks) {
  const Table t = sample_table();
  EXPECT_EQ(t.lookup(Collective::allreduce, "shm", 2, 0), Algorithm::direct);
  EXPECT_EQ(t.lookup(Collective::allreduce, "shm", 2, 65536), Algorithm::direct);
  EXPECT_EQ(t.lookup(Collective::allreduce, "shm", 2, 65537), Algorithm::ring);
  EXPECT_EQ(t.lookup(Collective::allreduce, "shm", 2, std::size_t{1} << 30), Algorithm::ring);
  EXPECT_EQ(t.lookup(Collective::allreduce, "shm", 2, (std::size_t{1} << 30) + 1), std::nullopt);
  EXPECT_EQ(t.lookup(Collective::allreduce, "shm", 3, 8), std::nullopt);
  EXPECT_EQ(t.lookup(Collective::allreduce, "tcp", 2, 8), std::nullopt);
  EXPECT_EQ(t.lookup(Collective::reduce, "shm", 2, 8), std::nullopt);
  EXPECT_EQ(t.lookup(Collective::allgather, "tcp", 4, 8), Algorithm::bruck);
  EXPECT_EQ(t.lookup(Collective::allgather, "tcp", 4, 7), std::nullopt);
  EXPECT_EQ(Table{}.lookup(Collective::allreduce, "shm", 2, 8), std::nullopt);
}

TEST_F(Tuning, CostForPrefersTheTable) {
  using transport::Kind;
  EXPECT_EQ(cost_for("shm", Kind::shm).alpha, transport::default_cost(Kind::shm).alpha);
  set_active(sample_table());
  EXPECT_EQ(cost_for("shm", Kind::shm).alpha, 2.0e-6);
  EXPECT_EQ(cost_for("tcp", Kind::tcp).gamma, 0);
  EXPECT_EQ(cost_for("inproc", Kind::inproc).beta, transport::default_cost(Kind::inproc).beta);
  for (Kind kind : {Kind::inproc, Kind::shm, Kind::tcp, Kind::mpi, Kind::routed})
    EXPECT_GT(transport::default_cost(kind).alpha, 0) << static_cast<int>(kind);
  // The routed transport is priced by its slowest link.
  EXPECT_EQ(transport::default_cost(Kind::routed).alpha, transport::default_cost(Kind::tcp).alpha);
}

TEST_F(Tuning, PredictCoversDirectAndRejectsWhatDoesNotServe) {
  const CostParams shm = transport::default_cost(transport::Kind::shm);
  for (Collective c : {Collective::allreduce, Collective::reduce, Collective::reduce_scatter, Collective::allgather,
                       Collective::allgatherv, Collective::broadcast, Collective::alltoall, Collective::alltoallv,
                       Collective::gather, Collective::scatter, Collective::barrier})
    for (std::size_t bytes : {std::size_t{8}, 64 * MiB}) EXPECT_GT(predict(Algorithm::direct, c, 4, bytes, shm), 0);
  // Direct allreduce: one step up to 16 KiB, two barriers per 256 KiB chunk above; a barrier is
  // priced at a tenth of a message round.
  const CostParams alpha_only{1, 0, 0};
  EXPECT_DOUBLE_EQ(predict(Algorithm::direct, Collective::allreduce, 4, 16384, alpha_only), 0.1);
  EXPECT_DOUBLE_EQ(predict(Algorithm::direct, Collective::allreduce, 4, MiB, alpha_only), 0.8);
  // A copied byte at a fifth of a message byte, a streamed one (results of 32 MiB or more on all
  // ranks) at an eighth; in: the 3/4 of the input the peers reduce and the 1/4 slice published; out: the 3/4
  // the peers reduced.
  const CostParams beta_only{0, 1, 0};
  EXPECT_DOUBLE_EQ(predict(Algorithm::direct, Collective::allreduce, 4, MiB, beta_only), (0.2 + 0.2 * 0.75) * MiB);
  EXPECT_DOUBLE_EQ(predict(Algorithm::direct, Collective::allreduce, 4, 4 * MiB, beta_only),
                   (0.2 + 0.2 * 0.75) * 4 * MiB);
  EXPECT_DOUBLE_EQ(predict(Algorithm::direct, Collective::allreduce, 4, 8 * MiB, beta_only),
                   (0.2 + 0.125 * 0.75) * 8 * MiB);
  EXPECT_GT(predict(Algorithm::ring, Collective::allreduce, 4, 256 * MiB, shm),
            predict(Algorithm::ring, Collective::allreduce, 4, 16 * MiB, shm));
  EXPECT_THROW(predict(Algorithm::bruck, Collective::allreduce, 4, 8, shm), Error);
  EXPECT_THROW(predict(Algorithm::mpi, Collective::allreduce, 4, 8, shm), Error);
  EXPECT_THROW(predict(Algorithm::hierarchical, Collective::allreduce, 4, 8, shm), Error);
}

// The kind of the transport Transport::name() spells `name`.
transport::Kind kind_named(std::string_view name) {
  using transport::Kind;
  const std::pair<std::string_view, Kind> kinds[] = {
      {"inproc", Kind::inproc}, {"shm", Kind::shm}, {"tcp", Kind::tcp}, {"mpi", Kind::mpi}, {"shm+tcp", Kind::routed}};
  for (const auto& [spelled, kind] : kinds)
    if (spelled == name) return kind;
  ADD_FAILURE() << "no transport is named " << name;
  return Kind::tcp;
}

Algorithm choose(Collective c, const char* transport, int p, bool direct, std::size_t bytes,
                 Algorithm requested = Algorithm::automatic) {
  return choose_algorithm(c, requested, ChoiceContext{kind_named(transport), transport, p, direct}, bytes);
}

// The choices are those recorded before transports owned their kind and their costs
// (automatic_choices.inc), for every transport, collective, p and size there.
TEST_F(Tuning, AutomaticChoicesAreThoseRecordedBeforeTransportsOwnedTheirCosts) {
  struct Recorded {
    const char* transport;
    const char* collective;
    int ranks;
    std::size_t bytes;
    const char* algorithm;
  };
  const Recorded recorded[] = {
#include "automatic_choices.inc"
  };
  ASSERT_EQ(std::size(recorded), 5u * 11 * 4 * 4);
  for (const Recorded& r : recorded) {
    const auto collective = collective_from_name(r.collective);
    ASSERT_TRUE(collective) << r.collective;
    const bool direct = std::string_view(r.transport) == "shm" && transport::shm::serves(*collective);
    EXPECT_EQ(to_string(choose(*collective, r.transport, r.ranks, direct, r.bytes)), r.algorithm)
        << r.transport << " " << r.collective << " p=" << r.ranks << " " << r.bytes << " B";
  }
}

TEST_F(Tuning, CostModelPicksLatencyAlgorithmsSmallAndBandwidthAlgorithmsLarge) {
  for (bool direct : {false, true}) {
    const Algorithm small = choose(Collective::allreduce, "shm", 4, direct, 8);
    EXPECT_TRUE(small == Algorithm::recursive_doubling || small == Algorithm::direct) << to_string(small);
    const Algorithm large = choose(Collective::allreduce, "shm", 4, direct, 64 * MiB);
    EXPECT_TRUE(large == Algorithm::ring || large == Algorithm::rabenseifner || large == Algorithm::direct)
        << to_string(large);
    if (!direct) {
      EXPECT_NE(small, Algorithm::direct);
      EXPECT_NE(large, Algorithm::direct);
    }
  }
  EXPECT_EQ(choose(Collective::allgather, "tcp", 8, false, 64), Algorithm::recursive_doubling);
  EXPECT_EQ(choose(Collective::allgather, "tcp", 8, false, 64 * MiB), Algorithm::ring);
  EXPECT_EQ(choose(Collective::broadcast, "shm", 8, false, 8), Algorithm::binomial_tree);
  EXPECT_EQ(choose(Collective::reduce, "shm", 8, false, 8), Algorithm::binomial_tree);
  EXPECT_EQ(choose(Collective::barrier, "shm", 5, false, 0), Algorithm::bruck);
  EXPECT_EQ(choose(Collective::barrier, "shm", 5, true, 0), Algorithm::direct);
  // Without direct, a schedule: mpi and hierarchical are never automatic.
  for (Collective c : {Collective::reduce, Collective::alltoallv})
    for (std::size_t bytes : {std::size_t{8}, MiB, 64 * MiB}) {
      const Algorithm a = choose(c, "shm", 4, false, bytes);
      EXPECT_TRUE(schedule::applies(a, c)) << to_string(a);
    }
}

// Where two algorithms take about as long for one call, the one whose busiest port is markedly
// less busy wins: a 32 KiB reduce or broadcast on 4 ranks over a 1 Gbit/s link (as init's probe
// measures the emulated cluster's) takes the chain, whose root receives or sends the buffer once,
// though the tree is predicted a hair faster alone; with the default TCP costs (α ten times
// larger) the tree is clearly faster, and stays.
TEST_F(Tuning, NearTiesGoToTheAlgorithmAStreamOfCallsRunsFaster) {
  const CostParams link{5.5e-6, 7.65e-9, 2e-10};
  for (Collective c : {Collective::reduce, Collective::broadcast}) {
    const double tree = predict(Algorithm::binomial_tree, c, 4, 32768, link);
    const double chain = predict(Algorithm::ring, c, 4, 32768, link);
    EXPECT_LT(tree, chain) << to_string(c);
    EXPECT_LT(chain, tree * 1.05) << to_string(c);
    EXPECT_EQ(cheapest(transport::Kind::tcp, c, 4, 32768, false, link), Algorithm::ring) << to_string(c);
    const CostParams fallback = transport::default_cost(transport::Kind::tcp);
    EXPECT_GT(predict(Algorithm::ring, c, 4, 32768, fallback),
              1.05 * predict(Algorithm::binomial_tree, c, 4, 32768, fallback));
    EXPECT_EQ(cheapest(transport::Kind::tcp, c, 4, 32768, false, fallback), Algorithm::binomial_tree) << to_string(c);
  }
}

// A small broadcast or reduce over a transport whose messages carry signatures runs ahead
// (exec::Plan::run_ahead_weight): a stream of them costs the busiest port a call, where the
// chain's root sends or receives once and the tree's twice on 3 or 4 ranks. The chain wins there
// where a message's wire time is at least α and its single call is predicted at most twice the
// tree's: not for messages that cost about their α (8 and 512 B on a 1 Gbit/s link, anything up
// to 64 KiB at the TCP defaults), not on 8 ranks (seven hops against three rounds), not where the
// calls ring every time (inproc, or above run_ahead_bytes), not where ranks lie in blocks on
// hosts, and not for the collectives that do not run ahead.
TEST_F(Tuning, CallsThatRunAheadArePricedAsAStream) {
  const CostParams link{5.5e-6, 7.65e-9, 2e-10};  // 1 Gbit/s, as init's probe measures it
  const CostParams fallback = transport::default_cost(transport::Kind::tcp);
  const std::size_t small[] = {8, 512}, large[] = {4096, 16384, 65536};
  for (Collective c : {Collective::reduce, Collective::broadcast}) {
    for (int p : {3, 4}) {
      const auto what = [&](std::size_t bytes) {
        return std::string(to_string(c)) + " p=" + std::to_string(p) + " " + std::to_string(bytes) + " B";
      };
      for (std::size_t bytes : large)
        for (transport::Kind kind : {transport::Kind::tcp, transport::Kind::routed})
          EXPECT_EQ(cheapest(kind, c, p, bytes, false, link), Algorithm::ring) << what(bytes);
      for (std::size_t bytes : small)
        EXPECT_EQ(cheapest(transport::Kind::tcp, c, p, bytes, false, link),
                  cheapest(transport::Kind::inproc, c, p, bytes, false, link))
            << what(bytes);
      for (std::size_t bytes : {std::size_t{8}, std::size_t{4096}, std::size_t{65536}})
        EXPECT_EQ(cheapest(transport::Kind::tcp, c, p, bytes, false, fallback),
                  cheapest(transport::Kind::inproc, c, p, bytes, false, fallback))
            << what(bytes);
    }
    // Where the calls do not run ahead, or the chain's single call is too slow, the choice is the
    // tree that a single call prices fastest.
    EXPECT_EQ(cheapest(transport::Kind::inproc, c, 4, 16384, false, link), Algorithm::binomial_tree) << to_string(c);
    EXPECT_GT(predict(Algorithm::ring, c, 8, 16384, link), 2 * predict(Algorithm::binomial_tree, c, 8, 16384, link));
    EXPECT_EQ(cheapest(transport::Kind::tcp, c, 8, 16384, false, link), Algorithm::binomial_tree) << to_string(c);
    // Two hosts of two ranks: the tree's edge between the hosts carries the buffer once, as the
    // chain's does; no stream pricing.
    const HostBlocks hosts{2, transport::default_cost(transport::Kind::shm), transport::Kind::shm};
    EXPECT_EQ(cheapest(transport::Kind::routed, c, 4, 16384, false, link, hosts), Algorithm::binomial_tree)
        << to_string(c);
  }
  // Above run_ahead_bytes each call rings: a 256 KiB reduce on 4 ranks is priced as one call.
  EXPECT_EQ(cheapest(transport::Kind::tcp, Collective::reduce, 4, 262144, false, link),
            cheapest(transport::Kind::inproc, Collective::reduce, 4, 262144, false, link));
  // Allreduce does not run ahead: the same choice over TCP as within a process.
  for (std::size_t bytes : large)
    EXPECT_EQ(cheapest(transport::Kind::tcp, Collective::allreduce, 4, bytes, false, link),
              cheapest(transport::Kind::inproc, Collective::allreduce, 4, bytes, false, link));
}

// Ranks in blocks of 2 on hosts joined by a 1 Gbit/s link (as init's probe measures the emulated
// cluster's): a message within a host is priced at shared memory's β (and the larger α), the ranks
// of a host share its link, and hierarchical allreduce is its three steps, each the cheapest of
// its candidates, plus two link α a step. It wins a large allreduce, not a small one, and never
// where the ranks do not lie in blocks.
TEST_F(Tuning, RanksInBlocksOnHostsPriceTheLinksTheyShare) {
  const CostParams link{5.5e-6, 7.65e-9, 2e-10};
  const CostParams shm = transport::default_cost(transport::Kind::shm);
  const HostBlocks hosts{2, shm, transport::Kind::shm};
  const std::size_t n = 65536;
  // Recursive doubling sends the whole buffer across from both ranks of a host at once: the link
  // carries it twice, one after the other.
  EXPECT_GE(predict(Algorithm::recursive_doubling, Collective::allreduce, 4, n, link, hosts), 2 * link.beta * n);
  const auto best = [](Collective c, int p, std::size_t bytes, const CostParams& cost, bool direct) {
    double t = std::numeric_limits<double>::max();
    for (Algorithm a : candidates(transport::Kind::shm, c, direct)) t = std::min(t, predict(a, c, p, bytes, cost));
    return t;
  };
  const CostParams within{shm.alpha, shm.beta, link.gamma}, shared{link.alpha, 2 * link.beta, link.gamma};
  EXPECT_DOUBLE_EQ(predict(Algorithm::hierarchical, Collective::allreduce, 4, n, link, hosts),
                   best(Collective::reduce_scatter, 2, n, within, true) +
                       best(Collective::allreduce, 2, n / 2, shared, false) +
                       best(Collective::allgather, 2, n, within, true) + 6 * link.alpha);
  EXPECT_THROW(predict(Algorithm::hierarchical, Collective::allreduce, 4, n, link), Error);  // no hosts
  // Rabenseifner's halving, nearest ranks first, also lets the links carry the buffer only once each
  // way: it is priced close to hierarchical (which pays its steps' calls) up to 64 KiB; by 1 MiB
  // hierarchical's fewer rounds across win.
  const std::size_t large = std::size_t{1} << 20;
  EXPECT_LT(predict(Algorithm::rabenseifner, Collective::allreduce, 4, n, link, hosts),
            predict(Algorithm::hierarchical, Collective::allreduce, 4, n, link, hosts) * 1.1);
  EXPECT_EQ(cheapest(transport::Kind::routed, Collective::allreduce, 4, large, false, link, hosts),
            Algorithm::hierarchical);
  EXPECT_NE(cheapest(transport::Kind::routed, Collective::allreduce, 4, 64, false, link, hosts),
            Algorithm::hierarchical);
  EXPECT_NE(cheapest(transport::Kind::routed, Collective::allreduce, 4, n, false, link), Algorithm::hierarchical);
  // A barrier: dissemination's two rounds both cross between the hosts, recursive doubling's first
  // stays within them; priced alike where every message costs the link's α.
  EXPECT_EQ(cheapest(transport::Kind::routed, Collective::barrier, 4, 0, false, link, hosts),
            Algorithm::recursive_doubling);
  EXPECT_EQ(cheapest(transport::Kind::routed, Collective::barrier, 8, 0, false, link, hosts),
            Algorithm::recursive_doubling);
  EXPECT_EQ(cheapest(transport::Kind::tcp, Collective::barrier, 4, 0, false, link), Algorithm::bruck);
  EXPECT_EQ(cheapest(transport::Kind::routed, Collective::barrier, 6, 0, false, link, hosts), Algorithm::bruck);
  // A small gather or scatter runs ahead: the binomial tree's root takes one message from the other
  // host a call, linear's two; where the ranks do not lie in blocks, or the call is too large to run
  // ahead, the plain choice stays.
  for (Collective c : {Collective::gather, Collective::scatter}) {
    for (std::size_t total : {std::size_t{64}, std::size_t{4096}, std::size_t{65536}}) {
      EXPECT_EQ(cheapest(transport::Kind::routed, c, 4, total, false, link, hosts), Algorithm::binomial_tree)
          << to_string(c) << " " << total;
      EXPECT_EQ(cheapest(transport::Kind::routed, c, 4, total, false, link), Algorithm::linear) << to_string(c);
    }
    const HostBlocks fours{4, transport::default_cost(transport::Kind::shm), transport::Kind::shm};
    EXPECT_EQ(cheapest(transport::Kind::routed, c, 8, 64 * 8, false, link, fours), Algorithm::binomial_tree)
        << to_string(c);
    EXPECT_EQ(cheapest(transport::Kind::routed, c, 4, std::size_t{1} << 20, false, link, hosts),
              cheapest(transport::Kind::routed, c, 4, std::size_t{1} << 20, false, link))
        << to_string(c);
  }
  // Otherwise the flat choice is the plain model's, unless the hosts' links price another at least
  // 1.3 times as fast: Rabenseifner's reduce_scatter (nearest ranks first: the links carry the
  // other host's blocks once) against ring's three blocks a link, from 1 MiB, where the plain
  // model takes ring for its pipelined reductions; and its mirror, the recursive-doubling allgather
  // (farthest first), from 64 KiB. Bruck's alltoall, which the links price up to 1.23 times as fast
  // as pairwise at 4-64 KiB, does not displace it.
  for (std::size_t bytes : {std::size_t{64}, std::size_t{4096}, n, large})
    for (Collective c :
         {Collective::allgather, Collective::reduce_scatter, Collective::alltoall, Collective::broadcast}) {
      // (The plain model's choice for a single call: where ranks lie in blocks, small rooted calls
      // are not priced as a stream, as they are without blocks over shm+tcp.)
      const Algorithm plain = cheapest(transport::Kind::inproc, c, 4, bytes, false, link);
      const Algorithm priced = cheapest(transport::Kind::routed, c, 4, bytes, false, link, hosts);
      const bool displaced =
          (c == Collective::reduce_scatter && bytes == large) || (c == Collective::allgather && bytes >= n);
      if (displaced) {
        EXPECT_EQ(plain, Algorithm::ring) << to_string(c) << " " << bytes;
        EXPECT_EQ(priced, c == Collective::allgather ? Algorithm::recursive_doubling : Algorithm::rabenseifner);
        EXPECT_GT(predict(plain, c, 4, bytes, link, hosts), 1.3 * predict(priced, c, 4, bytes, link, hosts));
      } else {
        EXPECT_EQ(priced, plain) << to_string(c) << " " << bytes;
      }
    }
  EXPECT_EQ(cheapest(transport::Kind::routed, Collective::alltoall, 4, 16384, false, link, hosts), Algorithm::pairwise);
  EXPECT_LT(predict(Algorithm::bruck, Collective::alltoall, 4, 16384, link, hosts),
            predict(Algorithm::pairwise, Collective::alltoall, 4, 16384, link, hosts));
  EXPECT_EQ(cheapest(transport::Kind::routed, Collective::allreduce, 4, 64, false, link, hosts),
            cheapest(transport::Kind::routed, Collective::allreduce, 4, 64, false, link));
  // Through the choice: the context's blocks reach the model (cached apart from a context without
  // them); a step of hierarchical, on its own communicator, never resolves to it.
  const CostParams* measured = intern_cost(link);
  const ChoiceContext blocked{transport::Kind::routed, "shm+tcp", 4, false, measured, 2};
  const ChoiceContext flat{transport::Kind::routed, "shm+tcp", 4, false, measured, 0};
  EXPECT_EQ(choose_algorithm(Collective::allreduce, Algorithm::automatic, blocked, large), Algorithm::hierarchical);
  EXPECT_NE(choose_algorithm(Collective::allreduce, Algorithm::automatic, flat, large), Algorithm::hierarchical);
  EXPECT_NE(step_algorithm(Collective::allreduce, blocked, large), Algorithm::hierarchical);
}

TEST_F(Tuning, PrecedenceRequestedThenTableThenCostModel) {
  Table t;
  t.entries.push_back({Collective::allreduce, "shm", 4, 0, 100, Algorithm::binomial_tree});
  t.entries.push_back({Collective::allreduce, "shm", 4, 0, 200, Algorithm::ring});  // overlaps: first wins
  t.entries.push_back({Collective::allreduce, "shm", 4, 1000, 2000, Algorithm::direct});
  t.entries.push_back({Collective::allreduce, "shm", 4, 3000, 4000, Algorithm::bruck});  // does not serve
  t.entries.push_back({Collective::allreduce, "shm", 4, 5000, 6000, Algorithm::hierarchical});
  const Algorithm model_1500 = choose(Collective::allreduce, "shm", 4, false, 1500);
  const Algorithm model_3500 = choose(Collective::allreduce, "shm", 4, false, 3500);
  const Algorithm model_5500 = choose(Collective::allreduce, "shm", 4, false, 5500);
  set_active(t);
  EXPECT_EQ(choose(Collective::allreduce, "shm", 4, false, 8), Algorithm::binomial_tree);
  EXPECT_EQ(choose(Collective::allreduce, "shm", 4, false, 150), Algorithm::ring);
  // The table beats the cost model; the call's own algorithm beats the table (as TUTTI_ALGO does).
  EXPECT_EQ(choose(Collective::allreduce, "shm", 4, false, 8, Algorithm::rabenseifner), Algorithm::rabenseifner);
  EXPECT_EQ(choose(Collective::allreduce, "shm", 4, true, 1500), Algorithm::direct);
  EXPECT_EQ(choose(Collective::allreduce, "shm", 4, false, 1500), model_1500);  // direct unavailable: ignored
  EXPECT_EQ(choose(Collective::allreduce, "shm", 4, false, 3500), model_3500);
  EXPECT_EQ(choose(Collective::allreduce, "shm", 4, false, 5500), model_5500);
  EXPECT_EQ(choose(Collective::allreduce, "shm", 5, false, 8), choose(Collective::allreduce, "shm", 5, false, 9));
  EXPECT_NE(choose(Collective::allreduce, "tcp", 4, false, 8), Algorithm::binomial_tree);
  EXPECT_THROW(choose(Collective::allreduce, "shm", 4, false, 8, Algorithm::direct), Error);
  EXPECT_THROW(choose(Collective::alltoallv, "shm", 4, false, 8, Algorithm::direct), Error);
  EXPECT_EQ(choose(Collective::allreduce, "shm", 4, true, 8, Algorithm::direct), Algorithm::direct);
}

// Every rank must choose alike whatever sizes it saw before: two fresh caches, queried in
// opposite and shuffled orders, must agree on every call, and every size of a class alike.
TEST_F(Tuning, ChoicesDoNotDependOnCallHistory) {
  std::vector<std::tuple<Collective, int, bool, std::size_t>> calls;
  for (int c = 0; c <= static_cast<int>(Collective::barrier); ++c)
    for (int p = 1; p <= 8; ++p)
      for (bool direct : {false, true})
        for (int k = 0; k <= 26; k += 2) {
          const std::size_t low = k == 0 ? 0 : std::size_t{1} << (k - 1);
          for (std::size_t bytes : {low, low + low / 3, 2 * low == 0 ? 0 : 2 * low - 1})
            calls.emplace_back(static_cast<Collective>(c), p, direct, bytes);
        }
  const auto run = [&](const std::vector<std::size_t>& order) {
    reset_for_testing();
    std::vector<Algorithm> out(calls.size());
    for (std::size_t i : order) {
      const auto& [c, p, direct, bytes] = calls[i];
      out[i] = choose(c, "shm", p, direct, bytes);
    }
    return out;
  };
  std::vector<std::size_t> order(calls.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  const std::vector<Algorithm> forward = run(order);
  std::reverse(order.begin(), order.end());
  EXPECT_EQ(run(order), forward);
  std::shuffle(order.begin(), order.end(), std::mt19937(12345));
  EXPECT_EQ(run(order), forward);
  for (std::size_t i = 0; i + 1 < calls.size(); ++i) {
    const auto& [c, p, direct, bytes] = calls[i];
    const auto& [c2, p2, direct2, bytes2] = calls[i + 1];
    if (c == c2 && p == p2 && direct == direct2 && size_class(bytes) == size_class(bytes2)) {
      EXPECT_EQ(forward[i], forward[i + 1]) << to_string(c) << " p=" << p << " " << bytes;
    }
  }
}

class TuningFile : public Tuning {
 protected:
  void TearDown() override {
    unsetenv("TUTTI_TUNING_FILE");
    std::filesystem::remove(path_);
    Tuning::TearDown();
  }
  std::string path_ =
      (std::filesystem::temp_directory_path() / ("tutti-tuning-" + std::to_string(getpid()) + ".json")).string();
};

TEST_F(TuningFile, LoadsTheFileTheEnvironmentNames) {
  std::ofstream(path_) << sample_table().to_json();
  setenv("TUTTI_TUNING_FILE", path_.c_str(), 1);
  reset_for_testing(true);
  load_from_environment();
  EXPECT_EQ(active().origin, path_);
  expect_same(active(), sample_table());
  EXPECT_EQ(choose(Collective::allreduce, "shm", 2, true, 100), Algorithm::direct);
  EXPECT_EQ(choose(Collective::allreduce, "shm", 2, true, 1 << 20), Algorithm::ring);
  // Loaded once: a later change of the variable is not read again.
  setenv("TUTTI_TUNING_FILE", "/nonexistent/tuning.json", 1);
  EXPECT_NO_THROW(load_from_environment());
  EXPECT_EQ(active().origin, path_);
}

TEST_F(TuningFile, AMissingOrMalformedNamedFileIsAnError) {
  for (const std::string& content : {std::string(), std::string("{\"version\": 1, \"entries\": 3}")}) {
    std::filesystem::remove(path_);
    if (!content.empty()) std::ofstream(path_) << content;
    setenv("TUTTI_TUNING_FILE", path_.c_str(), 1);
    reset_for_testing(true);
    try {
      load_from_environment();
      ADD_FAILURE() << "loaded " << path_;
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::invalid_argument);
      EXPECT_NE(std::string(e.what()).find(path_), std::string::npos) << e.what();
    }
  }
}

TEST_F(TuningFile, DefaultPathFollowsXdgThenHome) {
  const auto saved_xdg = core::env("XDG_CACHE_HOME"), saved_home = core::env("HOME");
  setenv("XDG_CACHE_HOME", "/x/cache", 1);
  EXPECT_EQ(default_path(), "/x/cache/tutti/tuning.json");
  unsetenv("XDG_CACHE_HOME");
  setenv("HOME", "/home/u", 1);
  EXPECT_EQ(default_path(), "/home/u/.cache/tutti/tuning.json");
  // A missing default file is no table, and no error.
  reset_for_testing(true);
  EXPECT_NO_THROW(load_from_environment());
  EXPECT_TRUE(active().entries.empty());
  if (saved_xdg) setenv("XDG_CACHE_HOME", saved_xdg->c_str(), 1);
  if (saved_home) setenv("HOME", saved_home->c_str(), 1);
}

// End to end: collectives with `automatic` run what the table says and stay exact.
TEST_F(Tuning, TableChoicesRunExactlyThroughCollectives) {
  for (int p : {2, 3, 5}) {
    Table t;
    t.entries.push_back({Collective::allreduce, "inproc", p, 0, 4096, Algorithm::ring});
    t.entries.push_back({Collective::allreduce, "inproc", p, 4097, 1 << 30, Algorithm::binomial_tree});
    t.entries.push_back({Collective::allreduce, "inproc", p, 0, 1 << 30, Algorithm::direct});  // ignored
    t.entries.push_back({Collective::allgather, "inproc", p, 0, 1 << 30, Algorithm::bruck});
    set_active(t);
    for (std::size_t count : {std::size_t{1}, std::size_t{7}, std::size_t{1000}, std::size_t{40009}}) {
      const std::size_t bytes = count * 4;
      EXPECT_EQ(choose(Collective::allreduce, "inproc", p, false, bytes),
                bytes <= 4096 ? Algorithm::ring : Algorithm::binomial_tree);
      EXPECT_EQ(choose(Collective::allgather, "inproc", p, false, bytes * static_cast<std::size_t>(p)),
                Algorithm::bruck);
      const std::string failures = tutti::testing::run_ranks(p, [&](Communicator& comm) {
        std::vector<std::int32_t> send(count), recv(count, -7), gathered(count * static_cast<std::size_t>(p), -7);
        for (std::size_t i = 0; i < count; ++i) send[i] = static_cast<std::int32_t>(i % 1000) + comm.rank();
        comm.allreduce(send.data(), recv.data(), count, DataType::i32, ReduceOp::sum);
        comm.allgather(send.data(), gathered.data(), count, DataType::i32);
        for (std::size_t i = 0; i < count; ++i) {
          const auto base = static_cast<std::int32_t>(i % 1000);
          if (recv[i] != p * base + p * (p - 1) / 2)
            throw std::runtime_error("allreduce wrong at " + std::to_string(i));
          for (int r = 0; r < p; ++r)
            if (gathered[static_cast<std::size_t>(r) * count + i] != base + r)
              throw std::runtime_error("allgather wrong at " + std::to_string(i));
        }
      });
      EXPECT_EQ(failures, "") << "p=" << p << " count=" << count;
    }
  }
}

// The public face (<tutti/tuning.hpp>): a table written where folders are missing reads back the
// same; a missing file and an unwritable path are errors naming them; tuning::use makes a table
// what automatic chooses from, as Communicator::chosen_algorithm reports and active() returns.
TEST_F(Tuning, PublicTableReadsWritesAndIsUsed) {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("tutti_tuning_public_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  const std::string path = (dir / "a" / "b" / "tuning.json").string();
  const tuning::Table written = sample_table();
  written.write(path);
  const tuning::Table back = tuning::Table::read(path);
  EXPECT_EQ(back.origin, path);
  expect_same(written, back);
  EXPECT_EQ(back.to_json(), written.to_json());
  const std::string missing = (dir / "missing.json").string();
  try {
    (void)tuning::Table::read(missing);
    ADD_FAILURE() << "read a missing file";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::invalid_argument);
    EXPECT_NE(std::string(e.what()).find(missing), std::string::npos) << e.what();
  }
  try {
    written.write(dir.string());  // a directory
    ADD_FAILURE() << "wrote over a directory";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::system);
    EXPECT_NE(std::string(e.what()).find(dir.string()), std::string::npos) << e.what();
  }
  std::filesystem::remove_all(dir);

  auto comms = local_group(2);
  constexpr std::size_t bytes = 4096;
  const Algorithm before = comms[0].chosen_algorithm(Collective::allgather, bytes);
  Algorithm forced = Algorithm::automatic;
  for (Algorithm a : comms[0].algorithms(Collective::allgather))
    if (a != Algorithm::automatic && a != before) forced = a;
  ASSERT_NE(forced, Algorithm::automatic);
  tuning::Table table;
  table.entries.push_back({Collective::allgather, "inproc", 2, 0, 1 << 20, forced});
  tuning::use(table);
  EXPECT_EQ(tuning::active().entries.size(), 1u);
  EXPECT_EQ(comms[0].chosen_algorithm(Collective::allgather, bytes), forced);
  EXPECT_EQ(comms[1].chosen_algorithm(Collective::allgather, bytes), forced);
  tuning::use(tuning::Table{});
  EXPECT_EQ(comms[0].chosen_algorithm(Collective::allgather, bytes), before);
}

// tuning::measure: α, β and γ, positive where they are measured, the same on every rank.
TEST_F(Tuning, MeasureGivesEveryRankTheSameModel) {
  for (int p : {1, 2, 3}) {
    std::vector<tuning::CostModel> models(static_cast<std::size_t>(p));
    const std::string failures = tutti::testing::run_ranks(
        p, [&](Communicator& comm) { models[static_cast<std::size_t>(comm.rank())] = tuning::measure(comm); });
    ASSERT_EQ(failures, "") << "p=" << p;
    EXPECT_GT(models[0].gamma, 0) << "p=" << p;
    if (p == 1) {
      EXPECT_EQ(models[0].alpha, 0);
      EXPECT_EQ(models[0].beta, 0);
    } else {
      EXPECT_GT(models[0].alpha, 0) << "p=" << p;
      EXPECT_GE(models[0].beta, 0) << "p=" << p;
    }
    for (const tuning::CostModel& m : models)
      EXPECT_EQ(std::tie(m.alpha, m.beta, m.gamma), std::tie(models[0].alpha, models[0].beta, models[0].gamma));
  }
}

// probe_link (init's link probe where ranks span hosts): rank 0's α and β on every rank, with the
// transport's γ; the table stays as it was (the communicator keeps the costs); one rank measures
// nothing.
TEST_F(Tuning, LinkProbeGivesEveryRankRankZerosCosts) {
  const Table before = sample_table();
  for (int p : {1, 2, 3}) {
    set_active(before);
    std::vector<std::optional<CostParams>> got(static_cast<std::size_t>(p));
    const std::string failures = tutti::testing::run_ranks(p, [&](Communicator& comm) {
      got[static_cast<std::size_t>(comm.rank())] = probe_link(comm, "probed", transport::Kind::inproc);
    });
    ASSERT_EQ(failures, "") << "p=" << p;
    expect_same(active(), before);
    if (p == 1) {
      EXPECT_FALSE(got[0].has_value());
      continue;
    }
    ASSERT_TRUE(got[0].has_value()) << "p=" << p;
    EXPECT_GT(got[0]->alpha, 0) << "p=" << p;
    EXPECT_GT(got[0]->beta, 0) << "p=" << p;
    EXPECT_EQ(got[0]->gamma, transport::default_cost(transport::Kind::inproc).gamma);
    for (const auto& g : got) {
      ASSERT_TRUE(g.has_value());
      EXPECT_EQ(std::tie(g->alpha, g->beta, g->gamma), std::tie(got[0]->alpha, got[0]->beta, got[0]->gamma));
    }
  }
}

// A communicator's measured link prices its automatic choices, and its splits inherit it; choices
// without one (another communicator of the process) keep the transport's costs. Interned costs:
// equal values, one pointer.
TEST_F(Tuning, AMeasuredLinkPricesItsCommunicatorsChoicesOnly) {
  const CostParams slow_link{5.5e-6, 7.65e-9, 2e-10};
  const CostParams* link = intern_cost(slow_link);
  EXPECT_EQ(intern_cost(CostParams{5.5e-6, 7.65e-9, 2e-10}), link);
  EXPECT_NE(intern_cost(CostParams{5.5e-6, 7.65e-9, 3e-10}), link);
  const Choice measured =
      automatic_choice(Collective::reduce, transport::Kind::inproc, "inproc", 4, false, 32768, link);
  EXPECT_EQ(std::tie(measured.cost.alpha, measured.cost.beta), std::tie(slow_link.alpha, slow_link.beta));
  EXPECT_EQ(measured.algorithm, Algorithm::ring);
  const Choice plain = automatic_choice(Collective::reduce, transport::Kind::inproc, "inproc", 4, false, 32768);
  EXPECT_EQ(plain.cost.alpha, transport::default_cost(transport::Kind::inproc).alpha);
  EXPECT_EQ(plain.algorithm, Algorithm::binomial_tree);

  auto comms = local_group(4);
  auto others = local_group(4);
  for (Communicator& c : comms) Access::impl(c)->set_link_cost(link);
  for (int r = 0; r < 4; ++r) {
    EXPECT_EQ(comms[static_cast<std::size_t>(r)].chosen_algorithm(Collective::reduce, 32768), Algorithm::ring);
    EXPECT_EQ(others[static_cast<std::size_t>(r)].chosen_algorithm(Collective::reduce, 32768),
              Algorithm::binomial_tree);
  }
  // A table's cost_model for the transport still wins (tutti-bench --tune compares with its own).
  Table table;
  table.cost_models["inproc"] = transport::default_cost(transport::Kind::inproc);
  set_active(table);
  EXPECT_EQ(comms[0].chosen_algorithm(Collective::reduce, 32768), Algorithm::binomial_tree);
  EXPECT_EQ(cost_for("inproc", transport::Kind::inproc, link).alpha, table.cost_models["inproc"].alpha);
  set_active(Table{});
  EXPECT_EQ(cost_for("inproc", transport::Kind::inproc, link).alpha, slow_link.alpha);
  // Splits inherit the link (split is collective: every rank at once).
  std::vector<Communicator> halves(4);
  const std::string failures = tutti::testing::on_threads(
      4, [&](int r) { halves[static_cast<std::size_t>(r)] = comms[static_cast<std::size_t>(r)].split(r % 2, r); });
  ASSERT_EQ(failures, "");
  for (const Communicator& half : halves) EXPECT_EQ(Access::impl(half)->link_cost(), link);
}

}  // namespace
}  // namespace tutti::comm::choice
