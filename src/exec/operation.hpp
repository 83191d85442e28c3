// The operations of a queue, of three kinds: a collective that runs a schedule over the
// transport, a point-to-point send or receive (a one-step schedule with an explicit key, which
// completes on its own), and a native collective (one the transport runs itself, or a composite
// of collectives on other communicators). Steps of a schedule start as soon as their
// dependencies complete, so independent steps (and the chunks of a pipelined schedule) overlap.
// Not thread-safe: the owning OperationQueue serializes calls under its lock.
#pragma once

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/inline_array.hpp"
#include "schedule/schedule.hpp"
#include "transport/transport.hpp"

namespace tutti::exec {

/// One send or receive of a point-to-point call, in the caller's terms.
struct PointToPoint {
  static constexpr int any_peer = -1;  // a receive from any source
  bool is_send = false;
  void* data = nullptr;
  std::size_t count = 0;
  DataType type = DataType::u8;
  int peer = 0;
  int tag = 0;
  std::size_t bytes() const { return count * size_of(type); }
  /// "send(count=10, f32, to rank 1, tag 3)": how errors name it (built only for one).
  std::string describe() const;
};

/// A schedule ready to run, with what every run of it shares: its steps (and the signature
/// exchange where the transport needs one), the dependency graph, and each message's index among
/// those between the same two ranks. Immutable once made, so one serves every repeat of a call
/// (the communicator keeps the last few): a run adds only its buffers, sequence number and state.
struct Plan {
  static constexpr std::uint32_t none = ~std::uint32_t{0};
  schedule::Schedule schedule;
  std::vector<std::uint32_t> deps_count;                    // per step
  std::vector<std::uint32_t> dependents_begin, dependents;  // CSR
  std::vector<std::uint32_t> first_ready;                   // reversed: pop_back() starts them in order, sends last
  std::vector<std::uint32_t> message_index;                 // per step (unused by copies)
  std::uint32_t signature_recv = none;                      // the step receiving the ring neighbour's signature
  // A call that runs ahead (see collective): each receive still waiting after notice_after names
  // this call to its sender.
  bool notices = false;
  static constexpr std::size_t max_notice_steps = 64;  // (ScheduleOperation's noticed_ bits)

  /// Over a transport that checks every message's signature, a tree's rooted collective (a
  /// broadcast, scatter, reduce or gather whose largest message is at most `run_ahead_bytes`)
  /// among at most `run_ahead_ranks` ranks may send no signature ring: a rank returns once its
  /// own messages are sent and those it receives are in (a broadcast's or scatter's root, a
  /// reduce's or gather's leaves), without waiting for the others (docs/api.md). Which such calls
  /// do, and which ring to bound how far ranks run ahead, is the communicator's RunAheadWindow.
  static constexpr std::size_t run_ahead_bytes = 64 * 1024;
  static constexpr int run_ahead_ranks = 32;
  /// What a receiver holds for a message besides its bytes, as a RunAheadWindow counts it.
  static constexpr std::size_t run_ahead_bookkeeping = 256;
  /// How long such a call waits for a peer's message before it names its own call to that peer
  /// (Transport::notify_signature): ranks that all wait for peers in other calls learn of the
  /// mismatch after that long.
  static constexpr std::chrono::microseconds notice_after{1000};
  /// What a call with `signature` weighs in a RunAheadWindow where it may run ahead so (its
  /// largest message's bytes and a message's bookkeeping); 0 where it may not.
  static std::size_t run_ahead_weight(const transport::Transport& transport, const transport::Signature& signature,
                                      std::size_t elem_size);
  /// The same for a call of `collective` by `algorithm` among `p` ranks, `count` elements of
  /// `elem_size` bytes each (the signature's count), over a transport of `kind` (the cost model
  /// prices such calls as a stream: comm/cost_model.cpp).
  static std::size_t run_ahead_weight(transport::Kind kind, Collective collective, Algorithm algorithm, int p,
                                      std::size_t count, std::size_t elem_size);

  /// The plan of a collective with `signature` over `transport`, elements of `elem_size` bytes:
  /// its algorithm, collective, count and size, and `run_ahead` (the call runs ahead:
  /// RunAheadWindow::admits of its run_ahead_weight), decide whether a signature exchange is added.
  static std::shared_ptr<const Plan> collective(const transport::Transport& transport, schedule::Schedule schedule,
                                                const transport::Signature& signature, std::size_t elem_size,
                                                bool run_ahead = false);
  /// Whether its runs send the signature ring.
  bool rings() const { return signature_recv != none; }
  /// The one-step plan of a point-to-point message (`index`: its key's).
  static std::shared_ptr<const Plan> point_to_point(const PointToPoint& message, std::uint32_t index);

 private:
  void add_signature_exchange(int rank, int size, std::size_t elem_size);
  void build_graph();
};

/// How far one communicator's rooted calls run ahead between signature rings (Plan::
/// run_ahead_weight). A call that may run ahead does while the window since the last ring holds
/// fewer than max_calls - 1 such calls and at most max_bytes of their weight; the next one rings,
/// as does every other call that rings, and a new window opens. The decision depends on the
/// calls alone, so ranks that make the same calls decide alike; where ranks make different calls,
/// those calls' own messages or notices tell them so (whatever their windows decide next). A rank
/// passes a ring only once its predecessor entered that call, so a rank holds at most size
/// windows of messages it has not yet asked for: size * max_bytes of weight.
class RunAheadWindow {
 public:
  static constexpr std::uint64_t max_calls = 256;
  static constexpr std::size_t max_bytes = std::size_t{1} << 20;
  /// Whether the next call, weighing `weight` (0: it may not run ahead), runs ahead.
  bool admits(std::size_t weight) const { return weight > 0 && calls_ + 1 < max_calls && weight <= max_bytes - bytes_; }
  /// How many calls weighing `weight` (> 0) in a row run ahead from a ring to the next (the call
  /// after them rings).
  static std::uint64_t calls_ahead(std::size_t weight) {
    return std::min<std::uint64_t>(max_calls - 1, max_bytes / weight);
  }
  /// Records the next call by its plan: one that runs ahead fills the window, one that rings
  /// opens a new one, any other (it neither waits for a ring nor runs ahead) leaves it.
  void record(const Plan& plan, std::size_t weight) {
    if (plan.notices) {
      ++calls_;
      bytes_ += weight;
    } else if (plan.rings()) {
      calls_ = 0;
      bytes_ = 0;
    }
  }

 private:
  std::uint64_t calls_ = 0;
  std::size_t bytes_ = 0;
};

class Operation {
 public:
  enum class Kind { collective, point_to_point, native };
  struct Buffers {
    const void* input = nullptr;
    void* output = nullptr;
  };

  /// A collective: runs `plan` (Plan::collective of the same signature) on `buffers`.
  static std::shared_ptr<Operation> collective(transport::Transport& transport, std::shared_ptr<const Plan> plan,
                                               Buffers buffers, DataType type, ReduceOp op,
                                               transport::Signature signature);
  /// The same, planning `schedule` for this one run (message indices numbered per peer in list order).
  static std::shared_ptr<Operation> collective(transport::Transport& transport, schedule::Schedule schedule,
                                               Buffers buffers, DataType type, ReduceOp op,
                                               transport::Signature signature);
  /// Point to point: one send or receive with an explicit key.
  static std::shared_ptr<Operation> point_to_point(transport::Transport& transport, const PointToPoint& message,
                                                   transport::MessageKey key);
  /// A collective the transport runs itself (Transport::start_native) or a composite of
  /// collectives on other communicators.
  static std::shared_ptr<Operation> native(transport::Signature signature,
                                           std::shared_ptr<transport::NativeCollective> run);

  virtual ~Operation() = default;
  Kind kind() const { return kind_; }
  /// Collectives (schedule-driven and native) complete in issue order; point to point on its own.
  bool ordered() const { return kind_ != Kind::point_to_point; }
  /// A native collective progresses only after every earlier collective finished.
  bool exclusive() const { return kind_ == Kind::native; }

  /// Keeps `memory` alive as long as the operation (e.g. a snapshot of an in-place input).
  void own(std::unique_ptr<std::byte[]> memory) { owned_.push_back(std::move(memory)); }
  /// Runs after the operation succeeded (e.g. the division of avg), before it completes.
  void on_success(std::function<void()> finalize) { finalize_ = std::move(finalize); }

  /// Posts the first steps; call once, in issue order.
  virtual void start() = 0;
  /// Advances whatever can advance without blocking. Returns true once finished (or failed).
  virtual bool progress() = 0;
  /// Fails the operation (withdrawing whatever is posted) unless it already finished.
  virtual void fail(const Error& error) = 0;
  /// Ranks this operation is still waiting for.
  virtual std::vector<int> waiting_for() const = 0;
  virtual std::string describe() const { return signature_.describe(); }
  /// How often a waiter must progress it (NativeCollective::poll_period); nullopt: wake-ups suffice.
  virtual std::optional<std::chrono::microseconds> poll_period() const { return std::nullopt; }

  /// A receive's sender (for a receive from any source, the rank whose message it took); -1
  /// until it completed, and for every other operation.
  int source() const { return source_.load(std::memory_order_acquire); }

  bool finished() const { return finished_; }
  const std::optional<Error>& error() const { return error_; }
  std::uint64_t ordinal = 0;             // issue order within the queue
  std::chrono::milliseconds timeout{0};  // how long a wait may take
  const transport::Signature& signature() const { return signature_; }

 protected:
  Operation(Kind kind, transport::Signature signature) : signature_(signature), kind_(kind) {}
  /// Finishes successfully: the on_success action, then finished.
  void succeed();
  /// Finishes with `error`.
  void finish_with(const Error& error);
  void set_source(int rank) { source_.store(rank, std::memory_order_release); }

  transport::Signature signature_;

 private:
  Kind kind_;
  bool finished_ = false;
  std::optional<Error> error_;
  std::function<void()> finalize_;
  std::vector<std::unique_ptr<std::byte[]>> owned_;
  std::atomic<int> source_{-1};
};

/// A stack of step indices that never holds more than the schedule's steps (each enters once),
/// placed once like a core::InlineArray.
template <std::size_t N>
class StepStack {
 public:
  void place(std::size_t capacity) { slots_.place(capacity); }
  bool empty() const { return size_ == 0; }
  std::size_t size() const { return size_; }
  std::uint32_t& operator[](std::size_t i) const { return slots_[i]; }
  std::uint32_t back() const { return slots_[size_ - 1]; }
  void push_back(std::uint32_t index) { slots_[size_++] = index; }
  void pop_back() { --size_; }
  void clear() { size_ = 0; }
  const std::uint32_t* begin() const { return slots_.data(); }
  const std::uint32_t* end() const { return slots_.data() + size_; }

 private:
  core::InlineArray<std::uint32_t, N> slots_;
  std::size_t size_ = 0;
};

/// A schedule run over a transport: a collective (with its signature check) or point to point.
class ScheduleOperation final : public Operation {
 public:
  ScheduleOperation(transport::Transport& transport, std::shared_ptr<const Plan> plan, Buffers buffers, DataType type,
                    ReduceOp op, transport::Signature signature);
  ScheduleOperation(transport::Transport& transport, const PointToPoint& message, transport::MessageKey key);
  void start() override;
  bool progress() override;
  void fail(const Error& error) override;
  std::vector<int> waiting_for() const override;
  std::string describe() const override { return message_ ? message_->describe() : signature_.describe(); }
  std::optional<std::chrono::microseconds> poll_period() const override;

 private:
  void start_run();
  const schedule::Schedule& schedule() const { return plan_->schedule; }
  std::optional<Error> check_signature() const;
  std::byte* address(const schedule::Region& region) const;
  void start_step(std::uint32_t index);
  void complete_step(std::uint32_t index);

  transport::Transport& transport_;
  std::shared_ptr<const Plan> plan_;
  DataType type_;
  ReduceOp op_;
  std::size_t elem_size_;
  transport::MessageKey key_;            // channel and sequence of every message; the index is the plan's
  std::optional<PointToPoint> message_;  // point to point
  const std::byte* input_ = nullptr;
  std::byte* output_ = nullptr;
  // A small call's run allocates nothing beyond the operation: up to `inline_steps` steps (a
  // broadcast, recursive doubling up to p = 4) and `inline_scratch` bytes of scratch (the
  // signature ring's two signatures) live inside it, which stays small enough for the
  // allocator's per-thread cache (operation.cpp).
  static constexpr std::size_t inline_steps = 4, inline_scratch = 2 * sizeof(transport::WireSignature);
  alignas(16) std::byte inline_scratch_[inline_scratch];
  std::unique_ptr<std::byte[]> heap_scratch_;
  std::byte* scratch_ = nullptr;

  core::InlineArray<std::uint32_t, inline_steps> remaining_deps_;
  core::InlineArray<transport::Completion, inline_steps> completions_;
  std::vector<std::unique_ptr<std::byte[]>> staging_;  // per step once one needs it (no native recv_reduce)
  StepStack<inline_steps> ready_, in_flight_;
  std::size_t completed_ = 0;
  // Plan::notices: when receives posted and still waiting name this call to their senders, and
  // the steps (by index, below 64) whose senders were named already.
  std::optional<std::chrono::steady_clock::time_point> notice_due_;
  std::uint64_t noticed_ = 0;
};

/// A native collective, progressed by its own `progress`.
class NativeOperation final : public Operation {
 public:
  NativeOperation(transport::Signature signature, std::shared_ptr<transport::NativeCollective> run)
      : Operation(Kind::native, signature), run_(std::move(run)) {}
  void start() override {}  // the queue progresses it once every earlier collective finished
  bool progress() override;
  void fail(const Error& error) override;
  std::vector<int> waiting_for() const override;
  std::optional<std::chrono::microseconds> poll_period() const override { return run_->poll_period(); }

 private:
  std::shared_ptr<transport::NativeCollective> run_;
};

}  // namespace tutti::exec
