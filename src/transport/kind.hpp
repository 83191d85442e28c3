// What a transport is, as the decisions about a call see it (like NCCL's transport indices):
// which native algorithms it may run and what its messages cost. Transport::name() stays the
// spelling for logs, TUTTI_TRANSPORT and tuning-file keys; nothing decides by comparing names.
#pragma once

namespace tutti::transport {

enum class Kind {
  inproc,  ///< ranks are threads of one process (tests)
  shm,     ///< processes on one host, through shared memory
  tcp,     ///< processes across hosts
  mpi,     ///< MPI point-to-point and MPI's own collectives
  routed,  ///< shared memory within a host, TCP between hosts ("shm+tcp")
};

/// Whether a transport of `kind` checks every message's signature on arrival (TCP's frame
/// headers; under shm+tcp shared memory compares the host's ranks' by itself;
/// Transport::checks_message_signatures).
inline bool checks_message_signatures(Kind kind) { return kind == Kind::tcp || kind == Kind::routed; }

}  // namespace tutti::transport
