// The connections of one rank and the I/O thread that drives them, shared by a root TCP
// transport and every communicator split from it (frames carry their communicator's id; the
// I/O thread demultiplexes). All state is guarded by one mutex, taken by the executor's calls
// (post_*, cancel, announce, abort) and by the I/O thread; socket reads and writes into users'
// buffers happen under it too, so that once `cancel` returns no thread touches the buffer.
// The I/O thread never calls user code: it sets Completions and rings the doorbell.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "bootstrap/auth.hpp"
#include "bootstrap/frame_mac.hpp"
#include "transport/matching.hpp"
#include "transport/tcp/wire.hpp"
#include "transport/transport.hpp"

struct epoll_event;

namespace tutti::transport::tcp {

using bootstrap::FrameMac;
using bootstrap::Tag;
using bootstrap::tag_size;

/// Heap bytes without zero-initialization (unexpected messages can be large).
struct Bytes {
  std::unique_ptr<std::byte[]> data;
  std::size_t size = 0;
  std::size_t room = 0;  // when nonzero, `data` holds this many bytes (whatever `size`): the hub may keep it for reuse
  static Bytes make(std::size_t size) { return {std::make_unique_for_overwrite<std::byte[]>(size ? size : 1), size}; }
};

/// One frame waiting to be written to a peer.
struct OutFrame {
  FrameHeader header;
  const std::byte* payload = nullptr;
  std::size_t bytes = 0;
  Bytes owned;                 // the payload when the frame owns it (control frames, detached sends)
  std::size_t written = 0;     // of header + payload
  Completion* done = nullptr;  // a data send whose buffer the executor still owns
  bool sealed = false;         // its frame number and tags are fixed: it must be written, in order
  bool may_wait = false;       // a send of a call that runs ahead (MessageKey::runs_ahead)
  Tag header_tag{}, payload_tag{};
};

/// Where the payload of the frame being read goes.
struct Inbound {
  // user: copy into the receive's buffer; reduce: combine into it as whole elements arrive.
  enum class Sink { user, reduce, heap, drain };
  // header: waiting for a header (and its tag); payload: streaming the payload into its sink;
  // trailer: waiting for the payload's tag, without which the frame does not complete.
  enum class Stage { header, payload, trailer };
  static constexpr std::size_t read_ahead = 256 * 1024;  // bytes of one peer's stream read at a time
  std::unique_ptr<std::byte[]> buffer;                   // bytes read ahead of the current frame (read_ahead of them)
  std::size_t begin = 0, end = 0;
  Stage stage = Stage::header;
  // A read of this turn returned less than it asked for: the socket held no more then, so the
  // turn ends without a read that would only fail with EAGAIN (epoll is level-triggered: bytes
  // that arrive later wake the next turn).
  bool drained = false;
  // The last frame's payload was large (at least direct_read bytes): the next header is read
  // alone, and a large payload's reads stop at its end, so that a large payload is read straight
  // into its sink rather than through `buffer` and a copy.
  bool large = false;
  FrameHeader header;
  std::uint64_t number = 0;  // of the current frame, in this direction
  bool compact = false;      // the current frame was compact: verified whole before it was acted on
  std::size_t remaining = 0;
  Sink sink = Sink::drain;
  std::byte* target = nullptr;         // next byte of the user's buffer or of `heap`
  const std::byte* operand = nullptr;  // sink == reduce: next byte of the operand
  DataType type = DataType::u8;
  ReduceOp op = ReduceOp::sum;
  Bytes heap;
  std::size_t charged = 0;     // sink heap, data: what `heap` counts in the peer's `held`
  Completion* done = nullptr;  // sink user or reduce: the receive being filled
};

/// A connection as tcp::connect hands it over: without a key (insecure mode) frames carry no tags.
struct Link {
  int fd = -1;
  bool initiator = false;  // this rank dialed it
  std::optional<bootstrap::SessionKey> key;
};

struct Peer {
  int fd = -1;
  bool closed = false;    // the connection is gone (fd closed)
  bool departed = false;  // said goodbye: its end of the connection is orderly
  bool write_armed = false;
  bool reading = false;       // the I/O thread is parsing its frames (no nested reads)
  bool more = false;          // its read budget ran out: read on without waiting for epoll
  bool write_failed = false;  // its socket refused a write: read what it sent before it went
  std::string write_error;
  std::deque<OutFrame> out;
  Inbound in;
  std::unique_ptr<FrameMac> send_mac, receive_mac;  // null in insecure mode
  std::uint64_t frames_sent = 0, frames_received = 0;
  std::size_t held = 0;  // bytes its frames make this rank keep: unexpected messages, early signatures
  // Small data frames held back to leave together (see Hub::coalesces_locked): `out` holds only
  // those while corked.
  bool corked = false;
  std::int64_t corked_since = 0;  // steady clock, ns
  std::size_t corked_frames = 0, corked_bytes = 0;
  std::int64_t last_write = 0;  // steady clock, ns: the last write to its socket that succeeded
};

/// A posted receive; with `operand`, a receive-and-reduce: data = operand op incoming.
struct PostedRecv {
  void* data = nullptr;
  std::size_t bytes = 0;
  Completion* done = nullptr;
  const void* operand = nullptr;
  DataType type = DataType::u8;
  ReduceOp op = ReduceOp::sum;
  /// Lands a complete message of `bytes` bytes from `incoming`.
  void land(const void* incoming) const;
};
struct SelfSend {
  const void* data = nullptr;
  std::size_t bytes = 0;
  Completion* done = nullptr;
};

/// This rank's signatures of its last `slots` collectives on one communicator, by sequence
/// number (a newer one takes an older one's slot): fixed storage, no allocation per call.
class Announced {
 public:
  static constexpr std::size_t slots = 1024;
  void add(std::uint64_t seq, const WireSignature& signature) {
    if (slots_.empty()) slots_.resize(slots);
    slots_[seq % slots] = {seq, signature, true};
    if (!last_ || seq > *last_) last_ = seq;
  }
  const WireSignature* find(std::uint64_t seq) const {
    if (slots_.empty()) return nullptr;
    const Slot& slot = slots_[seq % slots];
    return slot.used && slot.seq == seq ? &slot.signature : nullptr;
  }
  std::optional<std::uint64_t> last() const { return last_; }

 private:
  struct Slot {
    std::uint64_t seq = 0;
    WireSignature signature{};
    bool used = false;
  };
  std::vector<Slot> slots_;
  std::optional<std::uint64_t> last_;
};

/// One communicator's matching state on this rank. Created when this rank joins it, or earlier
/// when a frame for it arrives first (then `members` stays empty until the join).
struct CommState {
  std::vector<int> members;              // global rank of each rank
  std::unordered_map<int, int> rank_of;  // global rank -> rank in this communicator
  int rank = -1;
  // By sender's global rank and key (MatchKey::comm stays 0: one table per communicator).
  MatchTable<PostedRecv> posted;
  MatchTable<Bytes> unexpected;
  MatchTable<SelfSend> self_sends;
  Announced announced;  // this rank's, by seq
  using Unchecked = std::multimap<std::uint64_t, std::pair<int, WireSignature>>;
  Unchecked unchecked;  // senders', before announce (one per sender)
  SpareNodes<Unchecked> unchecked_spares;
  std::set<int> left;  // global ranks that left this communicator (leave frame or goodbye)
  std::optional<Failure> failure;
  std::atomic<bool> has_failure{false};
  bool joined() const { return rank >= 0; }
};

// What a peer's frames may make this rank keep, counted against TUTTI_TCP_MAX_UNEXPECTED: an
// unexpected message costs its bytes plus its bookkeeping, an early signature its bookkeeping.
constexpr std::size_t message_overhead = 256;
constexpr std::size_t signature_overhead = 128;

// An unexpected message of at most this many bytes is kept in a buffer of this size, which the
// hub reuses for the next once it was delivered (no allocation per small message).
constexpr std::size_t small_message_bytes = 256;
// What an unexpected message of `bytes` bytes makes this rank hold.
inline std::size_t charge_of_message(std::size_t bytes) {
  return std::max(bytes, small_message_bytes) + message_overhead;
}
inline std::size_t charge_of(const Bytes& message) { return charge_of_message(message.size); }

// The message a frame from global rank `g` carries (its channel was checked by check_header).
inline MatchKey frame_key(int g, const FrameHeader& h) {
  return MatchKey{g, static_cast<Channel>(h.channel), h.seq, h.index};
}

/// The steady clock in nanoseconds (the hub's deadlines and windows).
inline std::int64_t steady_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

/// TUTTI_TCP_COALESCE_US in nanoseconds (how long small frames of calls that run ahead wait for
/// more, hub_queue.cpp); throws invalid_argument past a second.
std::int64_t coalesce_window_from_env();

class Hub {
 public:
  /// Takes the connections `links` (indexed by global rank; fd -1 for this rank) and starts the I/O thread.
  Hub(int rank, int size, std::vector<Link> links);
  /// Orderly shutdown: goodbye to every peer, flush (bounded), stop the thread, close.
  ~Hub();
  Hub(const Hub&) = delete;
  Hub& operator=(const Hub&) = delete;

  int rank() const { return rank_; }
  int size() const { return static_cast<int>(peers_.size()); }

  /// Registers this rank as rank `rank` of communicator `id` over global ranks `members`;
  /// returns its state (valid until leave).
  CommState* join(std::uint64_t id, const std::vector<int>& members, int rank);
  void leave(std::uint64_t id);

  void announce(std::uint64_t id, const Signature& signature);
  /// A notice frame to `peer` of communicator `id` with this rank's signature of call `seq`.
  void notify_signature(std::uint64_t id, int peer, std::uint64_t seq);
  void post_send(std::uint64_t id, int peer, const MessageKey& key, const void* data, std::size_t bytes,
                 Completion* done);
  /// A receive (recv.operand == nullptr) or a receive-and-reduce.
  void post_recv(std::uint64_t id, int peer, const MessageKey& key, const PostedRecv& recv);
  void cancel(std::uint64_t id, Completion* done);
  /// Transport::withdraw_recv: false once its message is being read into its buffer.
  bool withdraw_recv(std::uint64_t id, Completion* done);
  std::optional<Failure> failure(const CommState& state) const;
  void abort(std::uint64_t id, const Error& error, std::uint64_t seq);

  std::uint64_t generation() const { return generation_.load(std::memory_order_acquire); }
  /// Spins for a moment, polling the sockets from this thread, then sleeps until the generation
  /// differs from `seen` or the deadline.
  void wait(std::uint64_t seen, std::chrono::steady_clock::time_point deadline);
  /// Handles what the sockets hold now from the calling thread, without blocking: a waiting
  /// caller completes an arrived message itself instead of waiting for the I/O thread to wake
  /// (one thread hand-off less on every message). The I/O thread stays off the sockets for a
  /// moment after each call (it would only wake to find them drained), or until stop_polling().
  void poll();
  /// The caller polls no more (it goes to sleep): the I/O thread takes the sockets back at once.
  void stop_polling();
  void ring();
  /// Has `bell` called each time this hub rings (a completion, an abort, a wake) until
  /// remove_bell(owner), so that a transport whose ranks sleep elsewhere (routed: on a shared-
  /// memory doorbell) learns of this hub's completions. `bell` runs on any thread with the
  /// doorbell's lock held: it must be quick and must not call the hub.
  void add_bell(const void* owner, std::function<void()> bell);
  /// Returns once `owner`'s bell is neither running nor will run again.
  void remove_bell(const void* owner);

  /// Tests only: drops every connection at once, without goodbye, as a killed process would.
  void crash_for_testing();
  /// Tests only: whether the connection to global rank `g` is closed (its end was handled).
  bool closed_for_testing(int g) const;
  /// Tests only: the writes to all sockets that succeeded so far (each sendmsg).
  std::uint64_t writes_for_testing() const;

 private:
  // I/O thread, writes and connection loss (hub_io.cpp).
  void run();
  /// Handles `n` events of epoll_wait (the wake-up eventfd's excepted). False once crashed.
  bool dispatch(const epoll_event* events, int n);
  /// Whether a peer's last turn ran out of read budget (Peer::more), and reading on from those.
  /// read_on is false once crashed.
  bool more_to_read() const;
  bool read_on();
  void handle_peer_locked(int g, bool write = false);
  void flush_locked(int g);
  void after_write_locked(int g, std::size_t written);
  void set_write_armed_locked(int g, bool armed);
  void peer_lost_locked(int g, const std::string& why);
  void drop_peer_locked(int g, const std::string& log_text, const std::string& before, const std::string& after);
  void close_peer_locked(int g);
  void enqueue_locked(int g, OutFrame frame);
  /// Whether `frame` waits for more to leave with it, completed at once on a copy of its payload
  /// (what may, and for how long: hub_io.cpp). Arms the timer for the first.
  bool coalesces_locked(int g, OutFrame& frame, std::int64_t now);
  /// Writes the queues of the corked peers: all of them, or those corked for the window by `now`
  /// (then the timer is armed again for the rest).
  void uncork_locked(bool all, std::int64_t now);
  /// uncork_locked(true) where some peer is corked (poll: a waiting caller).
  void send_held();
  /// timer_fd_ fires `ns` from now (0: never).
  void arm_timer_locked(std::int64_t ns);
  void seal_locked(Peer& peer, OutFrame& frame);
  std::size_t wire_bytes(const Peer& peer, const OutFrame& frame) const;
  void stop_thread();

  // Reading a peer's stream (hub_read.cpp).
  void read_peer_locked(int g);
  void read_frames_locked(int g);
  bool fill_locked(int g, std::size_t upto = Inbound::read_ahead);
  bool header_ready_locked(int g);
  bool compact_ready_locked(int g);
  void payload_done_locked(int g);

  // Frames as they arrive, and what they make this rank hold (hub_frames.cpp).
  CommState* frame_comm_locked(int g, std::uint64_t id);
  // `what` names the charge; it is only called (a string built) when the charge is refused.
  template <class What>
  bool charge_locked(int g, std::size_t bytes, const What& what) {
    Peer& peer = peers_[static_cast<std::size_t>(g)];
    if (bytes <= max_unexpected_ && peer.held <= max_unexpected_ - bytes) {
      peer.held += bytes;
      return true;
    }
    refuse_charge_locked(g, what());
    return false;
  }
  void refuse_charge_locked(int g, const std::string& what);
  /// Room for an unexpected message of `size` bytes: one of the kept small buffers where it fits.
  Bytes message_bytes_locked(std::size_t size);
  /// Keeps a message's small buffer for the next (the rest are freed).
  void recycle_locked(Bytes&& bytes);
  void release_locked(int g, std::size_t bytes);
  std::string check_header(const FrameHeader& h) const;
  bool start_frame_locked(int g);
  bool start_data_locked(int g);
  void finish_frame_locked(int g);
  bool check_signature_locked(CommState& c, std::uint64_t id, int g, std::uint64_t seq, const WireSignature& theirs);

  // Posting, matching and failures (hub_match.cpp).
  CommState& comm_locked(std::uint64_t id);
  void peer_left_locked(CommState& c, std::uint64_t id, int g);
  bool fail_if_left_locked(CommState& c, std::uint64_t id, int g, const MatchKey& key, bool is_send);
  std::string operation_name(const CommState& c, const MatchKey& key, bool is_send) const;
  void report_mismatch_locked(CommState& c, std::uint64_t id, int g, const WireSignature& theirs,
                              const WireSignature& mine);
  /// Lands a message that was kept until its receive was posted, then keeps its buffer for reuse.
  void match_buffered_locked(CommState& c, std::uint64_t id, int g, const MatchKey& key, Bytes&& message,
                             const PostedRecv& recv);
  void size_mismatch_locked(CommState& c, std::uint64_t id, int g, const MatchKey& key, std::size_t sent,
                            const PostedRecv& recv);
  void fail_send_locked(std::uint64_t id, int g, const FrameHeader& header, const std::string& text);
  void fail_comm_locked(CommState& c, std::uint64_t id, const Failure& failure, bool broadcast);
  void send_control_locked(int g, FrameKind kind, std::uint64_t id, const MatchKey& about, std::string text,
                           std::uint32_t code = 0);
  void self_send_locked(CommState& c, const MatchKey& key, const void* data, std::size_t bytes, Completion* done);

  const int rank_;
  mutable std::mutex mutex_;
  std::vector<Peer> peers_;
  std::unordered_map<std::uint64_t, std::unique_ptr<CommState>> comms_;
  // Point-to-point sends written but not yet matched by the receiver: (comm, peer, channel, seq, index).
  std::map<std::tuple<std::uint64_t, int, std::uint8_t, std::uint64_t, std::uint32_t>, Completion*> awaiting_ack_;
  // Global ranks whose connection failed, with the failure's text around the rank's number.
  std::map<int, std::pair<std::string, std::string>> dead_;
  // Communicators this rank left, so that a late frame for one does not bring it back (bounded).
  std::set<std::uint64_t> left_ids_;
  std::deque<std::uint64_t> left_order_;
  const std::size_t max_unexpected_;    // TUTTI_TCP_MAX_UNEXPECTED: bytes held per peer
  const std::int64_t coalesce_window_;  // ns, TUTTI_TCP_COALESCE_US (see coalesces_locked)
  // Buffers of small unexpected messages that were delivered, kept for the next (a message that
  // arrives before its receive is the common case of a small call: it then allocates nothing).
  static constexpr std::size_t small_kept = 64;
  std::vector<std::unique_ptr<std::byte[]>> small_buffers_;
  // Likewise the buffers of those of 64 KiB or more, up to large_kept_each bytes each and large_kept_bytes in
  // all: a pipelined collective whose peer runs ahead sends chunks before their receives are
  // posted, call after call, and fresh memory for each would cost a page fault per 4 KiB.
  static constexpr std::size_t large_kept_each = std::size_t{1} << 20;
  static constexpr std::size_t large_kept_bytes = std::size_t{8} << 20;
  std::vector<std::pair<std::unique_ptr<std::byte[]>, std::size_t>> large_buffers_;  // with their room
  std::size_t large_buffers_bytes_ = 0;
  bool stopping_ = false;
  bool crashed_ = false;
  std::chrono::steady_clock::time_point stop_deadline_;

  int epoll_fd_ = -1;
  int wake_fd_ = -1;
  int timer_fd_ = -1;         // fires when the first corked peer's frames are due (the I/O thread writes them)
  bool timer_armed_ = false;  // under mutex_
  // Peers whose frames are held back (changed under mutex_; a waiting caller reads it without).
  std::atomic<int> corked_peers_{0};
  std::uint64_t writes_ = 0;  // under mutex_: sendmsg calls that succeeded (tests)
  std::thread thread_;
  // While a caller waits it polls the sockets itself (poll()), and the I/O thread stays off them
  // until the time below (steady clock, ns): a message then costs no wake-up of the I/O thread and
  // no hand-off to the caller. A caller that stops polling to sleep sets it to 0 and wakes the
  // I/O thread (park_cv_) if it is parked (stop_polling); otherwise the I/O thread returns by
  // itself then.
  std::atomic<std::int64_t> polled_until_{0};
  std::atomic<bool> parked_{false};
  std::mutex park_mutex_;
  std::condition_variable park_cv_;

  std::mutex bell_mutex_;
  std::condition_variable bell_cv_;
  std::atomic<std::uint64_t> generation_{0};
  std::atomic<int> sleepers_{0};  // threads in wait() asleep on bell_cv_, or about to be
  std::atomic<bool> has_bells_{false};
  std::vector<std::pair<const void*, std::function<void()>>> bells_;  // under bell_mutex_
};

}  // namespace tutti::transport::tcp
