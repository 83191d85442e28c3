// Control messages of one MPI transport, on a communicator of their own (a third duplicate), so
// that they never match data: the abort of the communicator, which the rank that fails first
// sends to every other rank, and the arrival messages of the barrier before a split.
//
// Every rank keeps one receive for aborts posted (any source, tag `abort_tag`) and tests it with
// every progress, wait and aborted() of its transport: a rank that waits, or that comes to its
// next call, learns of another rank's failure at once, not by its own deadline. An abort is
// 16 bytes (seq, ErrorCode, reserved) and at most max_abort_text bytes of text.
#pragma once

#include <mpi.h>

#include <cstddef>
#include <memory>
#include <optional>
#include <vector>

#include "transport/transport.hpp"

namespace tutti::transport::mpi {

class ControlChannel {
 public:
  static constexpr int abort_tag = 1;
  static constexpr int barrier_tag = 2;      // + phase * barrier_rounds + the barrier's round
  static constexpr int barrier_rounds = 32;  // a dissemination barrier of up to 2^32 ranks
  static constexpr std::size_t max_abort_text = 1024;

  /// Takes `comm` (freed by close) and posts the receive for aborts. Call with serialize() held.
  void open(MPI_Comm comm);
  /// Withdraws the receive, gives the abort's sends a short grace (then leaves them to MPI, their
  /// buffer kept), and frees the communicator. Call with serialize() held, while MPI is active.
  void close();
  MPI_Comm comm() const { return comm_; }

  /// Tests the receive: an abort a peer sent (then posts the receive again), else nullopt. Also
  /// tests this rank's own sends. Call with serialize() held.
  std::optional<Failure> poll();
  /// Sends `failure` to every rank of `size` but `rank`, without waiting. Once per channel (a
  /// communicator fails once). Call with serialize() held.
  void send_abort(const Failure& failure, int rank, int size);

 private:
  MPI_Comm comm_ = MPI_COMM_NULL;
  MPI_Request receive_ = MPI_REQUEST_NULL;
  std::vector<std::byte> inbox_;
  std::shared_ptr<std::vector<std::byte>> outbox_;  // the abort this rank sent (kept while MPI sends it)
  std::vector<MPI_Request> sends_;
};

}  // namespace tutti::transport::mpi
