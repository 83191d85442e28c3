// The TCP store client. One connection serves every thread that uses the Store: requests carry
// an id, and whichever waiting thread finds no one reading becomes the reader and hands each
// reply to its owner. So a thread blocked in get() never stops another thread's set() — the
// set that get() may be waiting for.
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <condition_variable>
#include <map>
#include <mutex>
#include <optional>
#include <random>
#include <thread>

#include "bootstrap/auth.hpp"
#include "bootstrap/socket_io.hpp"
#include "bootstrap/store_backends.hpp"
#include "bootstrap/tcp_store_protocol.hpp"
#include "core/env.hpp"
#include "tutti/types.hpp"

namespace tutti::bootstrap::detail {
namespace {

// One nonblocking connect attempt to each address of host:port; the connected fd, or -1 with
// the last error in *why.
int try_connect(const std::string& host, int port, Clock::time_point deadline, std::string* why) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* list = nullptr;
  const int resolved = ::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &list);
  if (resolved != 0) {
    *why = std::string("cannot resolve host: ") + ::gai_strerror(resolved);
    return -1;
  }
  int connected = -1;
  for (addrinfo* at = list; at != nullptr && connected < 0; at = at->ai_next) {
    const int fd = ::socket(at->ai_family, at->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, at->ai_protocol);
    if (fd < 0) {
      *why = "socket: " + errno_text(errno);
      continue;
    }
    int error = 0;
    if (::connect(fd, at->ai_addr, at->ai_addrlen) != 0) {
      error = errno;
      if (error == EINPROGRESS && wait_fd(fd, POLLOUT, deadline, why) > 0) {
        socklen_t size = sizeof(error);
        if (::getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &size) != 0) error = errno;
      } else if (error == EINPROGRESS) {
        error = ETIMEDOUT;
      }
    }
    if (error == 0) {
      connected = fd;
    } else {
      *why = "connect: " + errno_text(error);
      ::close(fd);
    }
  }
  ::freeaddrinfo(list);
  return connected;
}

class TcpStore final : public Store {
 public:
  /// With a token, frames are tagged under `session` (this side is the initiator).
  TcpStore(std::string url, int fd, const std::optional<SessionKey>& session) : url_(std::move(url)), fd_(fd) {
    if (session) {
      send_seal_ = StoreSeal(*session, true);
      receive_seal_ = StoreSeal(*session, false);
    }
  }
  ~TcpStore() override { ::close(fd_); }
  TcpStore(const TcpStore&) = delete;
  TcpStore& operator=(const TcpStore&) = delete;

  void set(const std::string& key, const std::string& value) override {
    const auto timeout = core::default_timeout();
    call('S', key, value, Clock::now() + timeout, timeout);
  }

  std::string get(const std::string& key, std::chrono::milliseconds timeout) override {
    return call('G', key, "", Clock::now() + timeout, timeout);
  }

  std::int64_t add(const std::string& key, std::int64_t delta) override {
    const auto timeout = core::default_timeout();
    const std::string reply = call('A', key, encode_i64(delta), Clock::now() + timeout, timeout);
    const auto value = decode_i64(reply);
    if (!value) throw Error(ErrorCode::system, "store: " + url_ + ": malformed reply to add '" + key + "'");
    return *value;
  }

 private:
  // Sends one request and waits for its reply: the reply's payload, or an Error.
  std::string call(char op, const std::string& key, const std::string& payload, Clock::time_point deadline,
                   std::chrono::milliseconds timeout) {
    std::unique_lock lock(mutex_);
    if (broken_) throw Error(ErrorCode::system, "store: " + url_ + ": " + broken_why_);
    const std::uint32_t id = next_id_++;
    replies_[id] = std::nullopt;
    std::string frame = encode_message({id, op, key, payload}, true);
    seal_frame(frame, send_seal_);
    std::string why;
    // Under the lock so frames of different threads never interleave on the socket.
    if (!send_all(fd_, frame.data(), frame.size(), deadline, &why)) mark_broken("sending a request: " + why);
    for (;;) {
      auto slot = replies_.find(id);
      if (slot->second) {
        StoreMessage reply = std::move(*slot->second);
        replies_.erase(slot);
        if (reply.kind == 'O') return reply.payload;
        throw Error(ErrorCode::invalid_argument, reply.payload);
      }
      if (broken_) {
        replies_.erase(slot);
        throw Error(ErrorCode::system, "store: " + url_ + ": " + broken_why_);
      }
      if (Clock::now() >= deadline) {
        replies_.erase(slot);  // a late reply to this id is dropped by the reader
        throw Error(ErrorCode::timeout, "store: key '" + key + "' " + (op == 'G' ? "not set" : "not answered") +
                                            " after " + std::to_string(timeout.count()) + " ms (" + url_ + ")");
      }
      if (reading_) {
        changed_.wait_until(lock, deadline);
        continue;
      }
      reading_ = true;
      lock.unlock();
      read_replies(deadline);
      lock.lock();
      reading_ = false;
      changed_.notify_all();
    }
  }

  // The reader's turn: one wait for data (until `deadline`), then hands out every whole reply.
  void read_replies(Clock::time_point deadline) {
    std::string why;
    const int ready = wait_fd(fd_, POLLIN, deadline, &why);
    if (ready == 0) return;
    char chunk[65536];
    ssize_t got = ready > 0 ? ::recv(fd_, chunk, sizeof(chunk), MSG_DONTWAIT) : -1;
    if (got < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return;
    std::lock_guard lock(mutex_);
    if (got == 0) return mark_broken("the store server closed the connection");
    if (got < 0) return mark_broken(why.empty() ? "recv: " + errno_text(errno) : why);
    inbox_.append(chunk, static_cast<std::size_t>(got));
    StoreMessage reply;
    for (;;) {
      const FrameStatus status = take_message(inbox_, false, &reply, &receive_seal_);
      if (status == FrameStatus::incomplete) break;
      if (status == FrameStatus::malformed) return mark_broken("malformed reply from the store server");
      if (status == FrameStatus::forged)
        return mark_broken(
            "a reply failed authentication (forged, replayed or altered on the way); "
            "the connection is no longer trusted");
      if (auto slot = replies_.find(reply.id); slot != replies_.end()) slot->second = std::move(reply);
    }
  }

  void mark_broken(const std::string& why) {
    if (!broken_) broken_why_ = why;
    broken_ = true;
  }

  const std::string url_;
  const int fd_;
  std::mutex mutex_;
  std::condition_variable changed_;
  std::uint32_t next_id_ = 1;
  std::map<std::uint32_t, std::optional<StoreMessage>> replies_;  // outstanding requests by id
  bool reading_ = false;
  bool broken_ = false;
  std::string broken_why_;
  std::string inbox_;       // received bytes not yet a whole reply (touched by the reader only)
  StoreSeal send_seal_;     // under mutex_
  StoreSeal receive_seal_;  // the reader's
};

}  // namespace

// Connects and runs the handshake, again and again until `timeout`: the server may start after
// its clients, and a busy or flooded server closes connections before their handshake is done.
// Only two answers end the attempts early: the server proved the token wrong (its answer to our
// challenge does not match), or it is no Tutti store at all.
std::unique_ptr<Store> connect_tcp_store(const std::string& url, const std::string& host, int port,
                                         const std::string& token, std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  auto pause = std::chrono::milliseconds(10);
  std::minstd_rand jitter(static_cast<std::uint32_t>(Clock::now().time_since_epoch().count()));
  std::string why;
  bool connected_once = false;
  for (;;) {
    const int fd = try_connect(host, port, deadline, &why);
    if (fd >= 0) {
      connected_once = true;
      const int one = 1;
      ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
      // At least a second for the handshake, so a connect that used up the budget is not
      // reported as a failed handshake.
      const HandshakeResult result =
          run_handshake(fd, token, true, std::max(deadline, Clock::now() + std::chrono::seconds(1)));
      if (result.passed())
        return std::make_unique<TcpStore>(url, fd,
                                          token.empty() ? std::nullopt : std::optional<SessionKey>(result.session));
      ::close(fd);
      if (result.failure == HandshakeFailure::wrong_token)
        throw Error(ErrorCode::system,
                    "store: " + url +
                        ": authentication failed: wrong token (the server's answer "
                        "to our challenge does not match); every rank must use the same TUTTI_TOKEN");
      if (result.failure == HandshakeFailure::not_a_peer)
        throw Error(ErrorCode::system, "store: " + url +
                                           ": authentication failed: the server is not a Tutti store "
                                           "of this version (" +
                                           result.why + ")");
      why = result.failure == HandshakeFailure::deadline
                ? "the handshake did not finish in time (" + result.why + ")"
                : "the server closed the connection during the handshake (busy or flooded?): " + result.why;
    }
    const auto now = Clock::now();
    if (now >= deadline)
      throw Error(ErrorCode::timeout, "store: " + url + ": " +
                                          (connected_once ? "no handshake completed" : "could not connect") +
                                          " within " + std::to_string(timeout.count()) + " ms (" + why + ")");
    // Randomised back-off, so clients turned away together do not come back together.
    const auto wait = pause / 2 + std::chrono::milliseconds(jitter() % (pause.count() + 1));
    std::this_thread::sleep_for(std::min<Clock::duration>(wait, deadline - now));
    pause = std::min(pause * 2, std::chrono::milliseconds(250));
  }
}

}  // namespace tutti::bootstrap::detail
