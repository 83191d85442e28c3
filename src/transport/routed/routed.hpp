// The transport of ranks spread over several hosts with several ranks on some of them: messages
// between ranks of one host travel through shared memory, messages between hosts through TCP.
// Each operation goes to one of the two by its peer; both see every collective's signature.
#pragma once

#include <memory>
#include <vector>

#include "transport/transport.hpp"

namespace tutti::transport::routed {

/// This rank's transport of a communicator over ranks on several hosts; `host_of[r]` identifies
/// rank r's host (equal numbers: one host, where shared memory works). `local` carries the
/// messages among the ranks of this rank's host: a shared-memory transport over exactly those
/// ranks, numbered in rank order (null when this rank is alone on its host). `remote` carries the
/// others: a TCP transport over every rank, numbered as this communicator, whose id becomes the
/// communicator's. Throws Error(invalid_argument) when the pieces do not fit that description.
std::unique_ptr<Transport> make(std::vector<int> host_of, int rank, std::unique_ptr<Transport> local,
                                std::unique_ptr<Transport> remote);

}  // namespace tutti::transport::routed
