// The ipc backend's stream half: which operations it runs, and what the host call enqueues on the
// stream for each step of the protocol (ipc.hpp); set-up, the watchdog and failures are in ipc.cpp.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>

#include "gpu/ipc.hpp"

namespace tutti::gpu::detail {

bool Ipc::serves(const DeviceCall& dc, std::string* why) const {
  if (!collective_only(dc, why)) return false;
  const auto& c = dc.call;
  switch (c.collective) {
    case Collective::allreduce:  // larger than the staging: several steps, here and below
    case Collective::reduce:
    case Collective::broadcast:
    case Collective::allgather:
      return true;
    case Collective::reduce_scatter:  // each step stages one piece of every block
      return capacity_ / (static_cast<std::size_t>(size_) * size_of(c.type)) > 0 ||
             refuse(why, "the ipc staging (TUTTI_GPU_IPC_BYTES) holds less than one element per rank");
    default:
      return refuse(why, std::string(to_string(c.collective)) + " is not an ipc collective");
  }
}

void Ipc::pass(const DeviceCall& call) {
  if (!order_) return;
  // Once failed (here or on another rank), every stream is released: order no longer matters, and
  // a rank that is late would only be waited for again.
  if (failed_here()) return;
  if (auto late = order_->pass(rank_, timeout_of(call)))
    fail(Error(late->code(), "ipc: " + std::string(to_string(call.call.collective)) + " (operation " +
                                 std::to_string(issued_) + "): " + late->what()));
}

void Ipc::wait_all(Flag f, std::uint32_t value, device::Stream stream, bool including_self) {
  for (int j = 0; j < size_; ++j)
    if (including_self || j != rank_) device_->wait_value(flag(j, f), value, stream);
}

void Ipc::enqueue(const DeviceCall& call, device::Stream stream) {
  check();
  const auto& c = call.call;
  const std::size_t element = size_of(c.type);
  const bool elementwise = c.collective == Collective::allreduce || c.collective == Collective::reduce ||
                           c.collective == Collective::broadcast;
  // Steps: what a rank stages in pieces of at most capacity bytes: an elementwise operation's data,
  // an allgather's block, or a piece of each of a reduce_scatter's p blocks.
  const std::size_t per_step = elementwise || c.collective == Collective::allgather ? capacity_ / element
                               : c.collective == Collective::reduce_scatter
                                   ? capacity_ / (static_cast<std::size_t>(size_) * element)
                                   : c.count;
  const std::size_t steps = c.count > 0 && per_step > 0 ? (c.count + per_step - 1) / per_step : 1;
  const std::uint32_t first = step_ + 1, n = issued_ + 1;
  // The first enqueue checks the stream: if it throws, nothing was enqueued. A later one leaves
  // the protocol half enqueued: every rank fails (and is released).
  device_->write_value(flag(rank_, reached), first, stream);
  step_ = first + static_cast<std::uint32_t>(steps) - 1;
  last_issued_.store(step_);
  issued_ = n;
  bool half_enqueued = false;
  try {
    for (std::size_t k = 0; k < steps; ++k) {
      const std::size_t offset = k * per_step;
      enqueue_step(call, first + static_cast<std::uint32_t>(k), offset, std::min(per_step, c.count - offset), stream);
    }
    // The verdict of the descriptor exchange comes before completion: once the stream is through,
    // check() knows whether the operation was a mismatch.
    device_->wait_value(validated_, n, stream);
    // In issue order: an operation on another stream may finish first, and a later write of a
    // smaller number would take `done` back (the destructor then saw operations in flight).
    device_->wait_value(done_, n - 1, stream);
    device_->write_value(done_, n, stream);
  } catch (const Error& error) {
    fail(Error(error.code(), "ipc: operation " + std::to_string(n) + " half enqueued: " + error.what()));
    half_enqueued = true;
  }
  watchdog_->post(Operation{n, call, first, step_});
  // A failure while enqueuing is the call's own; one recorded meanwhile (a late rank, a peer's)
  // is raised by check() and the next call, as after any call that returned.
  if (half_enqueued) check();
}

void Ipc::enqueue_step(const DeviceCall& dc, std::uint32_t s, std::size_t offset, std::size_t count,
                       device::Stream stream) {
  const auto& c = dc.call;
  const std::size_t es = size_of(c.type);
  const auto p = static_cast<std::size_t>(size_);
  const auto r = static_cast<std::size_t>(rank_);
  const std::size_t at = offset * es, bytes = count * es;
  const auto* in = static_cast<const std::byte*>(c.send);
  auto* out = static_cast<std::byte*>(c.recv);
  std::byte* const own = staging_[r];
  const ReduceOp op = c.op && *c.op == ReduceOp::avg ? ReduceOp::sum : c.op.value_or(ReduceOp::sum);
  const bool average = c.op && *c.op == ReduceOp::avg;
  if (offset != 0) device_->write_value(flag(rank_, reached), s, stream);  // the first: enqueue wrote it
  pass(dc);                                                                // every rank's consumed[s - 1] is submitted
  auto slice = [&](std::size_t j) { return std::pair{count * j / p, count * (j + 1) / p}; };

  switch (c.collective) {
    case Collective::allreduce:
    case Collective::reduce: {
      wait_all(consumed, s - 1, stream, true);
      device_->copy(own, in + at, bytes, stream);
      device_->write_value(flag(rank_, ready), s, stream);
      pass(dc);
      wait_all(ready, s, stream, false);
      if (c.collective == Collective::allreduce && bytes <= one_shot_bytes) {
        // One shot: every rank reduces all of it from every staging, in rank order (the same
        // bits everywhere), so no rank waits for another's reduced slice: one meeting, not two.
        if (p == 1) device_->copy(out + at, own, bytes, stream);
        if (p > 1) device_->reduce(out + at, staging_[0], staging_[1], count, c.type, op, stream);
        for (std::size_t j = 2; j < p; ++j) device_->reduce(out + at, out + at, staging_[j], count, c.type, op, stream);
        if (average) device_->divide(out + at, count, c.type, size_, stream);
        pass(dc);
        break;
      }
      const auto [lo, hi] = slice(r);
      for (std::size_t j = 0; j < p; ++j)
        if (j != r) device_->reduce(own + lo * es, own + lo * es, staging_[j] + lo * es, hi - lo, c.type, op, stream);
      if (average) device_->divide(own + lo * es, hi - lo, c.type, size_, stream);
      device_->write_value(flag(rank_, reduced), s, stream);
      pass(dc);
      if (c.collective == Collective::allreduce || rank_ == c.root)
        for (std::size_t j = 0; j < p; ++j) {
          device_->wait_value(flag(static_cast<int>(j), reduced), s, stream);
          const auto [a, b] = slice(j);
          device_->copy(out + at + a * es, staging_[j] + a * es, (b - a) * es, stream);
        }
      break;
    }
    case Collective::broadcast: {
      std::byte* root = staging_[static_cast<std::size_t>(c.root)];
      if (rank_ == c.root) {
        wait_all(consumed, s - 1, stream, true);
        device_->copy(own, out + at, bytes, stream);
        device_->write_value(flag(rank_, ready), s, stream);
        pass(dc);
      } else {
        pass(dc);
        device_->wait_value(flag(c.root, ready), s, stream);
        device_->copy(out + at, root, bytes, stream);
      }
      pass(dc);
      break;
    }
    case Collective::allgather: {
      // Piece [at, at + bytes) of every block. In place as MPI_IN_PLACE (send == recv): this
      // rank's block is already at its place.
      const std::size_t block = c.count * es;
      const std::byte* input = in == out ? out + r * block : in;
      wait_all(consumed, s - 1, stream, true);
      device_->copy(own, input + at, bytes, stream);
      device_->write_value(flag(rank_, ready), s, stream);
      pass(dc);
      for (std::size_t j = 0; j < p; ++j) {
        if (j == r) {
          if (input != out + r * block) device_->copy(out + r * block + at, input + at, bytes, stream);
          continue;
        }
        device_->wait_value(flag(static_cast<int>(j), ready), s, stream);
        device_->copy(out + j * block + at, staging_[j], bytes, stream);
      }
      pass(dc);
      break;
    }
    case Collective::reduce_scatter: {
      // Piece [at, at + bytes) of every block: staged as p pieces side by side, piece j from block
      // j; this rank reduces piece r of every staging into its output. In place, the output
      // overlaps input that earlier steps staged already.
      const std::size_t block = c.count * es;
      wait_all(consumed, s - 1, stream, true);
      if (bytes == block) {
        device_->copy(own, in, p * block, stream);
      } else {
        for (std::size_t j = 0; j < p; ++j) device_->copy(own + j * bytes, in + j * block + at, bytes, stream);
      }
      device_->write_value(flag(rank_, ready), s, stream);
      pass(dc);
      wait_all(ready, s, stream, false);
      device_->copy(out + at, own + r * bytes, bytes, stream);
      for (std::size_t j = 0; j < p; ++j)
        if (j != r) device_->reduce(out + at, out + at, staging_[j] + r * bytes, count, c.type, op, stream);
      if (average) device_->divide(out + at, count, c.type, size_, stream);
      pass(dc);
      break;
    }
    default:
      throw Error(ErrorCode::unsupported, "ipc: " + std::string(to_string(c.collective)));
  }
  device_->write_value(flag(rank_, consumed), s, stream);
}

}  // namespace tutti::gpu::detail
