// The host_transfer backend: the host side of each operation (enqueue) and the progress thread
// that runs the host collectives in issue order (the protocol is in host_transfer.hpp).
#include "gpu/host_transfer.hpp"

#include <algorithm>
#include <string>

#include "core/log.hpp"

namespace tutti::gpu::detail {

namespace {

// Operations from twice this size are pipelined in chunks of at least this size.
constexpr std::size_t pipeline_chunk_bytes = std::size_t{4} << 20;

// How long the thread blocks on the oldest host collective before it looks for newly staged
// operations to start (a host collective that completes wakes it at once).
constexpr std::chrono::milliseconds completion_slice{1};

const char* name_of(const DeviceCall& call) {
  switch (call.kind) {
    case DeviceCall::Kind::send:
      return "send";
    case DeviceCall::Kind::recv:
      return "recv";
    case DeviceCall::Kind::collective:
      break;
  }
  return to_string(call.call.collective).data();
}

}  // namespace

Layout layout_of(const DeviceCall& dc, int rank, int size) {
  const tutti::comm::Call& c = dc.call;
  const auto p = static_cast<std::size_t>(size);
  const std::size_t block = c.count * size_of(c.type);  // validated: no overflow
  if (dc.kind == DeviceCall::Kind::send) return {.staged = block, .in = c.send, .in_bytes = block};
  if (dc.kind == DeviceCall::Kind::recv) return {.staged = block, .out = c.recv, .out_bytes = block};
  switch (c.collective) {
    case Collective::allreduce:
      return {.staged = block, .in = c.send, .in_bytes = block, .out = c.recv, .out_bytes = block, .elementwise = true};
    case Collective::reduce:
      return {.staged = block,
              .in = c.send,
              .in_bytes = block,
              .out = rank == c.root ? c.recv : nullptr,
              .out_bytes = block,
              .elementwise = true};
    case Collective::broadcast:
      return {.staged = block,
              .in = rank == c.root ? c.recv : nullptr,
              .in_bytes = block,
              .out = rank == c.root ? nullptr : c.recv,
              .out_bytes = block,
              .elementwise = true};
    case Collective::allgather: {
      // In place as MPI_IN_PLACE (send == recv): this rank's block is already at its place.
      const std::size_t mine = static_cast<std::size_t>(rank) * block;
      const void* in = c.send == c.recv ? static_cast<const std::byte*>(c.send) + mine : c.send;
      return {
          .staged = p * block, .in = in, .in_offset = mine, .in_bytes = block, .out = c.recv, .out_bytes = p * block};
    }
    case Collective::reduce_scatter:
      return {.staged = p * block, .in = c.send, .in_bytes = p * block, .out = c.recv, .out_bytes = block};
    case Collective::alltoall:
      return {.staged = 2 * p * block,
              .in = c.send,
              .in_bytes = p * block,
              .out = c.recv,
              .out_offset = p * block,
              .out_bytes = p * block};
    default:  // barrier: no data
      return {};
  }
}

std::size_t chunks_of(std::size_t bytes, std::size_t element, std::size_t& chunk_bytes) {
  chunk_bytes = bytes;
  if (bytes < 2 * pipeline_chunk_bytes) return 1;
  chunk_bytes = std::max(pipeline_chunk_bytes, (bytes + HostTransfer::max_chunks - 1) / HostTransfer::max_chunks);
  chunk_bytes = (chunk_bytes + element - 1) / element * element;
  return (bytes + chunk_bytes - 1) / chunk_bytes;
}

HostTransfer::HostTransfer(std::shared_ptr<device::Device> device, tutti::Communicator host,
                           std::shared_ptr<LocalOrder> order)
    : device_(std::move(device)), host_(std::move(host)), order_(std::move(order)) {
  done_ = static_cast<std::uint32_t*>(device_->allocate_pinned(sizeof(std::uint32_t)));
  staging_ = std::make_unique<device::StagingPool>(*device_, staging_lines, max_staging);
  thread_ = std::thread([this] { run(); });
}

HostTransfer::~HostTransfer() {
  if (order_) order_->leave(host_.rank());
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  stop_.store(true, std::memory_order_release);
  wake_.notify_all();
  // An operation not completed now never gets its host collective's result: its stream is
  // released below and copies back whatever its staging holds. Recorded before the release, so
  // that whoever sees such a stream pass sees the failure too (an operation completing just now
  // is counted as aborted: a failure too many, never a result taken for valid).
  const std::uint32_t completed = completed_.load(std::memory_order_acquire);
  if (completed != issued_) {
    Error aborted(ErrorCode::aborted, "tutti::gpu: the host_transfer communicator (rank " +
                                          std::to_string(host_.rank()) + " of " + std::to_string(host_.size()) +
                                          ") was destroyed with operations " + std::to_string(completed + 1) + " to " +
                                          std::to_string(issued_) +
                                          " in flight: their streams are released without results");
    core::log(core::LogLevel::warn, host_.rank(), aborted.what());
    failures_->record(std::move(aborted));
  }
  // Every operation issued so far counts as done for the streams: none may wait on it for ever.
  // Released before the join, which waits at most for the host collectives in flight to finish or
  // reach their own timeouts (their staging stays allocated meanwhile), and again after it, in
  // case the thread lowered the flag in between.
  device_->set_flag(done_, issued_);
  thread_.join();
  device_->set_flag(done_, issued_);
  // The flag, and the staging a held stream may still copy through, stay allocated (the pool
  // frees only what the streams released): the device frees them when it goes (the emulated
  // device runs its streams' queued work first).
}

void FailureRecord::record(Error error) {
  std::lock_guard lock(mutex_);
  if (error_) return;  // the first failure wins
  error_.emplace(std::move(error));
  failed_.store(true, std::memory_order_release);
}

void FailureRecord::check() const {
  if (!failed()) return;
  std::lock_guard lock(mutex_);
  throw *error_;
}

std::optional<Error> FailureRecord::failure() const {
  std::lock_guard lock(mutex_);
  return error_;
}

void HostTransfer::enqueue(const DeviceCall& call, device::Stream stream) {
  check();
  const Layout l = layout_of(call, host_.rank(), host_.size());
  const std::size_t element = size_of(call.call.type);
  std::size_t chunk = l.staged;
  const std::size_t chunks = l.elementwise ? chunks_of(l.staged, element, chunk) : 1;
  const std::uint32_t first = issued_ + 1;
  // An operation with no input on this rank (a receive, a broadcast's non-root) starts its host
  // side at once, before its stream gets there: it fills the staging early, so it may not chain
  // onto a buffer an earlier operation still copies out of (only that stream waits for it).
  const bool waits = (l.in != nullptr && l.in_bytes > 0) ||
                     (call.kind == DeviceCall::Kind::collective && call.call.collective == Collective::barrier);
  const device::StagingPool::Taken taken = staging_->take(l.staged, first, stream, waits);
  const bool chained = taken.chained;
  Staging& staging = *taken.buffer;
  // A free buffer's ready words are set just below this operation's numbers (so even after the
  // counter wrapped). A chained one's still belong to the operation before, which the progress
  // thread may not have started: they stay, below ours (numbers only grow), and are overwritten
  // by the stream.
  if (!chained)
    for (std::size_t i = 0; i < chunks; ++i)
      device_->set_flag(ready(staging, i), first + static_cast<std::uint32_t>(i) - 1);

  // Chunk i covers [offset, offset + bytes) of what is copied in and out (all of it when whole).
  const auto offset = [&](std::size_t i) { return i * chunk; };
  const auto in_bytes = [&](std::size_t i) { return chunks == 1 ? l.in_bytes : std::min(chunk, l.staged - offset(i)); };
  const auto out_bytes = [&](std::size_t i) {
    return chunks == 1 ? l.out_bytes : std::min(chunk, l.staged - offset(i));
  };
  bool enqueued_any = false, half_enqueued = false;
  try {
    for (std::size_t i = 0; i < chunks; ++i) {
      if (l.in != nullptr && in_bytes(i) > 0)
        device_->copy(staging.data() + l.in_offset + offset(i), static_cast<const std::byte*>(l.in) + offset(i),
                      in_bytes(i), stream);
      enqueued_any = true;
      device_->write_value(ready(staging, i), first + static_cast<std::uint32_t>(i), stream);
    }
    // Ranks sharing hardware queues submit in order: a collective's signals on every such rank
    // before its waits on any; a send's before the wait of the receive that matches it.
    if (order_) {
      std::optional<Error> late;
      if (call.kind == DeviceCall::Kind::collective) {
        late = order_->pass(host_.rank(), timeout_of(call));
      } else if (call.kind == DeviceCall::Kind::send) {
        order_->sent(host_.rank(), call.peer, call.tag);
      } else {
        const std::uint64_t nth = ++received_[{call.peer, call.tag}];
        late = order_->await_sent(call.peer, host_.rank(), call.tag, nth, timeout_of(call));
      }
      if (late) record(*late, Operation{first, call, 0, true, ready(staging, 0), staging.data()});
    }
    for (std::size_t i = 0; i < chunks; ++i) {
      device_->wait_value(done_, first + static_cast<std::uint32_t>(i), stream);
      if (l.out != nullptr && out_bytes(i) > 0)
        device_->copy(static_cast<std::byte*>(l.out) + offset(i), staging.data() + l.out_offset + offset(i),
                      out_bytes(i), stream);
    }
    staging_->release(staging, stream);
  } catch (const Error& error) {
    // The first enqueue checks the stream: if it threw, nothing was enqueued. Else the stream may
    // wait for these numbers, so they must run (and fail at once).
    if (!enqueued_any) {
      staging_->cancel(taken);
      throw;
    }
    device::StagingPool::retire(staging);  // its stream may never get to the release
    record(error, Operation{first, call, 0, true, ready(staging, 0), staging.data()});
    half_enqueued = true;
  }
  {
    std::lock_guard lock(mutex_);
    for (std::size_t i = 0; i < chunks; ++i) {
      Operation op{first + static_cast<std::uint32_t>(i), call, offset(i), waits, ready(staging, i), staging.data()};
      if (chunks > 1) op.call.call.count = in_bytes(i) / element;
      queue_.push_back(op);
    }
  }
  issued_ = first + static_cast<std::uint32_t>(chunks) - 1;
  wake_.notify_one();
  if (half_enqueued) check();
}

void HostTransfer::run() {
  std::deque<Operation> pending;            // issued, not started: waiting for their input to be staged
  std::deque<InFlight> flight;              // started (or to be completed without a host collective)
  std::map<std::uint32_t, InFlight> early;  // receives of `pending` posted ahead of their turn, by n
  std::chrono::microseconds nap{1};
  for (;;) {
    {
      std::unique_lock lock(mutex_);
      if (pending.empty() && flight.empty()) wake_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
      if (stopping_) break;
      while (!queue_.empty()) {
        pending.push_back(queue_.front());
        queue_.pop_front();
      }
    }
    // Start, in order, every operation whose input is staged (after a failure: complete at once).
    bool moved = false;
    while (!pending.empty()) {
      const Operation& op = pending.front();
      const bool failed = failures_->failed();
      if (!failed && op.waits && !device::Device::reached(device::Device::load_flag(op.ready), op.n)) break;
      InFlight f{op, {}, std::chrono::steady_clock::now()};
      if (const auto it = early.find(op.n); it != early.end()) {
        f = std::move(it->second);  // even after a failure: it may still write into the staging
        early.erase(it);
      } else if (!failed) {
        try {
          f.request = start_host(op);
        } catch (const Error& error) {
          record(error, op);
        }
      }
      flight.push_back(std::move(f));
      pending.pop_front();
      moved = true;
    }
    // A receive waiting behind an operation whose input is not staged yet is posted now: the
    // peer's send may need it posted before this rank's stream gets to stage that input (its
    // queue shared with the peer's stream, local_order.hpp). Receives are posted in issue order,
    // so messages still match in the order the receives were issued.
    if (!failures_->failed())
      for (const Operation& op : pending) {
        if (op.call.kind != DeviceCall::Kind::recv || early.contains(op.n)) continue;
        InFlight f{op, {}, std::chrono::steady_clock::now()};
        try {
          f.request = start_host(op);
        } catch (const Error& error) {
          record(error, op);
          break;
        }
        early.emplace(op.n, std::move(f));
        moved = true;
      }
    // Complete the oldest, in order: done is raised in order of n.
    if (!flight.empty()) {
      InFlight& f = flight.front();
      bool complete = true;
      try {
        // Blocks (woken by completion) only when nothing is left to start.
        complete = f.request.wait_for(pending.empty() ? completion_slice : std::chrono::milliseconds(0), f.started);
      } catch (const Error& error) {
        record(error, f.op);
      } catch (const std::exception& error) {
        record(Error(ErrorCode::system, error.what()), f.op);
      }
      if (complete) {
        if (stop_.load(std::memory_order_acquire)) break;  // the destructor released every stream
        // Counted before the stream sees it: a caller that saw its stream pass and destroys the
        // communicator must not find the operation in flight (a false `aborted`).
        completed_.store(f.op.n, std::memory_order_release);
        device_->set_flag(done_, f.op.n);
        flight.pop_front();
        moved = true;
      }
    }
    if (moved) {
      nap = std::chrono::microseconds{1};
    } else if (!pending.empty()) {
      // Naps that grow to 100 µs: a stream that is busy for long costs the host almost nothing.
      std::this_thread::sleep_for(nap);
      nap = std::min(nap * 2, std::chrono::microseconds{100});
    }
  }
  for (auto& [n, f] : early) flight.push_back(std::move(f));
  drain(flight);
}

void HostTransfer::drain(std::deque<InFlight>& flight) {
  for (InFlight& f : flight) {
    try {
      // The operation's own timeout (counted from its start) ends this wait, not the hour.
      f.request.wait_for(std::chrono::hours(1), f.started);
    } catch (const std::exception&) {
      // Stopping: the streams are released already, and nobody is left to raise it to.
    }
  }
}

tutti::Request HostTransfer::start_host(const Operation& op) {
  const DeviceCall& dc = op.call;
  const tutti::comm::Call& c = dc.call;
  std::byte* data = op.data + op.offset;
  if (dc.kind == DeviceCall::Kind::send) return host_.isend(data, c.count, c.type, dc.peer, dc.tag);
  if (dc.kind == DeviceCall::Kind::recv) return host_.irecv(data, c.count, c.type, dc.peer, dc.tag);
  const std::size_t block = c.count * size_of(c.type);
  const auto p = static_cast<std::size_t>(host_.size());
  switch (c.collective) {
    case Collective::allreduce:
      return host_.iallreduce(data, data, c.count, c.type, *c.op, c.options);
    case Collective::reduce:
      return host_.ireduce(data, data, c.count, c.type, *c.op, c.root, c.options);
    case Collective::broadcast:
      return host_.ibroadcast(data, c.count, c.type, c.root, c.options);
    case Collective::allgather:
      return host_.iallgather(data + static_cast<std::size_t>(host_.rank()) * block, data, c.count, c.type, c.options);
    case Collective::reduce_scatter:
      return host_.ireduce_scatter(data, data, c.count, c.type, *c.op, c.options);
    case Collective::alltoall:
      return host_.ialltoall(data, data + p * block, c.count, c.type, c.options);
    case Collective::barrier:
      return host_.ibarrier(c.options);
    default:
      throw Error(ErrorCode::unsupported, std::string(to_string(c.collective)) + " is not a gpu collective");
  }
}

void HostTransfer::record(const Error& error, const Operation& op) {
  failures_->record(Error(error.code(), "tutti::gpu: " + std::string(name_of(op.call)) + " (operation " +
                                            std::to_string(op.n) + ") failed: " + error.what()));
}

}  // namespace tutti::gpu::detail
