// Frames into a peer's queue, written at once from the posting thread where nothing is queued
// ahead, and the small frames of calls that run ahead held back to leave together (the timer that
// sends what is held when its window ends is read by the I/O thread, hub_io.cpp).
#include <sys/timerfd.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <string>

#include "core/env.hpp"
#include "transport/tcp/hub.hpp"

namespace tutti::transport::tcp {

namespace {

// Small calls that run ahead send a frame each, back to back; written one by one, each costs the
// sender a write and the kernel a packet, and a stream of them goes at the rate of that cost. A
// data frame of at most coalesce_payload bytes of a call that runs ahead (MessageKey::runs_ahead:
// nothing waits on it before the next call; in an exchange, where a frame answers the peer's, any
// wait would add to every round) to a peer written to within the window (coalesce_window_,
// TUTTI_TCP_COALESCE_US, 0: never) waits for more to leave with it, completed at once on a copy
// of its payload: until the window has passed since the first of them, coalesce_frames of them or
// coalesce_bytes, another frame that may not wait, or a caller that waits on the hub (it may wait
// for an answer to them), whichever comes first; the I/O thread writes them when the window ends
// (timer_fd_). A frame to a peer not written to within the window (the first of a burst, a lone
// call) leaves at once.
constexpr std::int64_t default_coalesce_us = 20;
constexpr std::size_t coalesce_payload = 1024;
constexpr std::size_t coalesce_frames = 16;  // what one sendmsg of flush_locked takes (64 pieces, 4 a frame)
constexpr std::size_t coalesce_bytes = 16 * 1024;

}  // namespace

std::int64_t coalesce_window_from_env() {
  const auto text = core::env("TUTTI_TCP_COALESCE_US");
  if (!text) return 1000 * default_coalesce_us;
  // A frame may wait that long for its peer: past a second it would be mistaken for a stall.
  constexpr long long max_us = 1'000'000;
  const long long us = core::parse_count(*text, "TUTTI_TCP_COALESCE_US");
  if (us > max_us)
    throw Error(ErrorCode::invalid_argument,
                "TUTTI_TCP_COALESCE_US: at most " + std::to_string(max_us) + " (one second), got " + *text);
  return 1000 * us;
}

void Hub::send_held() {
  if (corked_peers_.load() == 0) return;
  std::lock_guard lock(mutex_);
  uncork_locked(true, 0);
}

void Hub::enqueue_locked(int g, OutFrame frame) {
  Peer& peer = peers_[static_cast<std::size_t>(g)];
  if (peer.closed) return;  // the communicator is aborted already; the executor fails the operation
  frame.header.magic = frame_magic;
  frame.header.bytes = frame.bytes;
  const bool idle = peer.out.empty();
  if (idle || peer.corked) {
    const std::int64_t now = steady_ns();
    if (coalesces_locked(g, frame, now)) {
      peer.out.push_back(std::move(frame));
      ++peer.corked_frames;
      peer.corked_bytes += peer.out.back().bytes;
      if (peer.corked_frames >= coalesce_frames || peer.corked_bytes >= coalesce_bytes ||
          now - peer.corked_since >= coalesce_window_)
        flush_locked(g);
      return;
    }
  }
  peer.out.push_back(std::move(frame));
  // Write at once from the posting thread when nothing is queued ahead (or only frames held
  // back to leave with more): no hand-off to the I/O thread.
  if (idle || peer.corked) flush_locked(g);
}

bool Hub::coalesces_locked(int g, OutFrame& frame, std::int64_t now) {
  Peer& peer = peers_[static_cast<std::size_t>(g)];
  if (coalesce_window_ <= 0 || frame.header.kind != FrameKind::data || frame.bytes > coalesce_payload ||
      acked(frame.header.channel, frame.bytes) || stopping_ || peer.write_failed || !frame.may_wait ||
      (!peer.corked && now - peer.last_write >= coalesce_window_))
    return false;
  // The caller may reuse its buffer once the send completes: the frame keeps a copy.
  frame.owned = Bytes::make(frame.bytes);
  if (frame.bytes > 0) std::memcpy(frame.owned.data.get(), frame.payload, frame.bytes);
  frame.payload = frame.owned.data.get();
  if (frame.done != nullptr) {
    frame.done->set(Completion::done);
    frame.done = nullptr;
    ring();
  }
  if (!peer.corked) {
    peer.corked = true;
    ++corked_peers_;
    peer.corked_since = now;
    if (!timer_armed_) arm_timer_locked(coalesce_window_);
    // A parked I/O thread (a caller polled a moment ago) would not see the timer: it goes back to
    // the sockets, as it would once this caller's polling lease ran out.
    stop_polling();
  }
  return true;
}

void Hub::uncork_locked(bool all, std::int64_t now) {
  std::int64_t next = std::numeric_limits<std::int64_t>::max();
  for (int g = 0; g < size(); ++g) {
    Peer& peer = peers_[static_cast<std::size_t>(g)];
    if (!peer.corked) continue;
    if (all || now - peer.corked_since >= coalesce_window_)
      flush_locked(g);
    else
      next = std::min(next, peer.corked_since + coalesce_window_);
  }
  if (corked_peers_.load() > 0 && !timer_armed_) arm_timer_locked(std::max<std::int64_t>(next - now, 1000));
}

void Hub::arm_timer_locked(std::int64_t ns) {
  itimerspec when{};  // 0: disarmed
  when.it_value.tv_sec = static_cast<time_t>(ns / 1'000'000'000);
  when.it_value.tv_nsec = static_cast<long>(ns % 1'000'000'000);
  ::timerfd_settime(timer_fd_, 0, &when, nullptr);
  timer_armed_ = ns > 0;
}

}  // namespace tutti::transport::tcp
