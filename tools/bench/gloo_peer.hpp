// Gloo's allreduce, allgather and broadcast over its TCP transport, as a peer tutti-bench times
// beside Tutti. Benchmark only: the library never depends on Gloo.
#pragma once

#include <chrono>
#include <cstddef>
#include <memory>
#include <string>
#include <string_view>

#include "tutti/types.hpp"

namespace tutti::bench {

/// Gloo's collectives as a peer to time against (benchmark only).
class GlooPeer {
 public:
  /// Whether this build has Gloo (false: every other member throws std::runtime_error saying so).
  static bool available();

  /// Connects a full mesh of `size` ranks over TCP on 127.0.0.1, rendezvous through a file store in
  /// `directory` (the same existing directory on every rank; the caller removes it). Collective:
  /// every rank constructs it at the same time. `timeout` bounds the rendezvous and every later
  /// collective. Throws std::runtime_error with Gloo's message.
  GlooPeer(int rank, int size, const std::string& directory, std::chrono::milliseconds timeout);
  ~GlooPeer();
  GlooPeer(const GlooPeer&) = delete;
  GlooPeer& operator=(const GlooPeer&) = delete;

  /// Whether Gloo has `collective` ("allreduce", "allgather", "broadcast") for this type and op
  /// (op ignored for allgather/broadcast). bf16 has no Gloo type: false.
  bool supports(std::string_view collective, DataType type, ReduceOp op) const;

  /// Runs one blocking collective with Tutti's argument conventions: allreduce send/recv `count`
  /// elements (send == recv in place); allgather send `count` elements, recv size*count (in place
  /// when send is this rank's block of recv); broadcast `recv` of `count` elements from `root`
  /// (send ignored). count == 0 does nothing. Throws std::runtime_error if unsupported, or with
  /// Gloo's message if the collective fails (a peer gone, the timeout passed).
  void run(std::string_view collective, const void* send, void* recv, std::size_t count, DataType type, ReduceOp op,
           int root);

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace tutti::bench
