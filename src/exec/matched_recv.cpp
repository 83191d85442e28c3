#include "exec/matched_recv.hpp"

#include <algorithm>
#include <new>

#include "core/copy.hpp"

namespace tutti::exec {

using transport::Completion;

MatchedRecv::MatchedRecv(transport::Transport& transport, RecvMatcher& matcher, const PointToPoint& message)
    : Operation(Kind::point_to_point, transport::Signature{}),
      transport_(transport),
      matcher_(matcher),
      data_(static_cast<std::byte*>(message.data)),
      bytes_(message.bytes()),
      peer_(message.peer),
      tag_(message.tag),
      message_(message) {}

void MatchedRecv::start() {
  matcher_.enqueue(tag_, this);
  queued_ = true;
  progress();
}

// Leaves the tag's queue: the receive behind this one may match now (and a waiter on another
// thread must look again).
void MatchedRecv::leave() {
  if (!queued_) return;
  queued_ = false;
  matcher_.dequeue(tag_, this);
  transport_.wake();
}

void MatchedRecv::fail_with(const std::string& transport_error) {
  fail(Error(ErrorCode::mismatch, describe() + ": " + transport_error));
}

bool MatchedRecv::take_kept() {
  std::optional<RecvMatcher::Message> message;
  int from = peer_;
  if (peer_ == any_peer) {
    auto any = matcher_.take_kept_any(tag_);
    if (any) {
      from = any->first;
      message = std::move(any->second);
    }
  } else {
    message = matcher_.take_kept(peer_, tag_);
  }
  if (!message) return false;
  leave();
  if (message->bytes != bytes_) {
    fail(Error(ErrorCode::mismatch, describe() + ": rank " + std::to_string(from) + " sent " +
                                        std::to_string(message->bytes) + " bytes where " + std::to_string(bytes_) +
                                        " were expected"));
    return true;
  }
  if (bytes_ > 0) core::copy(data_, message->data.get(), bytes_);
  set_source(from);
  succeed();
  return true;
}

void MatchedRecv::post_candidates() {
  const int p = transport_.size();
  candidates_.resize(static_cast<std::size_t>(p));
  completions_ = std::make_unique<Completion[]>(static_cast<std::size_t>(p));
  try {
    for (auto& candidate : candidates_)
      candidate.staging = std::make_unique_for_overwrite<std::byte[]>(std::max<std::size_t>(bytes_, 1));
  } catch (const std::bad_alloc&) {
    leave();
    finish_with(Error(ErrorCode::system, describe() + ": out of memory for " + std::to_string(p) +
                                             " staging buffers of " + std::to_string(bytes_) + " bytes"));
    return;
  }
  for (int r = 0; r < p; ++r) {
    auto& candidate = candidates_[static_cast<std::size_t>(r)];
    candidate.open = true;
    transport_.post_recv(r, matcher_.next_key(r, tag_), candidate.staging.get(), bytes_,
                         &completions_[static_cast<std::size_t>(r)]);
  }
  phase_ = Phase::posted;
}

void MatchedRecv::begin() {
  if (take_kept()) return;
  if (peer_ != any_peer) {
    transport_.post_recv(peer_, matcher_.take_key(peer_, tag_), data_, bytes_, &direct_);
    phase_ = Phase::posted;
    leave();
    return;
  }
  post_candidates();
}

// Any source, posted: takes the first message that arrived (the lowest rank among several) and
// withdraws the other receives; those that cannot be withdrawn (their message arrived, or began
// to) are settled as their senders' next messages.
bool MatchedRecv::poll_candidates() {
  int taken = -1;
  for (std::size_t r = 0; r < candidates_.size(); ++r) {
    const auto state = completions_[r].state();
    if (state == Completion::failed) {
      fail_with(completions_[r].error);
      return true;
    }
    if (state == Completion::done && taken < 0) taken = static_cast<int>(r);
  }
  if (taken < 0) return false;
  auto& mine = candidates_[static_cast<std::size_t>(taken)];
  mine.open = false;
  matcher_.take_key(taken, tag_);
  if (bytes_ > 0) core::copy(data_, mine.staging.get(), bytes_);
  set_source(taken);
  for (std::size_t r = 0; r < candidates_.size(); ++r) {
    auto& other = candidates_[r];
    if (other.open && completions_[r].state() == Completion::posted && transport_.withdraw_recv(&completions_[r]))
      other.open = false;
  }
  phase_ = Phase::settling;
  return settle();
}

bool MatchedRecv::settle() {
  bool open = false;
  for (std::size_t r = 0; r < candidates_.size(); ++r) {
    auto& candidate = candidates_[r];
    if (!candidate.open) continue;
    const auto state = completions_[r].state();
    if (state == Completion::failed) {
      fail_with(completions_[r].error);
      return true;
    }
    if (state == Completion::done) {
      candidate.open = false;
      matcher_.take_key(static_cast<int>(r), tag_);
      matcher_.keep(static_cast<int>(r), tag_, std::move(candidate.staging), bytes_);
      continue;
    }
    if (state == Completion::cancelled)
      candidate.open = false;
    else
      open = true;
  }
  if (open) return false;
  leave();
  succeed();
  return true;
}

bool MatchedRecv::progress() {
  if (finished()) return true;
  switch (phase_) {
    case Phase::queued:
      if (!matcher_.at_front(tag_, this)) return false;
      begin();
      if (finished() || phase_ != Phase::posted || peer_ != any_peer) break;
      [[fallthrough]];
    case Phase::posted:
      if (peer_ == any_peer) {
        poll_candidates();
        break;
      }
      if (direct_.state() == Completion::failed) fail_with(direct_.error);
      if (direct_.state() == Completion::done) {
        set_source(peer_);
        succeed();
      }
      break;
    case Phase::settling:
      settle();
      break;
  }
  return finished();
}

void MatchedRecv::fail(const Error& error) {
  if (finished()) return;
  if (direct_.state() == Completion::posted) transport_.cancel(&direct_);
  for (std::size_t r = 0; r < candidates_.size(); ++r)
    if (candidates_[r].open && completions_[r].state() == Completion::posted) transport_.cancel(&completions_[r]);
  leave();
  finish_with(error);
}

std::vector<int> MatchedRecv::waiting_for() const {
  if (finished()) return {};
  if (peer_ != any_peer) return {peer_};
  std::vector<int> peers;
  for (std::size_t r = 0; r < candidates_.size(); ++r)
    if (candidates_[r].open) peers.push_back(static_cast<int>(r));
  return peers;
}

}  // namespace tutti::exec
