// The requests of a StoreServer's authenticated connections: reading and parsing them, serving
// set, get and add from the key-value table (a get of an absent key is parked until a set or add
// creates the key), and queueing and flushing the replies. The connections themselves (the poll
// loop, admission, handshakes) are in tcp_store_server.cpp.
#include <sys/socket.h>

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "bootstrap/store_backends.hpp"
#include "bootstrap/tcp_store_protocol.hpp"
#include "bootstrap/tcp_store_server_impl.hpp"
#include "core/log.hpp"

namespace tutti::bootstrap {

namespace {

constexpr int reads_per_round = 16;  // chunks read from one connection before the others' turn
// An authenticated client that asks and never reads its replies is closed past this much queued
// output; one that parks this many gets at once is told no.
constexpr std::size_t max_outbox = 4 * std::size_t{detail::max_store_frame};
constexpr std::size_t max_parked_gets = 1u << 16;

}  // namespace

// Reads what connection `id` sent and serves every whole request in it. Parses after each chunk,
// so the inbox never holds more than one frame (take_message refuses a frame over
// max_store_frame from its header alone). False when the connection must be closed.
bool StoreServer::Impl::receive_requests(std::uint64_t id) {
  Connection& connection = connections.at(id);
  char chunk[65536];
  for (int round = 0; round < reads_per_round; ++round) {
    const ssize_t got = ::recv(connection.fd, chunk, sizeof(chunk), MSG_DONTWAIT);
    if (got == 0) return false;  // the client left
    if (got < 0) {
      if (errno == EINTR) continue;
      return errno == EAGAIN || errno == EWOULDBLOCK;
    }
    connection.inbox.append(chunk, static_cast<std::size_t>(got));
    detail::StoreMessage request;
    for (;;) {
      const auto status = detail::take_message(connection.inbox, true, &request, &connection.receive_seal);
      if (status == detail::FrameStatus::incomplete) break;
      if (status == detail::FrameStatus::forged) {
        core::log(core::LogLevel::warn, -1,
                  "store: a request from " + connection.peer.address +
                      " failed authentication (forged, replayed or altered on the way); closing");
        return false;
      }
      if (status == detail::FrameStatus::malformed) {
        core::log(core::LogLevel::warn, -1, "store: malformed request from " + connection.peer.address + "; closing");
        return false;
      }
      serve(id, request);
    }
  }
  return true;  // more may be waiting: the next poll says so
}

bool StoreServer::Impl::flush(Connection& connection) {
  while (!connection.outbox.empty()) {
    const ssize_t sent =
        ::send(connection.fd, connection.outbox.data(), connection.outbox.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
    if (sent < 0) return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR;
    connection.outbox.erase(0, static_cast<std::size_t>(sent));
  }
  return true;
}

void StoreServer::Impl::serve(std::uint64_t connection_id, const detail::StoreMessage& request) {
  const std::string& key = request.key;
  switch (request.kind) {
    case 'S':
      store_value(key, request.payload);
      return reply(connection_id, request.id, 'O', "");
    case 'G': {
      const auto found = values.find(key);
      if (found != values.end()) return reply(connection_id, request.id, 'O', found->second);
      Connection& connection = connections.at(connection_id);
      if (connection.parked >= max_parked_gets)
        return reply(connection_id, request.id, 'E',
                     "store: get '" + key + "': more than " + std::to_string(max_parked_gets) +
                         " gets of this connection wait already");
      ++connection.parked;
      waiting_gets[key].push_back({connection_id, request.id});
      return;
    }
    case 'A': {
      const auto delta = detail::decode_i64(request.payload);
      std::int64_t value = 0;
      const auto found = values.find(key);
      if (!delta || (found != values.end() && !detail::parse_store_int(found->second, &value)))
        return reply(connection_id, request.id, 'E', "store: add: key '" + key + "' does not hold an integer");
      if (__builtin_add_overflow(value, *delta, &value))
        return reply(connection_id, request.id, 'E', "store: add: key '" + key + "' would overflow");
      store_value(key, std::to_string(value));
      return reply(connection_id, request.id, 'O', detail::encode_i64(value));
    }
    default:
      return reply(connection_id, request.id, 'E', std::string("store: unknown request '") + request.kind + "'");
  }
}

void StoreServer::Impl::store_value(const std::string& key, const std::string& value) {
  values[key] = value;
  const auto parked = waiting_gets.find(key);
  if (parked == waiting_gets.end()) return;
  const std::vector<Waiter> waiters = std::move(parked->second);
  waiting_gets.erase(parked);
  for (const Waiter& waiter : waiters) {
    if (const auto at = connections.find(waiter.connection); at != connections.end()) --at->second.parked;
    reply(waiter.connection, waiter.id, 'O', value);
  }
}

// Queues a reply; it leaves in flush() (now or when the socket has room). Replies to
// connections that have closed are dropped; a connection whose replies pile up is closed.
void StoreServer::Impl::reply(std::uint64_t connection_id, std::uint32_t id, char status, const std::string& payload) {
  const auto at = connections.find(connection_id);
  if (at == connections.end() || at->second.overflowed) return;
  Connection& connection = at->second;
  std::string frame = detail::encode_message({id, status, "", payload}, false);
  detail::seal_frame(frame, connection.send_seal);
  connection.outbox += frame;
  flush(connection);  // a failure shows up as POLLERR/POLLHUP on the next poll
  if (connection.outbox.size() > max_outbox) {
    connection.overflowed = true;
    connection.outbox.clear();
  }
}

}  // namespace tutti::bootstrap
