// What every transport does alike when it matches messages: how it files a message (key and
// hash), how it marks an operation posted, and the texts of the errors that matching finds, so
// that every transport reports the same disagreement with the same words.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <unordered_map>

#include "transport/transport.hpp"

namespace tutti::transport {

/// A message as a receiver files it: who sent it and its key. `comm` tells communicators apart
/// in a table that several share (inproc's mailboxes); a table of one communicator leaves it 0.
struct MatchKey {
  int peer = 0;
  Channel channel = Channel::collective;
  std::uint64_t seq = 0;
  std::uint32_t index = 0;
  std::uint64_t comm = 0;
  bool operator==(const MatchKey&) const = default;
};

struct MatchKeyHash {
  std::size_t operator()(const MatchKey& k) const noexcept {
    std::uint64_t h = k.comm * 0x9e3779b97f4a7c15ull;
    h ^= k.seq + 0x517cc1b727220a95ull + (h << 6) + (h >> 2);
    h ^= (static_cast<std::uint64_t>(k.index) << 24) ^
         (static_cast<std::uint64_t>(static_cast<std::uint32_t>(k.peer))) ^
         (static_cast<std::uint64_t>(k.channel) << 62);
    return static_cast<std::size_t>(h * 0xff51afd7ed558ccdull);
  }
};

/// Posted operations or early messages, by the message they wait for.
template <class T>
using MatchTable = std::unordered_map<MatchKey, T, MatchKeyHash>;

inline MatchKey match_key(int peer, const MessageKey& key, std::uint64_t comm = 0) {
  return MatchKey{peer, key.channel, key.seq, key.index, comm};
}

inline MessageKey message_key(const MatchKey& k) { return MessageKey{k.channel, k.seq, k.index}; }

/// Records on `done` what was posted (so that `cancel` can find it) and marks it posted.
void prepare(Completion* done, int peer, const MessageKey& key, bool is_send);

/// The text of a size disagreement over message `key`, as sender and receiver report it:
/// "message size mismatch: rank 0 sent 40 bytes but rank 1 expected 48 (tag 3, message 0)".
/// Without `sent` (a transport that only learns that more arrived than fits) it says "sent more
/// than 48 bytes".
std::string size_mismatch(int sender, std::optional<std::size_t> sent, int receiver, std::size_t expected,
                          const MessageKey& key);

/// Error(mismatch) naming two ranks that called different collectives and what each called, the
/// lower rank first, so that whichever of the two finds the disagreement reports the same text.
Error collective_mismatch(int rank_a, const Signature& a, int rank_b, const Signature& b);

}  // namespace tutti::transport
