#include "transport/mpi/mpi_control.hpp"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <string_view>
#include <thread>

#include "transport/mpi/mpi_support.hpp"

namespace tutti::transport::mpi {

namespace {

struct AbortHeader {
  std::uint64_t seq = 0;
  std::uint32_t code = 0;
  std::uint32_t reserved = 0;
};
static_assert(sizeof(AbortHeader) == 16);

// How long close() waits for the abort's sends before leaving them to MPI.
constexpr auto send_grace = std::chrono::milliseconds(100);

}  // namespace

void ControlChannel::open(MPI_Comm comm) {
  comm_ = comm;
  inbox_.resize(sizeof(AbortHeader) + max_abort_text);
  check(
      MPI_Irecv(inbox_.data(), static_cast<int>(inbox_.size()), MPI_BYTE, MPI_ANY_SOURCE, abort_tag, comm_, &receive_),
      "MPI_Irecv");
}

void ControlChannel::close() {
  if (comm_ == MPI_COMM_NULL) return;
  if (receive_ != MPI_REQUEST_NULL) {
    MPI_Cancel(&receive_);
    MPI_Wait(&receive_, MPI_STATUS_IGNORE);  // a cancelled receive completes at once
  }
  // Aborts are small (MPI sends them eagerly); a peer that is gone may still hold one up.
  const auto give_up = std::chrono::steady_clock::now() + send_grace;
  for (;;) {
    int flag = 0;
    MPI_Testall(static_cast<int>(sends_.size()), sends_.data(), &flag, MPI_STATUSES_IGNORE);
    if (flag || std::chrono::steady_clock::now() >= give_up) break;
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
  for (MPI_Request& request : sends_)
    if (request != MPI_REQUEST_NULL) abandon(request, outbox_);
  sends_.clear();
  MPI_Comm_free(&comm_);
}

std::optional<Failure> ControlChannel::poll() {
  std::erase_if(sends_, [](MPI_Request& request) {
    int flag = 0;
    MPI_Test(&request, &flag, MPI_STATUS_IGNORE);
    return flag != 0;
  });
  if (receive_ == MPI_REQUEST_NULL) return std::nullopt;
  int flag = 0;
  MPI_Status status;
  const int rc = MPI_Test(&receive_, &flag, &status);
  if (rc != MPI_SUCCESS || !flag) return std::nullopt;
  int bytes = 0;
  MPI_Get_count(&status, MPI_BYTE, &bytes);
  std::optional<Failure> out;
  // What a peer sent is checked before use: the header must be whole, the code one of ours.
  if (bytes >= static_cast<int>(sizeof(AbortHeader)) && static_cast<std::size_t>(bytes) <= inbox_.size()) {
    AbortHeader header;
    std::memcpy(&header, inbox_.data(), sizeof(header));
    const auto code = header.code <= static_cast<std::uint32_t>(ErrorCode::system) ? static_cast<ErrorCode>(header.code)
                                                                                   : ErrorCode::system;
    const auto* text = reinterpret_cast<const char*>(inbox_.data() + sizeof(header));
    out = Failure{Error(code, std::string(text, static_cast<std::size_t>(bytes) - sizeof(header))), header.seq};
  }
  if (MPI_Irecv(inbox_.data(), static_cast<int>(inbox_.size()), MPI_BYTE, MPI_ANY_SOURCE, abort_tag, comm_,
                &receive_) != MPI_SUCCESS)
    receive_ = MPI_REQUEST_NULL;  // no further aborts heard; the deadlines still hold
  return out;
}

void ControlChannel::send_abort(const Failure& failure, int rank, int size) {
  if (outbox_ || comm_ == MPI_COMM_NULL) return;
  const std::string_view text(failure.error.what());
  const std::size_t length = std::min(text.size(), max_abort_text);
  outbox_ = std::make_shared<std::vector<std::byte>>(sizeof(AbortHeader) + length);
  const AbortHeader header{failure.seq, static_cast<std::uint32_t>(failure.error.code()), 0};
  std::memcpy(outbox_->data(), &header, sizeof(header));
  std::memcpy(outbox_->data() + sizeof(header), text.data(), length);
  for (int peer = 0; peer < size; ++peer) {
    if (peer == rank) continue;
    MPI_Request request = MPI_REQUEST_NULL;
    if (MPI_Isend(outbox_->data(), static_cast<int>(outbox_->size()), MPI_BYTE, peer, abort_tag, comm_, &request) ==
        MPI_SUCCESS)
      sends_.push_back(request);
  }
}

}  // namespace tutti::transport::mpi
