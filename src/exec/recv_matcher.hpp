// Matching of point-to-point receives when some come from any source. A receive from a named
// peer takes the next message index from that peer and tag, as before. A receive from any source
// posts a receive on every peer into staging memory; the first message taken, the others are
// withdrawn, and those that had already arrived (or begun to) are kept here as their sender's
// next message, which the next receive from that peer (named or any) takes first. So that two
// receives never claim the same message, receives of a tag queue behind an unresolved receive
// from any source of that tag, in issue order (as MPI matches receives in the order posted).
// Not thread-safe: the owning OperationQueue calls it under its lock.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <utility>

#include "transport/transport.hpp"

namespace tutti::exec {

class Operation;

class RecvMatcher {
 public:
  /// A message received ahead of its receive.
  struct Message {
    std::unique_ptr<std::byte[]> data;
    std::size_t bytes = 0;
    std::uint64_t arrival = 0;  // order among kept messages
  };

  /// The key of the next message from `peer` with `tag` (the index is not taken).
  transport::MessageKey next_key(int peer, int tag) const;
  /// Takes the next message index from `peer` with `tag` and returns its key.
  transport::MessageKey take_key(int peer, int tag);
  /// A named receive may take the next key at once: nothing queued for `tag`, nothing kept from `peer`.
  bool direct(int peer, int tag) const;

  /// Keeps `data` as the message from `peer` with `tag` whose index was taken last.
  void keep(int peer, int tag, std::unique_ptr<std::byte[]> data, std::size_t bytes);
  /// The earliest kept message from `peer` with `tag`, removed.
  std::optional<Message> take_kept(int peer, int tag);
  /// The earliest kept message with `tag` from any peer, removed, with its sender.
  std::optional<std::pair<int, Message>> take_kept_any(int tag);

  /// Receives of `tag` that must match in turn.
  void enqueue(int tag, const Operation* op) { queued_[tag].push_back(op); }
  bool at_front(int tag, const Operation* op) const;
  /// Removes `op` from its tag's queue (wherever it is); true when it was there.
  bool dequeue(int tag, const Operation* op);

 private:
  std::map<std::pair<int, int>, std::uint32_t> next_index_;  // (peer, tag)
  std::map<std::pair<int, int>, std::deque<Message>> kept_;  // (peer, tag)
  std::map<int, std::deque<const Operation*>> queued_;       // tag
  std::uint64_t arrivals_ = 0;
};

}  // namespace tutti::exec
