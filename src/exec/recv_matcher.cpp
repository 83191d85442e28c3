#include "exec/recv_matcher.hpp"

#include <algorithm>

namespace tutti::exec {

transport::MessageKey RecvMatcher::next_key(int peer, int tag) const {
  const auto it = next_index_.find({peer, tag});
  return transport::MessageKey{transport::Channel::point_to_point, static_cast<std::uint64_t>(tag),
                               it == next_index_.end() ? 0 : it->second};
}

transport::MessageKey RecvMatcher::take_key(int peer, int tag) {
  const std::uint32_t index = next_index_[{peer, tag}]++;
  return transport::MessageKey{transport::Channel::point_to_point, static_cast<std::uint64_t>(tag), index};
}

bool RecvMatcher::direct(int peer, int tag) const {
  const auto queued = queued_.find(tag);
  if (queued != queued_.end() && !queued->second.empty()) return false;
  const auto kept = kept_.find({peer, tag});
  return kept == kept_.end() || kept->second.empty();
}

void RecvMatcher::keep(int peer, int tag, std::unique_ptr<std::byte[]> data, std::size_t bytes) {
  kept_[{peer, tag}].push_back(Message{std::move(data), bytes, arrivals_++});
}

std::optional<RecvMatcher::Message> RecvMatcher::take_kept(int peer, int tag) {
  const auto it = kept_.find({peer, tag});
  if (it == kept_.end() || it->second.empty()) return std::nullopt;
  Message message = std::move(it->second.front());
  it->second.pop_front();
  if (it->second.empty()) kept_.erase(it);
  return message;
}

std::optional<std::pair<int, RecvMatcher::Message>> RecvMatcher::take_kept_any(int tag) {
  int best = -1;
  std::uint64_t earliest = 0;
  for (const auto& [key, messages] : kept_)
    if (key.second == tag && !messages.empty() && (best < 0 || messages.front().arrival < earliest)) {
      best = key.first;
      earliest = messages.front().arrival;
    }
  if (best < 0) return std::nullopt;
  return std::pair<int, Message>{best, *take_kept(best, tag)};
}

bool RecvMatcher::at_front(int tag, const Operation* op) const {
  const auto it = queued_.find(tag);
  return it != queued_.end() && !it->second.empty() && it->second.front() == op;
}

bool RecvMatcher::dequeue(int tag, const Operation* op) {
  const auto it = queued_.find(tag);
  if (it == queued_.end()) return false;
  const auto found = std::find(it->second.begin(), it->second.end(), op);
  if (found == it->second.end()) return false;
  it->second.erase(found);
  if (it->second.empty()) queued_.erase(it);
  return true;
}

}  // namespace tutti::exec
