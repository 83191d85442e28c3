// The progress engine: one background thread per process that advances every communicator's
// nonblocking operations, so that an `iallreduce` proceeds while its caller computes. It sleeps
// when no operation is outstanding, and while one is, it sleeps on that communicator's transport
// until something completes. Callers that wait progress too (whoever gets the queue's lock).
#pragma once

#include <memory>

namespace tutti::exec {

class OperationQueue;

/// Registers `queue` as having outstanding operations; wakes the engine thread (started on
/// first use, stopped at process exit).
void engine_notify(const std::shared_ptr<OperationQueue>& queue);

}  // namespace tutti::exec
