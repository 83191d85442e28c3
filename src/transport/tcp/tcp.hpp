// TCP transport: a full mesh of authenticated connections (TUTTI_TOKEN), driven by one epoll I/O
// thread per transport; messages carry their communicator, sequence number and tag.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "bootstrap/store.hpp"
#include "transport/transport.hpp"

namespace tutti::transport::tcp {

/// This rank's transport of communicator `comm_id` over `size` ranks. Listens on `bind_host`
/// (port chosen by the OS), publishes "host:port" in `store` under "tcp/<comm_id>/<rank>",
/// connects to every peer (each connection passes bootstrap::handshake with `token`; a
/// connection that fails it is refused and logged, and never joins), and returns when the mesh
/// is complete. Error(timeout) naming the missing ranks if that takes longer than `timeout`.
std::unique_ptr<Transport> connect(bootstrap::Store& store, const std::string& token, int rank, int size,
                                   std::uint64_t comm_id, const std::string& bind_host,
                                   std::chrono::milliseconds timeout);

}  // namespace tutti::transport::tcp
