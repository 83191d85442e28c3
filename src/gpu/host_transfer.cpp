// The host_transfer backend: the host side of each operation (enqueue) and the progress thread
// that runs the host collectives in issue order (the protocol is in host_transfer.hpp).
#include "gpu/host_transfer.hpp"

#include <algorithm>
#include <string>

namespace tutti::gpu::detail {

namespace {

// Whether flag value `value` has reached `n`, with 32-bit wrap-around (as wait_value compares).
bool reached(std::uint32_t value, std::uint32_t n) { return static_cast<std::int32_t>(value - n) >= 0; }

}  // namespace

HostTransfer::HostTransfer(std::shared_ptr<device::Device> device, tutti::Communicator host)
    : device_(std::move(device)), host_(std::move(host)) {
  done_ = static_cast<std::uint32_t*>(device_->allocate_pinned(sizeof(std::uint32_t)));
  thread_ = std::thread([this] { run(); });
}

HostTransfer::~HostTransfer() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  stop_.store(true, std::memory_order_release);
  wake_.notify_all();
  // Every operation issued so far counts as done for the streams: none may wait on it for ever.
  // Released before the join, which waits at most for a host collective in flight to finish or
  // reach its own timeout (its staging stays allocated meanwhile), and again after it, in case
  // the thread lowered the flag in between.
  device_->set_flag(done_, issued_);
  thread_.join();
  device_->set_flag(done_, issued_);
  // The staging and the flag stay allocated: a held stream may still copy through them. The
  // device frees them when it goes (the emulated device runs its streams' queued work first).
}

void HostTransfer::check() const {
  if (!failed_.load(std::memory_order_acquire)) return;
  std::lock_guard lock(mutex_);
  throw *failure_;
}

HostTransfer::Staging& HostTransfer::take_staging(std::size_t bytes) {
  // Free: its last copy back completed (a fresh event counts as complete). Take the smallest that
  // fits; else replace a free one that is too small; else grow the pool.
  Staging* best = nullptr;
  Staging* small = nullptr;
  for (auto& s : staging_) {
    if (!device_->query(s->event)) continue;
    if (s->capacity >= bytes && (best == nullptr || s->capacity < best->capacity)) best = s.get();
    if (s->capacity < bytes) small = s.get();
  }
  if (best != nullptr) return *best;
  const std::size_t capacity = std::max<std::size_t>(bytes, 4096);
  auto* memory = static_cast<std::byte*>(device_->allocate_pinned(header_bytes + capacity));
  if (small != nullptr) {
    device_->free_pinned(small->memory);
  } else {
    auto fresh = std::make_unique<Staging>();
    fresh->event = device_->create_event();
    staging_.push_back(std::move(fresh));
    small = staging_.back().get();
  }
  small->memory = memory;
  small->capacity = capacity;
  return *small;
}

void HostTransfer::enqueue(const DeviceCall& call, device::Stream stream) {
  check();
  const std::size_t elem = size_of(call.type);
  const auto p = static_cast<std::size_t>(host_.size());
  const std::size_t block = call.count * elem;  // validated: no overflow
  const bool gathers = call.collective == Collective::allgather || call.collective == Collective::reduce_scatter;
  const std::size_t staged = gathers ? p * block : block;
  Staging& staging = take_staging(staged);
  const std::uint32_t n = issued_ + 1;
  device_->set_flag(staging.ready(), n - 1);  // below n even after the counter wraps

  // What goes in and comes out of the staging for each collective (in place on the staging).
  const void* in = call.send;
  std::size_t in_offset = 0, in_bytes = block, out_bytes = block;
  bool copy_in = true, copy_out = true;
  switch (call.collective) {
    case Collective::broadcast:
      in = call.recv;
      copy_in = host_.rank() == call.root;
      copy_out = !copy_in;
      break;
    case Collective::allgather:
      in_offset = static_cast<std::size_t>(host_.rank()) * block;
      out_bytes = staged;
      break;
    case Collective::reduce_scatter:
      in_bytes = staged;
      break;
    default:
      break;
  }
  // The first call that enqueues checks the stream: if it throws, nothing was enqueued.
  if (copy_in && in_bytes > 0) device_->copy(staging.data() + in_offset, in, in_bytes, stream);
  device_->write_value(staging.ready(), n, stream);
  bool half_enqueued = false;
  try {
    device_->wait_value(done_, n, stream);
    if (copy_out && out_bytes > 0) device_->copy(call.recv, staging.data(), out_bytes, stream);
    device_->record(staging.event, stream);
  } catch (const Error& error) {
    // Half enqueued: the stream may go on waiting for n, so n must run (and fails at once).
    record(error, Operation{n, call, staging.ready(), staging.data()});
    half_enqueued = true;
  }
  issued_ = n;
  {
    std::lock_guard lock(mutex_);
    queue_.push_back(Operation{n, call, staging.ready(), staging.data()});
  }
  wake_.notify_one();
  if (half_enqueued) check();
}

void HostTransfer::run() {
  for (;;) {
    Operation op;
    {
      std::unique_lock lock(mutex_);
      wake_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
      if (stopping_) return;
      op = queue_.front();
      queue_.pop_front();
    }
    if (!failed_.load(std::memory_order_acquire)) {
      if (!wait_ready(op)) return;
      try {
        run_host(op);
      } catch (const Error& error) {
        record(error, op);
      } catch (const std::exception& error) {
        record(Error(ErrorCode::system, error.what()), op);
      }
    }
    if (stop_.load(std::memory_order_acquire)) return;  // the destructor released every stream
    device_->set_flag(done_, op.n);
  }
}

bool HostTransfer::wait_ready(const Operation& op) const {
  // Naps that grow to 100 µs: a stream that is busy for long costs the host almost nothing.
  std::chrono::microseconds nap{1};
  while (!reached(device::Device::load_flag(op.ready), op.n)) {
    if (stop_.load(std::memory_order_acquire)) return false;
    std::this_thread::sleep_for(nap);
    nap = std::min(nap * 2, std::chrono::microseconds{100});
  }
  return true;
}

void HostTransfer::run_host(const Operation& op) {
  const DeviceCall& c = op.call;
  const std::size_t block = c.count * size_of(c.type);
  tutti::Request request;
  switch (c.collective) {
    case Collective::allreduce:
      request = host_.iallreduce(op.data, op.data, c.count, c.type, *c.op, c.options);
      break;
    case Collective::broadcast:
      request = host_.ibroadcast(op.data, c.count, c.type, c.root, c.options);
      break;
    case Collective::allgather:
      request = host_.iallgather(op.data + static_cast<std::size_t>(host_.rank()) * block, op.data, c.count, c.type,
                                 c.options);
      break;
    case Collective::reduce_scatter:
      request = host_.ireduce_scatter(op.data, op.data, c.count, c.type, *c.op, c.options);
      break;
    default:
      throw Error(ErrorCode::unsupported, std::string(to_string(c.collective)) + " is not a gpu collective yet");
  }
  // One wait, so that the operation's own deadline applies (Request::wait_for measures from each
  // call) and the host's timeout handling (naming the late ranks, aborting for all) runs.
  request.wait();
}

void HostTransfer::record(const Error& error, const Operation& op) {
  std::lock_guard lock(mutex_);
  if (failure_) return;  // the first failure wins
  failure_.emplace(error.code(), "tutti::gpu: " + std::string(to_string(op.call.collective)) + " (operation " +
                                     std::to_string(op.n) + ") failed: " + error.what());
  failed_.store(true, std::memory_order_release);
}

}  // namespace tutti::gpu::detail
