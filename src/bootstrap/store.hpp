// The key-value store ranks use to find each other (addresses, segment names, host names).
// URLs: file:///dir (a directory shared by the ranks; one file per key, written atomically) and
// tcp://host:port (a StoreServer; every connection must pass the TUTTI_TOKEN handshake).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>

#include "tutti/rendezvous.hpp"

namespace tutti::bootstrap {

/// The store's interface is the public one a caller can also provide (tutti::init(KeyValueStore&,
/// ...)): set, get waiting until some rank sets the key (Error(timeout) naming the key), add.
using Store = tutti::KeyValueStore;

/// Connects to the store at `url` (file:// or tcp://), presenting `token` (tcp). Throws
/// Error(invalid_argument) for a malformed URL or a tcp:// store without a token (see
/// require_token), Error(timeout) if it cannot connect and pass the handshake in time (the server
/// is not up, or busy), Error(system) if the server proved that `token` is wrong. A file:// store
/// needs no token; it warns when its directory is writable by others.
std::unique_ptr<Store> connect_store(const std::string& url, const std::string& token,
                                     std::chrono::milliseconds timeout);

/// Whether `url` is a file:// store whose directory belongs to this user and no one else may read,
/// write or enter (mode 0700 or stricter): a channel as private as the ranks' environment, through
/// which rank 0 may hand the others a token it drew.
bool private_file_store(const std::string& url);

/// The host (without [brackets]) and port a tcp://host:port URL names; Error(invalid_argument)
/// naming TUTTI_STORE when it is malformed.
std::pair<std::string, int> tcp_store_address(const std::string& url);

/// A TCP store server listening on `host` only (port 0 = any free port), serving until
/// destroyed. Throws Error(invalid_argument) without a token (see require_token), Error(system)
/// when it cannot listen. Connections that fail the token handshake, do not finish it within 2 s
/// or are evicted by a flood (at most 8 in handshake per source address, 256 in all) are closed,
/// counted and logged.
class StoreServer {
 public:
  StoreServer(const std::string& host, int port, const std::string& token);
  ~StoreServer();
  StoreServer(const StoreServer&) = delete;
  StoreServer& operator=(const StoreServer&) = delete;
  int port() const;
  std::string url() const;  ///< tcp://host:port
  /// Connections closed before they passed the handshake so far: a wrong token, not a Tutti
  /// peer, too slow, or evicted by the caps (for tests and logs).
  int refused() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tutti::bootstrap
