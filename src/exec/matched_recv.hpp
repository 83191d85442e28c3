// A point-to-point receive that goes through the RecvMatcher: a receive from any source, or a
// receive from a named peer that must wait its turn behind one (or that finds its message kept).
// Not thread-safe: the owning OperationQueue serializes calls under its lock.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "exec/operation.hpp"
#include "exec/recv_matcher.hpp"

namespace tutti::exec {

class MatchedRecv final : public Operation {
 public:
  /// `message.peer` is a rank, or any_peer for the first message from any rank.
  static constexpr int any_peer = PointToPoint::any_peer;
  MatchedRecv(transport::Transport& transport, RecvMatcher& matcher, const PointToPoint& message);
  void start() override;
  bool progress() override;
  void fail(const Error& error) override;
  std::vector<int> waiting_for() const override;
  std::string describe() const override { return message_.describe(); }

 private:
  enum class Phase { queued, posted, settling };
  struct Candidate {  // any source: the receive posted on one peer
    std::unique_ptr<std::byte[]> staging;
    bool open = false;  // posted and not yet resolved
  };
  void begin();
  bool take_kept();
  void post_candidates();
  bool poll_candidates();
  bool settle();
  void leave();
  void fail_with(const std::string& transport_error);

  transport::Transport& transport_;
  RecvMatcher& matcher_;
  std::byte* data_;
  std::size_t bytes_;
  int peer_;
  int tag_;
  PointToPoint message_;
  Phase phase_ = Phase::queued;
  bool queued_ = false;
  transport::Completion direct_;  // a named peer: the receive into the caller's buffer
  std::vector<Candidate> candidates_;
  std::unique_ptr<transport::Completion[]> completions_;  // per candidate
};

}  // namespace tutti::exec
