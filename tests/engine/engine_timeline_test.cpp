// The engine's timeline started and stopped while the engine runs (Engine::start_timeline and
// stop_timeline, Horovod's dynamic timeline), with ranks as threads: every file is complete JSON
// once stopped and holds the operations of its own period only; switching files, the same file
// again, a file that cannot be written, cycle markers, and starts and stops racing the engine's
// thread.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <unistd.h>
#include <atomic>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "harness.hpp"
#include "tutti/engine.hpp"

namespace tutti {
namespace {

using testing::run_ranks;
namespace fs = std::filesystem;

/// A fresh directory for one test's files, removed at the end.
struct TempDir {
  fs::path path;
  explicit TempDir(const std::string& name)
      : path(fs::temp_directory_path() / ("tutti_" + name + "_" + std::to_string(::getpid()))) {
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TempDir() { fs::remove_all(path); }
};

std::string read_text(const fs::path& file) {
  std::ifstream in(file);
  if (!in) throw std::runtime_error("no file " + file.string());
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

struct Trace {
  std::map<std::string, std::set<std::string>> phases;  // lane name -> its complete events' names
  int cycle_marks = 0;
};

/// Parses a timeline (throws on invalid JSON, which an unclosed file is).
Trace parse(const std::string& text) {
  const auto events = nlohmann::json::parse(text);
  if (!events.is_array()) throw std::runtime_error("timeline is not a JSON array");
  std::map<int, std::string> lanes;
  for (const auto& e : events)
    if (e["ph"] == "M" && e["name"] == "thread_name") lanes[e["tid"].get<int>()] = e["args"]["name"];
  Trace trace;
  for (const auto& e : events) {
    if (e["ph"] == "X") trace.phases[lanes.at(e["tid"].get<int>())].insert(e["name"].get<std::string>());
    if (e["ph"] == "i" && e["name"] == "CYCLE_START") ++trace.cycle_marks;
  }
  return trace;
}

bool has(const Trace& trace, const std::string& lane, const std::string& phase) {
  const auto it = trace.phases.find(lane);
  return it != trace.phases.end() && it->second.count(phase) > 0;
}

void allreduce(Engine& engine, const std::string& name) {
  std::vector<float> x(16, 1.f);
  engine.enqueue_allreduce(name, x.data(), x.size(), DataType::f32, ReduceOp::sum).wait();
  if (x[0] != static_cast<float>(engine.size())) throw std::runtime_error(name + ": wrong sum");
}

TEST(EngineTimeline, StartStopAndStartAgainWriteTwoCompleteFiles) {
  TempDir dir("timeline_dynamic");
  const auto failures = run_ranks(2, [&](Communicator& comm) {
    Engine engine(comm, EngineOptions{});
    const std::string r = std::to_string(comm.rank());
    allreduce(engine, "before");
    engine.start_timeline((dir.path / "a_{rank}.json").string());
    allreduce(engine, "first.0");
    allreduce(engine, "first.1");
    engine.stop_timeline();
    const std::string first = read_text(dir.path / ("a_" + r + ".json"));  // complete while the engine runs
    const Trace a = parse(first);
    for (const char* name : {"first.0", "first.1"})
      EXPECT_TRUE(has(a, name, "ALLREDUCE")) << "rank " << r << " " << name;
    EXPECT_FALSE(a.phases.count("before"));
    EXPECT_EQ(a.cycle_marks, 0);
    allreduce(engine, "between");
    engine.stop_timeline();  // nothing running: nothing to do

    engine.start_timeline((dir.path / "b_{rank}.json").string());
    allreduce(engine, "second");
    engine.stop_timeline();
    allreduce(engine, "after");
    const Trace b = parse(read_text(dir.path / ("b_" + r + ".json")));
    EXPECT_TRUE(has(b, "second", "ALLREDUCE")) << "rank " << r;
    for (const char* name : {"before", "first.0", "first.1", "between", "after"})
      EXPECT_FALSE(b.phases.count(name)) << "rank " << r << " " << name;
    EXPECT_EQ(read_text(dir.path / ("a_" + r + ".json")), first) << "rank " << r << ": the first file changed";
  });
  EXPECT_EQ(failures, "");
}

// The options' timeline (TUTTI_TIMELINE) is closed, complete, when another is started; a path
// without "{rank}" is written by rank 0 alone.
TEST(EngineTimeline, StartingAnotherFileClosesTheRunningOne) {
  TempDir dir("timeline_switch");
  const auto failures = run_ranks(2, [&](Communicator& comm) {
    EngineOptions o;
    o.timeline_path = (dir.path / "init.json").string();
    Engine engine(comm, o);
    allreduce(engine, "x");
    engine.start_timeline((dir.path / "next.json").string());
    allreduce(engine, "y");
    if (comm.rank() == 0) {
      const Trace init = parse(read_text(dir.path / "init.json"));
      EXPECT_TRUE(has(init, "x", "ALLREDUCE"));
      EXPECT_FALSE(init.phases.count("y"));
    }
  });
  EXPECT_EQ(failures, "");
  const Trace next = parse(read_text(dir.path / "next.json"));  // closed by the engine's destruction
  EXPECT_TRUE(has(next, "y", "ALLREDUCE"));
  EXPECT_FALSE(next.phases.count("x"));
  std::set<std::string> files;
  for (const auto& entry : fs::directory_iterator(dir.path)) files.insert(entry.path().filename().string());
  EXPECT_EQ(files, (std::set<std::string>{"init.json", "next.json"}));
}

TEST(EngineTimeline, TheSameFileAgainStartsItAfresh) {
  TempDir dir("timeline_same");
  const auto failures = run_ranks(2, [&](Communicator& comm) {
    Engine engine(comm, EngineOptions{});
    const fs::path file = dir.path / ("t_" + std::to_string(comm.rank()) + ".json");
    engine.start_timeline((dir.path / "t_{rank}.json").string());
    allreduce(engine, "p");
    // Rank 0: the file it writes, named without {rank}: started afresh. Rank 1: a path without
    // {rank} is none of its business, so its file is closed and none is written.
    engine.start_timeline(file.string());
    allreduce(engine, "q");
    engine.stop_timeline();
    const Trace t = parse(read_text(file));
    if (comm.rank() == 0) {
      EXPECT_TRUE(has(t, "q", "ALLREDUCE"));
      EXPECT_FALSE(t.phases.count("p"));
    } else {
      EXPECT_TRUE(has(t, "p", "ALLREDUCE"));
      EXPECT_FALSE(t.phases.count("q"));
    }
  });
  EXPECT_EQ(failures, "");
}

TEST(EngineTimeline, AFileThatCannotBeWrittenLeavesTheRunningOne) {
  TempDir dir("timeline_unwritable");
  const auto failures = run_ranks(2, [&](Communicator& comm) {
    Engine engine(comm, EngineOptions{});
    engine.start_timeline((dir.path / "ok_{rank}.json").string());
    const std::string bad = (dir.path / "missing" / "x_{rank}.json").string();
    try {
      engine.start_timeline(bad);
      ADD_FAILURE() << "a file in a missing directory was accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::invalid_argument);
      EXPECT_NE(std::string(e.what()).find("missing"), std::string::npos) << e.what();
    }
    allreduce(engine, "z");
    engine.stop_timeline();
    const Trace t = parse(read_text(dir.path / ("ok_" + std::to_string(comm.rank()) + ".json")));
    EXPECT_TRUE(has(t, "z", "ALLREDUCE"));
  });
  EXPECT_EQ(failures, "");
}

TEST(EngineTimeline, MarkCyclesWritesCycleStarts) {
  TempDir dir("timeline_cycles");
  const auto failures = run_ranks(2, [&](Communicator& comm) {
    Engine engine(comm, EngineOptions{});
    engine.start_timeline((dir.path / "c_{rank}.json").string(), true);
    for (int i = 0; i < 3; ++i) allreduce(engine, "m" + std::to_string(i));
    engine.stop_timeline();
    const Trace t = parse(read_text(dir.path / ("c_" + std::to_string(comm.rank()) + ".json")));
    EXPECT_GE(t.cycle_marks, 3) << "rank " << comm.rank();  // at least one round per allreduce
    EXPECT_TRUE(has(t, "m2", "ALLREDUCE"));
  });
  EXPECT_EQ(failures, "");
}

// Starts and stops from another thread while the engine's thread records tensors (the race the
// sanitizer builds look for): every file left is complete JSON.
TEST(EngineTimeline, StartsAndStopsRaceTheEngine) {
  TempDir dir("timeline_race");
  const auto failures = run_ranks(2, [&](Communicator& comm) {
    EngineOptions o;
    o.cycle_time = std::chrono::microseconds(200);
    Engine engine(comm, o);
    std::atomic<bool> done{false};
    std::thread toggler([&] {
      for (int i = 0; !done.load(); ++i) {
        engine.start_timeline((dir.path / ("r" + std::to_string(i % 8) + "_{rank}.json")).string(), i % 2 == 0);
        engine.record_phase("TOGGLE", std::chrono::steady_clock::now(), std::chrono::steady_clock::now());
        std::this_thread::sleep_for(std::chrono::microseconds(300));
        if (i % 3 == 0) engine.stop_timeline();
      }
    });
    for (int i = 0; i < 150; ++i) {
      std::vector<std::vector<float>> x(4, std::vector<float>(8, 1.f));
      std::vector<Handle> hs;
      for (int t = 0; t < 4; ++t)
        hs.push_back(engine.enqueue_allreduce("t" + std::to_string(t), x[static_cast<std::size_t>(t)].data(), 8,
                                              DataType::f32, ReduceOp::sum));
      for (auto& h : hs) h.wait();
    }
    done = true;
    toggler.join();
    engine.stop_timeline();
    for (int i = 0; i < 8; ++i) {
      const fs::path file = dir.path / ("r" + std::to_string(i) + "_" + std::to_string(comm.rank()) + ".json");
      if (fs::exists(file)) {
        EXPECT_NO_THROW(parse(read_text(file))) << file;
      }
    }
  });
  EXPECT_EQ(failures, "");
}

}  // namespace
}  // namespace tutti
