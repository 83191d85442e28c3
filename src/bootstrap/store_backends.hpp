// The store implementations behind connect_store(); private to the bootstrap layer.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "bootstrap/store.hpp"

namespace tutti::bootstrap::detail {

/// The file store in directory `dir` (absolute, must exist). `url` is for messages.
/// Throws Error(invalid_argument) when `dir` is not an existing directory.
std::unique_ptr<Store> open_file_store(const std::string& url, const std::string& dir);

/// Connects to a StoreServer at host:port, retrying until `timeout`, then runs the handshake.
/// Throws Error(timeout) when no connection was made in time, Error(system) when refused.
std::unique_ptr<Store> connect_tcp_store(const std::string& url, const std::string& host, int port,
                                         const std::string& token, std::chrono::milliseconds timeout);

/// Parses the decimal integer a store holds for add(); false when `text` is not one.
bool parse_store_int(const std::string& text, std::int64_t* value);

}  // namespace tutti::bootstrap::detail
