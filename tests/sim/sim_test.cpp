// The training-step simulator: profiles and networks read and written, the estimate across
// hosts, the lockstep approximation against the exact critical path, the engine's fusion plan,
// and whole simulated steps whose time can be written down by hand.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "engine/negotiation.hpp"
#include "schedule/algorithms.hpp"
#include "sim/collective_time.hpp"
#include "tutti/sim.hpp"

namespace tutti::sim {
namespace {

ModelProfile two_gradients() {
  ModelProfile p;
  p.model = "two";
  p.batch_size = 8;
  p.forward_seconds = 0.010;
  p.optimizer_seconds = 0.002;
  p.gradients = {{"b.weight", 1000, DataType::f32, 0.004}, {"a.weight", 250000, DataType::f32, 0.006}};
  return p;
}

std::string error_of(const std::string& text) {
  std::istringstream in(text);
  try {
    read_profile(in, "p");
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::invalid_argument);
    return e.what();
  }
  return "";
}

TEST(SimProfile, RoundTrip) {
  ModelProfile p = two_gradients();
  p.notes = {"measured here", "scaled by 2"};
  p.backward_tail_seconds = 0.0005;
  p.jitter = 0.07;
  std::stringstream text;
  write_profile(text, p);
  const ModelProfile q = read_profile(text);
  EXPECT_EQ(q.model, "two");
  EXPECT_EQ(q.batch_size, 8);
  EXPECT_EQ(q.forward_seconds, 0.010);
  EXPECT_EQ(q.optimizer_seconds, 0.002);
  EXPECT_EQ(q.notes, p.notes);
  ASSERT_EQ(q.gradients.size(), 2u);
  EXPECT_EQ(q.gradients[1].name, "a.weight");
  EXPECT_EQ(q.gradients[1].count, 250000u);
  EXPECT_EQ(q.gradients[1].backward_seconds, 0.006);
  EXPECT_EQ(q.gradient_bytes(), 251000u * 4);
  EXPECT_EQ(q.backward_tail_seconds, 0.0005);
  EXPECT_EQ(q.jitter, 0.07);
  EXPECT_DOUBLE_EQ(q.compute_seconds(), 0.0225);
}

TEST(SimProfile, MalformedInputIsNamedByLine) {
  const std::string head = "tutti-profile 1\nbatch 4\n";
  EXPECT_NE(error_of("model x\n").find("p:1: expected the header"), std::string::npos);
  EXPECT_NE(error_of(head + "grad w 10 f33 0.1\n").find("p:3: unknown type \"f33\""), std::string::npos);
  EXPECT_NE(error_of(head + "grad w 10 f32 -1\n").find("p:3:"), std::string::npos);
  EXPECT_NE(error_of(head + "grad w 0 f32 1\n").find("p:3: grad needs"), std::string::npos);
  EXPECT_NE(error_of(head + "grad w 1 f32 1\ngrad w 2 f32 1\n").find("p:4: gradient \"w\" appears twice"),
            std::string::npos);
  EXPECT_NE(error_of(head + "speed 3\n").find("p:3: unknown field \"speed\""), std::string::npos);
  EXPECT_NE(error_of(head + "forward 1 2\n").find("p:3: unexpected \"2\""), std::string::npos);
  EXPECT_NE(error_of(head).find("no gradients"), std::string::npos);
  EXPECT_NE(error_of("tutti-profile 1\ngrad w 1 f32 1\n").find("no \"batch\""), std::string::npos);
  EXPECT_EQ(error_of(head + "# comment\n\ngrad w 1 f32 1 # trailing\n"), "");
}

TEST(SimNetwork, ReadsKeysAndRejectsUnknownOnes) {
  std::istringstream in("# aries\nalpha 1.5e-6\nbeta 1e-10 # 10 GB/s\nintra_beta 5e-11\n");
  const Network n = read_network(in);
  EXPECT_EQ(n.alpha, 1.5e-6);
  EXPECT_EQ(n.beta, 1e-10);
  EXPECT_EQ(n.intra_beta, 5e-11);
  EXPECT_EQ(n.intra_alpha, Network{}.intra_alpha);
  std::istringstream bad("alpha 1\nlatency 2\n");
  try {
    read_network(bad, "n");
    FAIL() << "an unknown key was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("n:2: unknown key \"latency\""), std::string::npos);
  }
  std::istringstream negative("beta -1\n");
  EXPECT_THROW(read_network(negative), Error);
}

// One message of n elements from rank 0 to rank `to`.
std::vector<schedule::Schedule> one_message(int ranks, int to, std::size_t n) {
  std::vector<schedule::Schedule> s(static_cast<std::size_t>(ranks));
  s[0].send(to, {schedule::Buffer::input, 0, n});
  s[static_cast<std::size_t>(to)].recv(0, {schedule::Buffer::output, 0, n});
  return s;
}

TEST(SimEstimate, MessagesAcrossHostsUseTheirOwnPrices) {
  const double a = 1e-6, b = 1e-9, ax = 5e-5, bx = 1e-8;
  const auto inside = one_message(4, 1, 1000);
  const auto across = one_message(4, 2, 1000);
  const schedule::Hosts hosts{2, ax, bx};
  EXPECT_DOUBLE_EQ(schedule::estimate(inside, 4, a, b, 0, hosts).time, a + b * 4000);
  EXPECT_DOUBLE_EQ(schedule::estimate(across, 4, a, b, 0, hosts).time, ax + bx * 4000);
  EXPECT_DOUBLE_EQ(schedule::estimate(across, 4, a, b, 0).time, a + b * 4000);  // one host
}

TEST(SimEstimate, RanksOfAHostShareItsLink) {
  // Ranks 0 and 1 (host 0) send at once to ranks 2 and 3 (host 1): the second message waits for
  // the link, so the last arrives after two wire times and one latency.
  std::vector<schedule::Schedule> s(4);
  s[0].send(2, {schedule::Buffer::input, 0, 1000});
  s[1].send(3, {schedule::Buffer::input, 0, 1000});
  s[2].recv(0, {schedule::Buffer::output, 0, 1000});
  s[3].recv(1, {schedule::Buffer::output, 0, 1000});
  const double ax = 5e-5, bx = 1e-8;
  EXPECT_DOUBLE_EQ(schedule::estimate(s, 4, 0, 0, 0, schedule::Hosts{2, ax, bx}).time, ax + 2 * bx * 4000);
  // On four hosts the links are separate.
  EXPECT_DOUBLE_EQ(schedule::estimate(s, 4, 0, 0, 0, schedule::Hosts{1, ax, bx}).time, ax + bx * 4000);
}

// The lockstep approximation against the exact critical path where both can run: within 10%
// (latency-bound rings and Rabenseifner's crossing rounds differ most, by 6-8%).
TEST(SimCollectiveTime, LockstepAgreesWithTheExactPathOnSymmetricAlgorithms) {
  const Levels levels{4, 20e-6, 8e-9, 3e-6, 3e-10, 2e-10};
  const std::pair<Collective, Algorithm> cases[] = {{Collective::allreduce, Algorithm::ring},
                                                    {Collective::allreduce, Algorithm::recursive_doubling},
                                                    {Collective::allreduce, Algorithm::rabenseifner},
                                                    {Collective::reduce_scatter, Algorithm::ring},
                                                    {Collective::reduce_scatter, Algorithm::rabenseifner},
                                                    {Collective::allgather, Algorithm::ring},
                                                    {Collective::allgather, Algorithm::recursive_doubling}};
  for (const auto& [c, a] : cases)
    for (int p : {8, 16, 32})
      for (std::size_t count : {std::size_t{4096}, std::size_t{1} << 20}) {
        const double exact = schedule_seconds(a, c, p, count, 4, levels, false);
        const double lockstep = schedule_seconds(a, c, p, count, 4, levels, true);
        EXPECT_NEAR(lockstep, exact, 0.10 * exact)
            << to_string(c) << " " << to_string(a) << " p=" << p << " count=" << count;
      }
}

TEST(SimCollectiveTime, TreesAreAlwaysSimulatedExactly) {
  const Levels levels{2, 20e-6, 8e-9, 3e-6, 3e-10, 2e-10};
  const double exact = schedule_seconds(Algorithm::binomial_tree, Collective::allreduce, 8, 1000, 4, levels, false);
  EXPECT_EQ(schedule_seconds(Algorithm::binomial_tree, Collective::allreduce, 8, 1000, 4, levels, true), exact);
}

// As the library's cost model decides where ranks lie in blocks on hosts: hierarchical where its
// three steps (plus two link α each) take less than the fastest flat schedule. On 2 hosts of 4 a
// 16 MiB call takes it; on 4 hosts of 2 a 4 MiB call stays on a ring, which carries as much over
// each link and has no steps inside the hosts to pay for; a small call stays flat.
TEST(SimCollectiveTime, HierarchicalWhereTheLibraryChoosesIt) {
  Network n;
  CollectiveTimes four_a_host(n, 8, 4);
  EXPECT_EQ(four_a_host.allreduce(1 << 22, DataType::f32).how.rfind("hierarchical (", 0), 0u);
  CollectiveTimes spanning(n, 8, 2);
  EXPECT_EQ(spanning.allreduce(1 << 20, DataType::f32).how, "ring");
  EXPECT_EQ(spanning.allreduce(16, DataType::f32).how.find("hierarchical"), std::string::npos);  // small: flat
  CollectiveTimes one_host(n, 4, 4);
  EXPECT_EQ(one_host.allreduce(1 << 20, DataType::f32).how.find("hierarchical"), std::string::npos);
  CollectiveTimes alone(n, 1, 1);
  EXPECT_EQ(alone.allreduce(1 << 20, DataType::f32).seconds, 0);
}

engine::Descriptor allreduce_of(const std::string& name, std::size_t count, DataType type = DataType::f32) {
  engine::Descriptor d;
  d.name = name;
  d.count = count;
  d.type = type;
  return d;
}

TEST(SimFusionPlan, BucketsByThresholdFirstBucketAndType) {
  using engine::plan_fusion;
  const std::vector<engine::Descriptor> ready = {allreduce_of("a", 100), allreduce_of("b", 100),
                                                 allreduce_of("c", 100, DataType::f64), allreduce_of("d", 300),
                                                 allreduce_of("e", 50)};
  using Jobs = std::vector<std::vector<std::size_t>>;
  // 1000 bytes per bucket: a+b (800), c alone (f64), d starts a new f32 bucket (800 + 1200 > 1000), e joins it? no:
  // d is 1200 bytes alone, e (200) joins d's open bucket only if 1200 + 200 <= 1000: no.
  EXPECT_EQ(plan_fusion(ready, 1000, 1 << 20, false), (Jobs{{0, 1}, {2}, {3}, {4}}));
  EXPECT_EQ(plan_fusion(ready, 4000, 1 << 20, false), (Jobs{{0, 1, 3, 4}, {2}}));
  // A step's first bucket is capped at 400 bytes: a alone, then b, d, e fill the full threshold.
  EXPECT_EQ(plan_fusion(ready, 4000, 400, true), (Jobs{{0}, {1, 3, 4}, {2}}));
  EXPECT_EQ(plan_fusion(ready, 0, 1 << 20, false), (Jobs{{0}, {1}, {2}, {3}, {4}}));
  auto broadcast = allreduce_of("f", 10);
  broadcast.kind = Collective::broadcast;
  const std::vector<engine::Descriptor> mixed = {allreduce_of("a", 10), broadcast, allreduce_of("b", 10)};
  EXPECT_EQ(plan_fusion(mixed, 4000, 4000, false), (Jobs{{0, 2}, {1}}));
}

SimulationSetup setup_of(int ranks, int per_host) {
  SimulationSetup s;
  s.profile = two_gradients();
  s.ranks = ranks;
  s.ranks_per_host = per_host;
  s.policy.cycle_time = std::chrono::seconds(10);  // rounds start only when rung
  s.policy.fusion_threshold = 0;
  return s;
}

TEST(SimStep, OneRankComputesOnly) {
  const auto r = simulate(setup_of(1, 1));
  EXPECT_DOUBLE_EQ(r.step_seconds, two_gradients().compute_seconds());
  EXPECT_NEAR(r.exposed_seconds, 0, 1e-12);
}

// Overlap off: every gradient is enqueued when backward ends; the round starts then, its calls
// follow one another, then the optimizer runs.
TEST(SimStep, AllreduceAfterBackwardAddsRoundAndCalls) {
  auto s = setup_of(4, 2);
  s.policy.overlap = false;
  CollectiveTimes times(s.network, 4, 2);
  // The measured steps' gradients are cached: a round is the allreduce of the tally alone.
  const double round = times.negotiation(engine::Tally::kHeader + 2).seconds;
  const double calls = times.allreduce(1000, DataType::f32).seconds + times.allreduce(250000, DataType::f32).seconds;
  const auto r = simulate(s);
  EXPECT_NEAR(r.step_seconds, s.profile.compute_seconds() + round + calls, 1e-12);
  EXPECT_NEAR(r.allreduce_seconds, calls, 1e-12);
  EXPECT_NEAR(r.negotiation_seconds, round, 1e-12);
  EXPECT_EQ(r.collectives, 2);
}

// Overlap on: the first gradient's round and call run during the second gradient's backward
// (6 ms, longer than them), so only the second's round and call are exposed.
TEST(SimStep, OverlapHidesTheCallsThatBackwardOutlasts) {
  auto s = setup_of(4, 2);
  CollectiveTimes times(s.network, 4, 2);
  const double round = times.negotiation(engine::Tally::kHeader + 2).seconds;
  const double first = times.allreduce(1000, DataType::f32).seconds;
  const double second = times.allreduce(250000, DataType::f32).seconds;
  ASSERT_LT(round + first, 0.006);
  const auto r = simulate(s);
  EXPECT_NEAR(r.step_seconds, s.profile.compute_seconds() + round + second, 1e-12);
  EXPECT_NEAR(r.exposed_seconds, round + second, 1e-12);
  EXPECT_NEAR(r.allreduce_seconds, first + second, 1e-12);
}

// The measured steps' gradients are cached, so every round is the allreduce of the tally (a
// header and a count per cached gradient): the same few bytes at 4 ranks and at 1,024, whatever
// the cycles; the full exchange (the allgather of 512-byte slots) ran in the first step only.
TEST(SimStep, CachedStepsNegotiateWithOneSmallAllreducePerRound) {
  for (int ranks : {4, 1024}) {
    auto s = setup_of(ranks, 1);
    s.policy.cycle_time = std::chrono::milliseconds(1);
    CollectiveTimes times(s.network, ranks, 1);
    const auto r = simulate(s);
    EXPECT_GT(r.cycles, 1);
    EXPECT_NEAR(r.negotiation_seconds, r.cycles * times.negotiation(engine::Tally::kHeader + 2).seconds, 1e-12)
        << ranks << " ranks";
  }
}

// A straggler three times slower: every step waits for its compute; the others wait in step()
// for its extra compute (its forward, backward and optimizer being 2x longer) plus the calls.
TEST(SimStep, AStragglerSetsThePaceAndOthersWaitForIt) {
  auto s = setup_of(2, 1);
  s.policy.overlap = false;
  s.stragglers = {{1, 3.0}};
  CollectiveTimes times(s.network, 2, 1);
  const double comm = times.negotiation(engine::Tally::kHeader + 2).seconds +
                      times.allreduce(1000, DataType::f32).seconds + times.allreduce(250000, DataType::f32).seconds;
  const auto& p = s.profile;
  const auto r = simulate(s);
  EXPECT_NEAR(r.step_seconds, 3 * p.compute_seconds() + comm, 1e-12);
  EXPECT_NEAR(r.compute_seconds, 3 * p.compute_seconds(), 1e-12);
  EXPECT_NEAR(r.wait_seconds, 2 * p.compute_seconds() + comm, 1e-12);
}

// Jitter: each rank's compute varies from step to step, and a step waits for its slowest rank,
// so the mean step's compute exceeds the profile's; the draws are the seed's, so runs repeat.
TEST(SimStep, JitterMakesTheSlowestRankSlowerAndRepeats) {
  auto s = setup_of(8, 2);
  const double plain = simulate(s).compute_seconds;
  s.jitter = 0.2;
  s.steps = 12;
  const auto a = simulate(s), b = simulate(s);
  EXPECT_GT(a.compute_seconds, plain * 1.05);
  EXPECT_GE(a.step_seconds, a.compute_seconds - 1e-12);
  EXPECT_EQ(a.step_seconds, b.step_seconds);
  s.seed = 2;
  EXPECT_NE(simulate(s).step_seconds, a.step_seconds);
  s.profile.jitter = 0.2;  // the profile's, when the setup does not say
  s.jitter = -1;
  s.seed = 1;
  EXPECT_EQ(simulate(s).step_seconds, a.step_seconds);
  s.ranks = 8192;
  EXPECT_THROW(simulate(s), Error);  // every rank on its own: at most 4,096
}

TEST(SimStep, BadSetupsAreRefused) {
  auto s = setup_of(6, 4);
  EXPECT_THROW(simulate(s), Error);  // 4 does not divide 6
  s = setup_of(2, 1);
  s.stragglers = {{2, 2.0}};
  EXPECT_THROW(simulate(s), Error);
  s.stragglers = {{1, 0.5}};
  EXPECT_THROW(simulate(s), Error);
}

TEST(SimStep, WritesAChromeTraceOfTheSimulatedSteps) {
  auto s = setup_of(4, 2);
  s.timeline_path = testing::TempDir() + "sim_timeline_{rank}.json";
  s.stragglers = {{3, 2.0}};
  simulate(s);
  for (int rank : {0, 3}) {
    const std::string path = testing::TempDir() + "sim_timeline_" + std::to_string(rank) + ".json";
    std::ifstream in(path);
    std::stringstream text;
    text << in.rdbuf();
    for (const char* phase : {"FORWARD", "BACKWARD", "OPTIMIZER", "NEGOTIATE", "ALLREDUCE", "a.weight"})
      EXPECT_NE(text.str().find(phase), std::string::npos) << phase << " missing in " << path;
    std::remove(path.c_str());
  }
  std::ifstream absent(testing::TempDir() + "sim_timeline_1.json");
  EXPECT_FALSE(absent.good()) << "ranks 1 and 2 compute like rank 0: one file for them";
}

}  // namespace
}  // namespace tutti::sim
