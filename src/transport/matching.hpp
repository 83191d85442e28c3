// What every transport does alike when it matches messages: how it files a message (key and
// hash), how it marks an operation posted, and the texts of the errors that matching finds, so
// that every transport reports the same disagreement with the same words.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

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

/// The nodes of a node-based map (std::unordered_map, std::multimap) that entries left, kept for
/// the next entries (at most `kept` of them), so that a table whose entries come and go a message
/// at a time stops allocating once it has held its usual number.
template <class Map, std::size_t kept = 64>
class SpareNodes {
 public:
  using iterator = typename Map::iterator;
  /// Inserts key -> value into `map` (a key a unique map holds already keeps its entry, as
  /// emplace does), in a kept node where there is one.
  iterator insert(Map& map, const typename Map::key_type& key, typename Map::mapped_type value) {
    if (spare_.empty()) return position(map.emplace(key, std::move(value)));
    typename Map::node_type node = std::move(spare_.back());
    spare_.pop_back();
    node.key() = key;
    node.mapped() = std::move(value);
    return position(map.insert(std::move(node)));
  }
  /// Removes the entry at `it` from `map`, keeping its node; returns its value.
  typename Map::mapped_type take(Map& map, iterator it) {
    typename Map::node_type node = map.extract(it);
    typename Map::mapped_type value = std::move(node.mapped());
    if (spare_.size() < kept) {
      if (spare_.capacity() == 0) spare_.reserve(kept);
      spare_.push_back(std::move(node));
    }
    return value;
  }

 private:
  // Where an insertion put its entry: a multimap returns it, a unique map's emplace a pair and its
  // insertion of a node an insert_return_type.
  template <class Result>
  static iterator position(Result&& result) {
    if constexpr (std::is_same_v<std::decay_t<Result>, iterator>)
      return result;
    else if constexpr (requires { result.position; })
      return result.position;
    else
      return result.first;
  }
  std::vector<typename Map::node_type> spare_;
};

/// Posted operations or early messages, by the message they wait for. put/take recycle nodes
/// (SpareNodes); the map's own members work as ever.
template <class T>
class MatchTable : public std::unordered_map<MatchKey, T, MatchKeyHash> {
  using Map = std::unordered_map<MatchKey, T, MatchKeyHash>;

 public:
  /// (*this)[key] = value.
  T& put(const MatchKey& key, T value) {
    if (auto it = this->find(key); it != this->end()) {
      it->second = std::move(value);
      return it->second;
    }
    return spares_.insert(*this, key, std::move(value))->second;
  }
  /// Removes the entry at `it` and returns its value.
  T take(typename Map::iterator it) { return spares_.take(*this, it); }

 private:
  SpareNodes<Map> spares_;
};

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
