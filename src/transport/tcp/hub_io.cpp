// The I/O side of the hub: the epoll thread, writev of each peer's queue as far as the socket
// allows, and connection loss. Reading a peer's stream into its frames is in hub_read.cpp; frames
// into a peer's queue, and the small ones held back to leave together, in hub_queue.cpp.
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/timerfd.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

#include "bootstrap/socket_io.hpp"
#include "core/env.hpp"
#include "core/log.hpp"
#include "transport/tcp/hub.hpp"

namespace tutti::transport::tcp {

namespace {

constexpr std::uint32_t wake_tag = 0xffffffffu;
constexpr std::uint32_t timer_tag = 0xfffffffeu;
constexpr auto flush_limit = std::chrono::seconds(5);  // how long shutdown waits for queued frames to leave
// How long a waiting caller's polling keeps the I/O thread off the sockets. A caller that returns
// and computes leaves its messages to the I/O thread again after this, at the latest.
constexpr auto polling_lease = std::chrono::milliseconds(1);

std::size_t max_unexpected_from_env() {
  const auto text = core::env("TUTTI_TCP_MAX_UNEXPECTED");
  if (!text) return std::size_t{1} << 30;
  return static_cast<std::size_t>(core::parse_count(*text, "TUTTI_TCP_MAX_UNEXPECTED"));
}

}  // namespace

Hub::Hub(int rank, int size, std::vector<Link> links)
    : rank_(rank),
      peers_(static_cast<std::size_t>(size)),
      max_unexpected_(max_unexpected_from_env()),
      coalesce_window_(coalesce_window_from_env()) {
  epoll_fd_ = ::epoll_create1(EPOLL_CLOEXEC);
  wake_fd_ = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  timer_fd_ = ::timerfd_create(CLOCK_MONOTONIC, TFD_CLOEXEC | TFD_NONBLOCK);
  if (epoll_fd_ < 0 || wake_fd_ < 0 || timer_fd_ < 0) {
    const std::string why = bootstrap::detail::errno_text(errno);
    for (const Link& link : links)
      if (link.fd >= 0) ::close(link.fd);
    for (int fd : {epoll_fd_, wake_fd_, timer_fd_})
      if (fd >= 0) ::close(fd);
    throw Error(ErrorCode::system, "tcp: epoll/eventfd/timerfd: " + why);
  }
  epoll_event event{};
  event.events = EPOLLIN;
  event.data.u32 = wake_tag;
  ::epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, wake_fd_, &event);
  event.data.u32 = timer_tag;
  ::epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, timer_fd_, &event);
  for (int g = 0; g < size; ++g) {
    Peer& peer = peers_[static_cast<std::size_t>(g)];
    const Link& link = links[static_cast<std::size_t>(g)];
    peer.fd = link.fd;
    if (peer.fd < 0) {
      peer.closed = true;  // this rank (or no connection): never read
      continue;
    }
    if (link.key) {
      peer.send_mac = std::make_unique<FrameMac>(*link.key, link.initiator);
      peer.receive_mac = std::make_unique<FrameMac>(*link.key, !link.initiator);
    }
    peer.in.buffer = std::make_unique_for_overwrite<std::byte[]>(Inbound::read_ahead);
    event.events = EPOLLIN;
    event.data.u32 = static_cast<std::uint32_t>(g);
    ::epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, peer.fd, &event);
  }
  thread_ = std::thread([this] { run(); });
}

Hub::~Hub() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
    stop_deadline_ = std::chrono::steady_clock::now() + flush_limit;
    for (int g = 0; g < size(); ++g) {
      if (peers_[static_cast<std::size_t>(g)].closed) continue;
      OutFrame bye;
      bye.header.kind = FrameKind::goodbye;
      enqueue_locked(g, std::move(bye));
    }
  }
  stop_thread();
  for (Peer& peer : peers_) {
    if (peer.closed) continue;
    // Half-close, then read what is already here: closing with unread data would reset the
    // connection, and the peer might lose our goodbye.
    ::shutdown(peer.fd, SHUT_WR);
    char sink[4096];
    for (int i = 0; i < 1024 && ::recv(peer.fd, sink, sizeof(sink), MSG_DONTWAIT) > 0; ++i) {
    }
    ::close(peer.fd);
  }
  ::close(epoll_fd_);
  ::close(wake_fd_);
  ::close(timer_fd_);
}

void Hub::stop_thread() {
  const std::uint64_t one = 1;
  [[maybe_unused]] const auto written = ::write(wake_fd_, &one, sizeof(one));
  stop_polling();
  if (thread_.joinable()) thread_.join();
}

void Hub::stop_polling() {
  polled_until_.store(0);
  if (!parked_.load()) return;  // seq_cst on both sides: a thread about to park sees the 0
  { std::lock_guard lock(park_mutex_); }
  park_cv_.notify_one();
}

void Hub::crash_for_testing() {
  {
    std::lock_guard lock(mutex_);
    crashed_ = true;
  }
  stop_thread();
  std::lock_guard lock(mutex_);
  for (Peer& peer : peers_) {
    if (peer.closed) continue;
    ::close(peer.fd);
    peer.closed = true;
    peer.out.clear();
  }
  for (auto& [id, state] : comms_)
    fail_comm_locked(*state, id, Failure{Error(ErrorCode::aborted, "tcp transport crashed (test hook)"), no_seq},
                     false);
}

bool Hub::closed_for_testing(int g) const {
  std::lock_guard lock(mutex_);
  return peers_.at(static_cast<std::size_t>(g)).closed;
}

std::uint64_t Hub::writes_for_testing() const {
  std::lock_guard lock(mutex_);
  return writes_;
}

void Hub::run() {
  epoll_event events[64];
  for (;;) {
    {
      std::lock_guard lock(mutex_);
      if (crashed_) return;
      if (stopping_) {
        const bool flushed = std::all_of(peers_.begin(), peers_.end(), [](const Peer& p) { return p.out.empty(); });
        if (flushed || std::chrono::steady_clock::now() >= stop_deadline_) return;
      }
    }
    const bool more = more_to_read();
    if (!more && polled_until_.load() > steady_ns()) {
      // A caller polls the sockets: off them until it stops (or its lease runs out).
      std::unique_lock lock(park_mutex_);
      parked_.store(true);
      for (std::int64_t until; (until = polled_until_.load()) > steady_ns();)
        park_cv_.wait_for(lock, std::chrono::nanoseconds(until - steady_ns()));
      parked_.store(false);
      continue;
    }
    const int n = ::epoll_wait(epoll_fd_, events, 64, more ? 0 : 50);
    if (more && !read_on()) return;
    for (int i = 0; i < n; ++i)
      if (events[i].data.u32 == wake_tag || events[i].data.u32 == timer_tag) {
        std::uint64_t count = 0;
        [[maybe_unused]] const auto got =
            ::read(events[i].data.u32 == wake_tag ? wake_fd_ : timer_fd_, &count, sizeof(count));
        if (events[i].data.u32 == wake_tag) continue;
        std::lock_guard lock(mutex_);
        if (crashed_) return;
        timer_armed_ = false;
        uncork_locked(false, steady_ns());
      }
    if (!dispatch(events, n)) return;
  }
}

bool Hub::dispatch(const epoll_event* events, int n) {
  for (int i = 0; i < n; ++i) {
    if (events[i].data.u32 == wake_tag || events[i].data.u32 == timer_tag) continue;
    const int g = static_cast<int>(events[i].data.u32);
    std::lock_guard lock(mutex_);
    if (crashed_) return false;
    if (peers_[static_cast<std::size_t>(g)].closed) continue;
    if (events[i].events & (EPOLLIN | EPOLLHUP | EPOLLERR)) handle_peer_locked(g);
    if (!peers_[static_cast<std::size_t>(g)].closed && (events[i].events & EPOLLOUT)) handle_peer_locked(g, true);
  }
  return true;
}

bool Hub::more_to_read() const {
  std::lock_guard lock(mutex_);
  return std::any_of(peers_.begin(), peers_.end(), [](const Peer& p) { return p.more && !p.closed; });
}

bool Hub::read_on() {
  for (int g = 0; g < size(); ++g) {
    std::lock_guard lock(mutex_);
    if (crashed_) return false;
    const Peer& peer = peers_[static_cast<std::size_t>(g)];
    if (peer.more && !peer.closed) handle_peer_locked(g);
  }
  return true;
}

void Hub::poll() {
  send_held();  // what this caller waits for may answer frames held back: they go now
  polled_until_.store(steady_ns() + std::chrono::nanoseconds(polling_lease).count());
  epoll_event events[64];
  const int n = ::epoll_wait(epoll_fd_, events, 64, 0);
  // Level-triggered: the I/O thread may see these events too, and finds the sockets drained (the
  // wake-up eventfd is its own to read).
  if (n > 0 && !dispatch(events, n)) return;
  // A peer whose turn ran out of budget may have the rest in the read-ahead buffer, which wakes no
  // epoll: read on here, as the I/O thread would, since it stays off the sockets while this polls.
  if (more_to_read()) read_on();
}

// Nothing a peer sends may end the I/O thread: whatever goes wrong with its frames (an
// allocation, a bug) fails that peer, by name, and the I/O of the others goes on.
void Hub::handle_peer_locked(int g, bool write) {
  try {
    if (write)
      flush_locked(g);
    else
      read_peer_locked(g);
  } catch (const std::exception& e) {
    try {
      drop_peer_locked(g, std::string("error while handling its frames: ") + e.what(), "handling frames from rank ",
                       std::string(" failed: ") + e.what());
    } catch (...) {
      close_peer_locked(g);
    }
  }
}

namespace {

// Whether the frame goes compact (wire.hpp): one tag for header and payload, on a tagged
// connection. Every frame of at most max_compact_payload bytes does, so a tagged frame that does
// not has a payload, and two tags.
bool compact(const Peer& peer, const OutFrame& frame) {
  return peer.send_mac != nullptr && frame.bytes <= max_compact_payload;
}

}  // namespace

std::size_t Hub::wire_bytes(const Peer& peer, const OutFrame& frame) const {
  const std::size_t tags = !peer.send_mac ? 0 : compact(peer, frame) ? tag_size : 2 * tag_size;
  return sizeof(FrameHeader) + frame.bytes + tags;
}

// Fixes the frame's number in this direction and computes its tags. Done when the frame is first
// handed to the socket, so a frame withdrawn before that never leaves a gap in the numbering.
void Hub::seal_locked(Peer& peer, OutFrame& frame) {
  frame.sealed = true;
  if (!peer.send_mac) return;
  const std::uint64_t number = peer.frames_sent++;
  if (compact(peer, frame)) {
    frame.header.flags |= frame_compact;
    FrameMac& mac = *peer.send_mac;
    mac.begin(number, FrameMac::Part::compact);
    mac.update(&frame.header, sizeof(FrameHeader));
    mac.update(frame.payload, frame.bytes);
    frame.header_tag = mac.finish();
    return;
  }
  frame.header_tag = peer.send_mac->tag(number, FrameMac::Part::header, &frame.header, sizeof(FrameHeader));
  frame.payload_tag = peer.send_mac->tag(number, FrameMac::Part::payload, frame.payload, frame.bytes);
}

void Hub::flush_locked(int g) {
  Peer& peer = peers_[static_cast<std::size_t>(g)];
  constexpr std::size_t max_iov = 64;
  const bool tagged = peer.send_mac != nullptr;
  if (peer.corked) {
    peer.corked = false;
    peer.corked_frames = peer.corked_bytes = 0;
    // The last held-back frames leave: the timer would only wake the I/O thread for nothing.
    if (--corked_peers_ == 0 && timer_armed_) arm_timer_locked(0);
  }
  if (peer.write_failed) return;
  while (!peer.out.empty()) {
    iovec iov[max_iov];
    std::size_t count = 0;
    for (auto it = peer.out.begin(); it != peer.out.end() && count + 4 <= max_iov; ++it) {
      if (!it->sealed) seal_locked(peer, *it);
      // The frame on the wire: header, its tag, payload, its tag (tags only when tagged);
      // compact: header, payload, the one tag.
      const bool one_tag = compact(peer, *it);
      const iovec pieces[4] = {
          {&it->header, sizeof(FrameHeader)},
          {it->header_tag.data(), tagged && !one_tag ? tag_size : 0},
          {const_cast<std::byte*>(it->payload), it->bytes},
          {one_tag ? it->header_tag.data() : it->payload_tag.data(), tagged ? tag_size : 0},
      };
      std::size_t skip = it == peer.out.begin() ? it->written : 0;
      for (const iovec& piece : pieces) {
        if (skip >= piece.iov_len) {
          skip -= piece.iov_len;
          continue;
        }
        iov[count++] = {static_cast<std::byte*>(piece.iov_base) + skip, piece.iov_len - skip};
        skip = 0;
      }
    }
    msghdr message{};
    message.msg_iov = iov;
    message.msg_iovlen = count;
    const ssize_t sent = ::sendmsg(peer.fd, &message, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (sent < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        set_write_armed_locked(g, true);
        return;
      }
      // The peer may have gone after telling why (an abort, a goodbye): read that first, so
      // that its own words, not the broken pipe, decide what this rank reports.
      peer.write_failed = true;
      peer.write_error = bootstrap::detail::errno_text(errno);
      if (!peer.reading) read_peer_locked(g);  // else the read under way finishes the job
      return;
    }
    ++writes_;
    peer.last_write = steady_ns();
    after_write_locked(g, static_cast<std::size_t>(sent));
  }
  set_write_armed_locked(g, false);
}

void Hub::after_write_locked(int g, std::size_t written) {
  Peer& peer = peers_[static_cast<std::size_t>(g)];
  bool completed = false;
  while (!peer.out.empty()) {
    OutFrame& frame = peer.out.front();
    const std::size_t total = wire_bytes(peer, frame);
    const std::size_t take = std::min(written, total - frame.written);
    frame.written += take;
    written -= take;
    if (frame.written < total) break;
    if (frame.done != nullptr) {
      if (acked(frame.header.channel, frame.bytes)) {
        // Complete when the receiver matches it (ack), so that a size disagreement fails both sides.
        awaiting_ack_[{frame.header.comm_id, g, frame.header.channel, frame.header.seq, frame.header.index}] =
            frame.done;
      } else {
        frame.done->set(Completion::done);
        completed = true;
      }
    }
    peer.out.pop_front();
  }
  if (completed) ring();
}

void Hub::set_write_armed_locked(int g, bool armed) {
  Peer& peer = peers_[static_cast<std::size_t>(g)];
  if (peer.write_armed == armed || peer.closed) return;
  epoll_event event{};
  event.events = EPOLLIN | (armed ? EPOLLOUT : 0u);
  event.data.u32 = static_cast<std::uint32_t>(g);
  ::epoll_ctl(epoll_fd_, EPOLL_CTL_MOD, peer.fd, &event);
  peer.write_armed = armed;
}

// Closes the connection; no buffer of a queued send or of a receive is touched again.
void Hub::close_peer_locked(int g) {
  Peer& peer = peers_[static_cast<std::size_t>(g)];
  if (peer.closed) return;
  ::epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, peer.fd, nullptr);
  ::close(peer.fd);
  peer.closed = true;
  peer.out.clear();
  if (peer.corked) {  // its held-back frames go with the rest
    peer.corked = false;
    --corked_peers_;
  }
  peer.in.stage = Inbound::Stage::header;
  peer.in.sink = Inbound::Sink::drain;
  peer.in.done = nullptr;
  peer.in.heap = Bytes{};
  release_locked(g, peer.in.charged);
  peer.in.charged = 0;
}

void Hub::peer_lost_locked(int g, const std::string& why) {
  Peer& peer = peers_[static_cast<std::size_t>(g)];
  if (peer.closed) return;
  if (stopping_) {
    close_peer_locked(g);
    return;
  }
  if (peer.departed) {  // orderly: the peer said goodbye first
    close_peer_locked(g);
    for (auto& [id, state] : comms_)
      if (state->rank_of.count(g)) peer_left_locked(*state, id, g);
    return;
  }
  drop_peer_locked(g, "connection lost (" + why + ")", "rank ", " closed its connection (died?)");
}

void Hub::drop_peer_locked(int g, const std::string& log_text, const std::string& before, const std::string& after) {
  if (peers_[static_cast<std::size_t>(g)].closed) return;
  close_peer_locked(g);
  if (stopping_) return;
  dead_[g] = {before, after};
  core::log(core::LogLevel::warn, rank_, "tcp: rank " + std::to_string(g) + ": " + log_text);
  for (auto& [id, state] : comms_) {
    auto it = state->rank_of.find(g);
    if (it == state->rank_of.end()) continue;
    std::string text = before + std::to_string(it->second) + after;
    if (it->second != g) text += " [rank " + std::to_string(g) + " of the root communicator]";
    const std::uint64_t seq = state->announced.last().value_or(no_seq);
    fail_comm_locked(*state, id, Failure{Error(ErrorCode::peer_failure, text), seq}, true);
  }
}

void Hub::wait(std::uint64_t seen, std::chrono::steady_clock::time_point deadline) {
  for (int i = 0; i < 64; ++i) {
    if (generation() != seen) return;
    poll();
    if (generation() != seen) return;
    std::this_thread::yield();
  }
  stop_polling();  // this thread sleeps: the I/O thread takes the sockets back at once
  sleepers_.fetch_add(1);
  {
    std::unique_lock lock(bell_mutex_);
    bell_cv_.wait_until(lock, deadline, [&] { return generation_.load() != seen; });
  }
  sleepers_.fetch_sub(1);
}

// Most rings find nobody asleep and no bell (a caller polling for its own message): then they
// only advance the generation. A sleeper counts itself before it checks the generation under
// the lock, and a ring advances the generation before it counts the sleepers (both sequentially
// consistent), so that either the sleeper sees the new generation or the ring sees the sleeper
// and wakes it under the lock.
void Hub::ring() {
  generation_.fetch_add(1);
  if (sleepers_.load() == 0 && !has_bells_.load()) return;
  {
    std::lock_guard lock(bell_mutex_);
    for (const auto& bell : bells_) bell.second();
  }
  bell_cv_.notify_all();
}

void Hub::add_bell(const void* owner, std::function<void()> bell) {
  std::lock_guard lock(bell_mutex_);
  bells_.emplace_back(owner, std::move(bell));
  has_bells_.store(true);
}

void Hub::remove_bell(const void* owner) {
  std::lock_guard lock(bell_mutex_);
  std::erase_if(bells_, [owner](const auto& bell) { return bell.first == owner; });
  has_bells_.store(!bells_.empty());
}

}  // namespace tutti::transport::tcp
