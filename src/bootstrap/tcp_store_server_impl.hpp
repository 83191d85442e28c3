// The state of a StoreServer, private to the bootstrap layer. Its connections' lifecycle (the poll
// loop, admission, handshakes, eviction, closing) is in tcp_store_server.cpp; reading, serving and
// answering the requests of authenticated connections is in tcp_store_requests.cpp.
#pragma once

#include <unistd.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "bootstrap/auth.hpp"
#include "bootstrap/socket_io.hpp"
#include "bootstrap/store.hpp"
#include "bootstrap/tcp_store_protocol.hpp"

namespace tutti::bootstrap {

namespace detail {

struct Peer {
  std::string source;   // the address alone (the per-source cap counts by it)
  std::string address;  // address:port, for messages
};

}  // namespace detail

struct StoreServer::Impl {
  struct Connection {
    int fd = -1;
    detail::Peer peer;
    std::unique_ptr<Handshaker> handshake;  // until it passes; then the connection is served
    detail::Clock::time_point handshake_deadline;
    std::string inbox, outbox;
    detail::StoreSeal receive_seal, send_seal;  // tags of requests and replies, once the handshake passed
    std::size_t parked = 0;                     // its gets waiting for a key
    bool overflowed = false;                    // it stopped reading its replies: closed at the end of the round
  };
  struct Waiter {
    std::uint64_t connection;
    std::uint32_t id;
  };

  std::string host;
  std::string token;
  int listen_fd = -1;
  int wake_fd = -1;
  int port = 0;
  std::atomic<int> refused{0};
  std::atomic<bool> stopping{false};
  std::thread thread;

  // Touched by the poll thread only. Connection ids grow, so a lower id is an older connection.
  std::uint64_t next_connection = 1;
  std::map<std::uint64_t, Connection> connections;
  std::size_t handshaking = 0;
  std::unordered_map<std::string, std::size_t> handshaking_from;
  detail::Clock::time_point accept_paused_until{};
  std::unordered_map<std::string, std::string> values;
  std::unordered_map<std::string, std::vector<Waiter>> waiting_gets;

  void wake() {
    const std::uint64_t one = 1;
    [[maybe_unused]] const ssize_t wrote = ::write(wake_fd, &one, sizeof(one));
  }

  // Connections (tcp_store_server.cpp).
  void run();
  int poll_timeout() const;
  void accept_all();
  void admit(int fd, detail::Peer peer);
  void evict(const std::string* source);
  void step_handshake(std::uint64_t id);
  void expire_handshakes();
  void refuse(const detail::Peer& peer, const std::string& why);
  void close_connection(std::uint64_t id, const std::string* refusal);
  void close_all();

  // Requests (tcp_store_requests.cpp).
  bool receive_requests(std::uint64_t id);
  bool flush(Connection& connection);
  void serve(std::uint64_t connection_id, const detail::StoreMessage& request);
  void reply(std::uint64_t connection_id, std::uint32_t id, char status, const std::string& payload);
  void store_value(const std::string& key, const std::string& value);
};

}  // namespace tutti::bootstrap
