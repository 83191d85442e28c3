// The key-value store ranks use to find each other (addresses, segment names, host names).
// URLs: file:///dir (a directory shared by the ranks; one file per key, written atomically) and
// tcp://host:port (a StoreServer; every connection must pass the TUTTI_TOKEN handshake).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

namespace tutti::bootstrap {

class Store {
 public:
  virtual ~Store() = default;
  /// Sets `key` to `value` (overwrites).
  virtual void set(const std::string& key, const std::string& value) = 0;
  /// The value of `key`, waiting until some rank sets it; Error(timeout) naming the key after `timeout`.
  virtual std::string get(const std::string& key, std::chrono::milliseconds timeout) = 0;
  /// Atomically adds `delta` to the integer at `key` (absent = 0) and returns the new value.
  virtual std::int64_t add(const std::string& key, std::int64_t delta) = 0;
};

/// Connects to the store at `url` (file:// or tcp://), presenting `token` (tcp). Throws
/// Error(invalid_argument) for a malformed URL, Error(timeout) if it cannot connect in time,
/// Error(system) if the token is refused.
std::unique_ptr<Store> connect_store(const std::string& url, const std::string& token,
                                     std::chrono::milliseconds timeout);

/// A TCP store server on `host` (port 0 = any free port), serving until destroyed. Connections
/// that fail the token handshake are refused and logged.
class StoreServer {
 public:
  StoreServer(const std::string& host, int port, const std::string& token);
  ~StoreServer();
  StoreServer(const StoreServer&) = delete;
  StoreServer& operator=(const StoreServer&) = delete;
  int port() const;
  std::string url() const;  ///< tcp://host:port
  /// Number of connections refused for a bad token so far (for tests and logs).
  int refused() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tutti::bootstrap
