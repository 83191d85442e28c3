// One rank's side of the negotiation (Ledger, negotiation.hpp): the tensors it holds on the
// response cache's path, its part of the cycle's allreduce, and what it announces in a full exchange.
#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "engine/negotiation.hpp"

namespace tutti::engine {

void Ledger::enqueue(const Descriptor& d, const Table& table, Clock::time_point since) {
  if (!table.has_entry(d.name))
    if (const auto slot = table.cached_slot(d); slot && held_.emplace(*slot, Held{d, since}).second) {
      fresh_ = true;
      return;
    }
  unannounced_.push_back(Held{d, since});
}

bool Ledger::needs_exchange(Clock::time_point stale) const {
  return !unannounced_.empty() ||
         std::any_of(held_.begin(), held_.end(), [&](const auto& h) { return h.second.since < stale; });
}

std::vector<std::uint32_t> Ledger::contribution(const Table& table, bool exchange, bool waiting) const {
  std::vector<std::uint32_t> v(Tally::kHeader + table.cache_size(), 0);
  v[0] = exchange ? 1 : 0;
  v[1] = waiting ? 1 : 0;
  v[2] = fresh_ ? 1 : 0;
  v[3] = static_cast<std::uint32_t>(table.cache_size());
  v[4] = table.cache_hash();
  for (const auto& [slot, h] : held_) v.at(Tally::kHeader + slot) = 1;
  return v;
}

std::vector<std::pair<std::string, Ledger::Clock::time_point>> Ledger::announce(const Tally& tally, const Table& table,
                                                                                Message& m) {
  std::vector<std::pair<std::string, Clock::time_point>> moved;
  for (const auto& [slot, h] : held_) {
    if (tally.pending.at(slot) == static_cast<std::uint32_t>(table.size())) continue;  // ready everywhere
    m.cached.push_back(slot);
    moved.emplace_back(h.descriptor.name, h.since);
  }
  for (auto& u : unannounced_) {
    if (const auto slot = table.cached_slot(u.descriptor))
      m.cached.push_back(*slot);
    else
      m.described.push_back(std::move(u.descriptor));
  }
  unannounced_.clear();
  std::sort(m.cached.begin(), m.cached.end());
  return moved;
}

void Ledger::settle(const Tally& tally, bool exchanged, std::size_t ranks) {
  fresh_ = false;
  if (exchanged) {
    held_.clear();  // ready, or moved to the table
    return;
  }
  std::erase_if(held_, [&](const auto& h) { return tally.pending.at(h.first) == ranks; });
}

}  // namespace tutti::engine
