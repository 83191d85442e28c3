// The store implementations behind connect_store(); private to the bootstrap layer.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "bootstrap/store.hpp"

namespace tutti::bootstrap::detail {

/// The file store in directory `dir` (absolute, must exist). `url` is for messages.
/// Throws Error(invalid_argument) when `dir` is not an existing directory; logs a warning when it
/// is writable by group or others, or owned by another user (they could forge the job's keys).
std::unique_ptr<Store> open_file_store(const std::string& url, const std::string& dir);

/// Connects to a StoreServer at host:port and runs the handshake, retrying both until `timeout`.
/// Throws Error(timeout) when no handshake completed in time, Error(system) when the server
/// proved the token wrong or is not a Tutti store.
std::unique_ptr<Store> connect_tcp_store(const std::string& url, const std::string& host, int port,
                                         const std::string& token, std::chrono::milliseconds timeout);

/// Parses the decimal integer a store holds for add(); false when `text` is not one.
bool parse_store_int(const std::string& text, std::int64_t* value);

}  // namespace tutti::bootstrap::detail
