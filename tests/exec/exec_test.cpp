// The executor on schedules built by hand (not by the generators), over inproc with ranks as
// threads: exact outputs, dependencies honoured, copies, receive-and-reduce into an operand (on
// arrival, and through staging memory for transports that cannot reduce), and errors that are
// raised on every rank within a bounded time instead of hanging.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "exec/operation.hpp"
#include "exec/queue.hpp"
#include "schedule/schedule.hpp"
#include "threads.hpp"
#include "transport/inproc/inproc.hpp"
#include "transport/matching.hpp"

namespace tutti::testing {
namespace {

using namespace std::chrono_literals;
using exec::Operation;
using exec::OperationQueue;
using schedule::Buffer;
using schedule::Region;
using schedule::Schedule;

constexpr std::size_t n = 1009;  // elements per block
constexpr std::int32_t poison = -7777777;

// Runs fn(queue) on one thread per rank of a fresh inproc group; "" or every rank's failure.
std::string run_ranks(int p, bool native_reduce, const std::function<void(OperationQueue&)>& fn) {
  auto transports = transport::inproc::make_group(p, native_reduce);
  return on_threads(p, [&](int r) {
    auto queue = std::make_shared<OperationQueue>(std::move(transports[static_cast<std::size_t>(r)]));
    fn(*queue);
  });
}

// Runs `schedule` as this rank's part of one collective (same seq on every rank) and waits for it.
void run(OperationQueue& queue, Schedule schedule, const std::vector<std::int32_t>& input,
         std::vector<std::int32_t>& output, std::size_t count = n) {
  transport::Signature signature;
  signature.seq = queue.next_seq();
  signature.count = count;
  signature.type = DataType::i32;
  signature.op = ReduceOp::sum;
  auto op =
      Operation::collective(queue.transport(), std::move(schedule), Operation::Buffers{input.data(), output.data()},
                            DataType::i32, ReduceOp::sum, signature);
  op->timeout = 60s;
  const auto shared = queue.submit(std::move(op), true);
  queue.wait(*shared, std::nullopt);
}

std::int32_t value(int rank, std::size_t i) { return rank * 100000 + static_cast<std::int32_t>(i % 997); }

std::vector<std::int32_t> input_of(int rank, std::size_t blocks = 1) {
  std::vector<std::int32_t> in(blocks * n);
  for (std::size_t i = 0; i < in.size(); ++i) in[i] = value(rank, i);
  return in;
}

Region block(Buffer buffer, std::size_t k) { return Region{buffer, k * n, n}; }

// Every output element equal to want(i) (i over the whole output); throws naming the first that is not.
void expect_output(const std::vector<std::int32_t>& out, const std::function<std::int32_t(std::size_t)>& want) {
  for (std::size_t i = 0; i < out.size(); ++i)
    if (out[i] != want(i))
      throw std::runtime_error("output[" + std::to_string(i) + "] = " + std::to_string(out[i]) + ", expected " +
                               std::to_string(want(i)));
}

// Each rank sends its input to the right and receives the left's into block 0; then forwards
// block 0 (only once it arrived: a dependency) so that block 1 holds the input of two ranks to
// the left; block 2 is a copy of block 1 made after it arrived, block 3 a copy of the input.
TEST(ExecHandBuilt, SendRecvForwardAndCopyInDependencyOrder) {
  for (int p : {2, 3}) {
    const std::string failures = run_ranks(p, true, [p](OperationQueue& queue) {
      const int r = queue.rank(), right = (r + 1) % p, left = (r + p - 1) % p, left2 = (r + 2 * p - 2) % p;
      Schedule s;
      s.send(right, block(Buffer::input, 0));
      const std::uint32_t got = s.recv(left, block(Buffer::output, 0));
      s.send(right, block(Buffer::output, 0), {got});
      const std::uint32_t forwarded = s.recv(left, block(Buffer::output, 1));
      s.copy(block(Buffer::output, 2), block(Buffer::output, 1), {forwarded});
      s.copy(block(Buffer::output, 3), block(Buffer::input, 0));
      const std::vector<std::int32_t> in = input_of(r);
      std::vector<std::int32_t> out(4 * n, poison);
      run(queue, std::move(s), in, out);
      expect_output(out, [&](std::size_t i) {
        const std::size_t k = i / n, j = i % n;
        return k == 0 ? value(left, j) : k == 3 ? value(r, j) : value(left2, j);
      });
    });
    EXPECT_EQ(failures, "") << "p=" << p;
  }
}

// A chain 0 -> 1 -> 2 reducing on the way: rank 1 receives into block 0 with its input as the
// operand; rank 2 first copies its input into block 0 and reduces into it in place (operand ==
// destination). Both with the transport reducing on arrival and through the executor's staging
// memory.
TEST(ExecHandBuilt, ReceiveAndReduceIntoAnOperand) {
  for (bool native_reduce : {true, false}) {
    const std::string failures = run_ranks(3, native_reduce, [](OperationQueue& queue) {
      const int r = queue.rank();
      Schedule s;
      if (r == 0) {
        s.send(1, block(Buffer::input, 0));
      } else if (r == 1) {
        const std::uint32_t reduced = s.recv_reduce(0, block(Buffer::output, 0), block(Buffer::input, 0));
        s.send(2, block(Buffer::output, 0), {reduced});
      } else {
        const std::uint32_t copied = s.copy(block(Buffer::output, 0), block(Buffer::input, 0));
        s.recv_reduce(1, block(Buffer::output, 0), block(Buffer::output, 0), {copied});
      }
      const std::vector<std::int32_t> in = input_of(r);
      std::vector<std::int32_t> out(n, poison);
      run(queue, std::move(s), in, out);
      if (r == 0) return expect_output(out, [](std::size_t) { return poison; });  // never written
      expect_output(out, [r](std::size_t i) {
        std::int32_t sum = 0;
        for (int q = 0; q <= r; ++q) sum += value(q, i);
        return sum;
      });
    });
    EXPECT_EQ(failures, "") << "native_reduce=" << native_reduce;
  }
}

// Hand schedules that disagree on a message's size: both ranks raise Error(mismatch) with the
// transport's one text, at once rather than at the 60 s deadline; the next call raises aborted.
TEST(ExecHandBuilt, MismatchedSchedulesRaiseOnEveryRankInBoundedTime) {
  const auto start = std::chrono::steady_clock::now();
  std::vector<std::string> errors(2, "no error"), later(2, "no error");
  const std::string failures = run_ranks(2, true, [&](OperationQueue& queue) {
    const int r = queue.rank();
    const std::uint64_t seq = 0;  // the first collective of the queue
    Schedule s;
    if (r == 0)
      s.send(1, Region{Buffer::input, 0, n});
    else
      s.recv(0, Region{Buffer::output, 0, n + 1});
    const std::vector<std::int32_t> in = input_of(r, 2);
    std::vector<std::int32_t> out(2 * n, poison);
    const std::string want = transport::size_mismatch(0, n * 4, 1, (n + 1) * 4,
                                                      transport::MessageKey{transport::Channel::collective, seq, 0});
    try {
      run(queue, std::move(s), in, out);
    } catch (const Error& e) {
      errors[static_cast<std::size_t>(r)] =
          e.code() == ErrorCode::mismatch && std::string(e.what()).find(want) != std::string::npos ? "" : e.what();
    }
    try {
      queue.check_usable(true);
    } catch (const Error& e) {
      later[static_cast<std::size_t>(r)] = e.code() == ErrorCode::aborted ? "" : e.what();
    }
    expect_output(out, [](std::size_t) { return poison; });
  });
  EXPECT_EQ(failures, "");
  EXPECT_EQ(errors, std::vector<std::string>(2, ""));
  EXPECT_EQ(later, std::vector<std::string>(2, ""));
  EXPECT_LT(std::chrono::steady_clock::now() - start, 10s);
}

// Ranks that run different collectives (their signatures differ in count): every rank raises
// Error(mismatch) naming the odd rank and its count.
TEST(ExecHandBuilt, MismatchedSignaturesRaiseOnEveryRank) {
  std::vector<std::string> errors(3, "no error");
  const std::string failures = run_ranks(3, true, [&](OperationQueue& queue) {
    const int r = queue.rank(), p = queue.size();
    Schedule s;
    s.send((r + 1) % p, block(Buffer::input, 0));
    s.recv((r + p - 1) % p, block(Buffer::output, 0));
    const std::vector<std::int32_t> in = input_of(r);
    std::vector<std::int32_t> out(n, poison);
    try {
      run(queue, std::move(s), in, out, r == 2 ? n + 1 : n);
    } catch (const Error& e) {
      const std::string what = e.what();
      const bool named = what.find("mismatched collective: rank ") == 0 &&
                         what.find("count=" + std::to_string(n + 1)) != std::string::npos &&
                         what.find("rank 2") != std::string::npos;
      errors[static_cast<std::size_t>(r)] = e.code() == ErrorCode::mismatch && named ? "" : what;
    }
  });
  EXPECT_EQ(failures, "");
  EXPECT_EQ(errors, std::vector<std::string>(3, ""));
}

// A native collective that finishes on its `steps`-th progress and records when it first ran.
class CountingNative final : public transport::NativeCollective {
 public:
  CountingNative(int steps, std::vector<std::string>& log, std::string name)
      : steps_(steps), log_(log), name_(std::move(name)) {}
  void bind(const transport::Signature& signature) override { seq_ = signature.seq; }
  bool progress() override {
    if (calls_++ == 0) log_.push_back(name_ + " #" + std::to_string(seq_));
    if (fail_ && calls_ == steps_) throw Error(ErrorCode::peer_failure, name_ + " failed");
    return calls_ >= steps_;
  }
  std::vector<int> waiting_for() const override { return {}; }
  bool fail_ = false;

 private:
  int steps_, calls_ = 0;
  std::uint64_t seq_ = 0;
  std::vector<std::string>& log_;
  std::string name_;
};

// The three kinds of operation: a native one starts only after every earlier collective finished,
// completes in issue order with them, and its error is raised like any other.
TEST(ExecKinds, NativeOperationsStartAfterEarlierCollectivesAndFailLikeAny) {
  const std::string failures = run_ranks(2, true, [](OperationQueue& queue) {
    std::vector<std::string> log;
    const int r = queue.rank(), peer = 1 - r;
    // A collective: one message each way.
    Schedule exchange;
    exchange.send(peer, Region{Buffer::input, 0, n});
    exchange.recv(peer, Region{Buffer::output, 0, n});
    const std::vector<std::int32_t> in = input_of(r);
    std::vector<std::int32_t> out(n, poison);
    transport::Signature first;
    first.seq = queue.next_seq();
    first.count = n;
    first.type = DataType::i32;
    auto collective =
        Operation::collective(queue.transport(), std::move(exchange), Operation::Buffers{in.data(), out.data()},
                              DataType::i32, ReduceOp::sum, first);
    collective->timeout = 60s;
    EXPECT_EQ(collective->kind(), Operation::Kind::collective);
    EXPECT_TRUE(collective->ordered());
    EXPECT_FALSE(collective->exclusive());
    const auto c = queue.submit(std::move(collective), false);
    transport::Signature second = first;
    second.seq = queue.next_seq();
    second.algorithm = Algorithm::direct;
    auto run = std::make_shared<CountingNative>(3, log, "native");
    run->bind(second);
    auto native = Operation::native(second, run);
    native->timeout = 60s;
    EXPECT_EQ(native->kind(), Operation::Kind::native);
    EXPECT_TRUE(native->exclusive());
    const auto nat = queue.submit(std::move(native), false);
    queue.wait(*nat, std::nullopt);  // issue order: the collective completed first
    EXPECT_TRUE(queue.test(*c));
    for (std::size_t i = 0; i < n; ++i) ASSERT_EQ(out[i], value(peer, i)) << i;
    ASSERT_EQ(log.size(), 1u);
    EXPECT_EQ(log[0], "native #1");
    // Both ranks past their native operation before either fails the communicator: the failure
    // fails the other rank's operations still in flight, and the natives (local here) are not
    // synchronized, so under load one rank's failure could reach the other's first native.
    Schedule sync;
    sync.send(peer, Region{Buffer::input, 0, n});
    sync.recv(peer, Region{Buffer::output, 0, n});
    std::vector<std::int32_t> synced(n, poison);
    testing::run(queue, std::move(sync), in, synced);  // (run, unqualified, is the native above)
    // A native operation that throws fails the communicator on this rank, with its error.
    transport::Signature third = second;
    third.seq = queue.next_seq();
    auto failing = std::make_shared<CountingNative>(2, log, "failing");
    failing->fail_ = true;
    auto bad = Operation::native(third, failing);
    bad->timeout = 60s;
    const auto b = queue.submit(std::move(bad), false);
    try {
      queue.wait(*b, std::nullopt);
      ADD_FAILURE() << "a native operation's error was not raised";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::peer_failure) << e.what();
      EXPECT_STREQ(e.what(), "failing failed");
    }
  });
  EXPECT_EQ(failures, "");
}

// A run's arrays live inside the operation up to N elements and on the heap beyond; either way
// every element is default-constructed and addressable.
TEST(RunStorage, SmallRunsLiveInsideTheirOwnerLargerOnTheHeap) {
  struct Owner {
    core::InlineArray<transport::Completion, 4> completions;
    exec::StepStack<4> stack;
  };
  for (std::size_t size : {0u, 1u, 4u, 5u, 64u}) {
    auto owner = std::make_unique<Owner>();
    const auto* begin = reinterpret_cast<const std::byte*>(owner.get());
    const auto inside = [&](const void* p) {
      const auto* b = static_cast<const std::byte*>(p);
      return b >= begin && b < begin + sizeof(Owner);
    };
    owner->completions.place(size);
    owner->stack.place(size);
    EXPECT_EQ(inside(owner->completions.data()), size <= 4) << size;
    EXPECT_EQ(inside(owner->stack.begin()), size <= 4) << size;
    for (std::size_t i = 0; i < size; ++i) {
      EXPECT_EQ(owner->completions[i].state(), transport::Completion::idle);
      owner->completions[i].set(transport::Completion::done);
      owner->stack.push_back(static_cast<std::uint32_t>(size - i));
    }
    ASSERT_EQ(owner->stack.size(), size);
    std::vector<std::uint32_t> popped;
    while (!owner->stack.empty()) {
      popped.push_back(owner->stack.back());
      owner->stack.pop_back();
    }
    std::vector<std::uint32_t> expected;
    for (std::size_t i = 1; i <= size; ++i) expected.push_back(static_cast<std::uint32_t>(i));
    EXPECT_EQ(popped, expected);
  }
}

// Entries taken out of a match table leave their nodes for the next ones: what goes in comes out
// under its own key, an entry put again under a present key replaces its value, and duplicates
// of a multimap keep their own values.
TEST(SpareNodes, RecycledNodesKeepEveryEntryApart) {
  transport::MatchTable<std::string> table;
  const auto key = [](int peer, std::uint64_t seq) {
    return transport::MatchKey{peer, transport::Channel::collective, seq, 0};
  };
  for (std::uint64_t round = 0; round < 200; ++round) {
    for (int peer = 0; peer < 3; ++peer)
      table.put(key(peer, round), std::to_string(peer) + "/" + std::to_string(round));
    table.put(key(1, round), "again " + std::to_string(round));
    ASSERT_EQ(table.size(), 3u);
    for (int peer : {2, 0, 1}) {
      auto it = table.find(key(peer, round));
      ASSERT_NE(it, table.end());
      EXPECT_EQ(table.take(it),
                peer == 1 ? "again " + std::to_string(round) : std::to_string(peer) + "/" + std::to_string(round));
    }
    EXPECT_TRUE(table.empty());
  }
  using Multi = std::multimap<std::uint64_t, int>;
  Multi multi;
  transport::SpareNodes<Multi, 2> spares;
  for (int round = 0; round < 50; ++round) {
    for (int i = 0; i < 4; ++i) spares.insert(multi, static_cast<std::uint64_t>(round % 3), round * 10 + i);
    auto [first, last] = multi.equal_range(static_cast<std::uint64_t>(round % 3));
    std::vector<int> values;
    for (auto it = first; it != last;) values.push_back(spares.take(multi, it++));
    EXPECT_EQ(values, (std::vector<int>{round * 10, round * 10 + 1, round * 10 + 2, round * 10 + 3}));
    EXPECT_TRUE(multi.empty());
  }
}

// A communicator's run-ahead window: calls that may run ahead do until the window holds
// max_calls - 1 of them or max_bytes of their weight; a call that rings opens a new window, any
// other call leaves it as it is.
TEST(ExecRunAhead, TheWindowBoundsCallsAndBytesAndReopensAtARing) {
  using exec::Plan;
  using exec::RunAheadWindow;
  Plan ahead, rings, neither;
  ahead.notices = true;
  rings.signature_recv = 0;
  ASSERT_TRUE(rings.rings());
  ASSERT_FALSE(ahead.rings());
  ASSERT_FALSE(neither.rings());

  RunAheadWindow window;
  EXPECT_FALSE(window.admits(0)) << "a call that may not run ahead";
  const auto fill = [&](std::size_t weight) {
    std::uint64_t admitted = 0;
    while (window.admits(weight)) {
      window.record(ahead, weight);
      if (++admitted % 7 == 0) window.record(neither, 0);  // e.g. an allreduce whose messages carry signatures
      if (admitted > RunAheadWindow::max_calls) break;
    }
    return admitted;
  };
  // Small calls: max_calls - 1 of them, then the next one rings.
  EXPECT_EQ(fill(264), RunAheadWindow::max_calls - 1);
  EXPECT_FALSE(window.admits(1));
  window.record(rings, 264);
  // Calls of 64 KiB: as many as max_bytes holds (15 of 65536 + 256 bytes).
  const std::size_t large = Plan::run_ahead_bytes + Plan::run_ahead_bookkeeping;
  ASSERT_EQ(large, 65536u + 256u);
  EXPECT_EQ(fill(large), RunAheadWindow::max_bytes / large);
  EXPECT_EQ(fill(large), 0u);
  EXPECT_TRUE(window.admits(RunAheadWindow::max_bytes - (RunAheadWindow::max_bytes / large) * large));
  window.record(rings, 0);
  // Mixed: the bytes of small calls count against the large ones in the same window.
  for (int k = 0; k < 100; ++k) window.record(ahead, 8192);
  EXPECT_EQ(fill(large), (RunAheadWindow::max_bytes - 100 * 8192) / large);
  EXPECT_FALSE(window.admits(RunAheadWindow::max_bytes + 1));
}

}  // namespace
}  // namespace tutti::testing
