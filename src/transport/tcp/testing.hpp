// Test hooks of the TCP transport. Not for production use.
#pragma once

#include "transport/transport.hpp"

namespace tutti::transport::tcp::testing {

/// Simulates the death of this rank's process: every connection of `transport`'s hub (shared
/// with its splits) is closed at once, without goodbye, and the I/O thread stops. Peers see the
/// connections end and abort with Error(peer_failure). `transport` must come from tcp::connect.
void crash(Transport& transport);

/// The writes to its sockets that succeeded so far on `transport`'s hub (shared with its splits).
std::uint64_t socket_writes(Transport& transport);

}  // namespace tutti::transport::tcp::testing
