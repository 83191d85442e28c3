#include "comm/topology.hpp"

#include <unistd.h>

#include <algorithm>
#include <map>

#include "core/env.hpp"
#include "tutti/types.hpp"

namespace tutti::comm {

namespace {
// Below this, latency dominates and the flat algorithms' fewer rounds win.
constexpr std::size_t hierarchical_min_bytes = 64 * 1024;
}  // namespace

std::string topology_host_name() {
  if (auto host = core::env("TUTTI_HOST")) return *host;
  char name[256] = {};
  if (::gethostname(name, sizeof(name) - 1) != 0) return "localhost";
  return name;
}

std::uint64_t hash_host(std::string_view name) { return tutti::detail::fnv1a(name); }

Topology::Topology(std::vector<std::uint64_t> host_of_rank) : host_of_rank_(std::move(host_of_rank)) {
  std::map<std::uint64_t, int> index_of_host;
  for (std::uint64_t host : host_of_rank_) {
    const auto [it, added] = index_of_host.try_emplace(host, static_cast<int>(host_sizes_.size()));
    if (added) host_sizes_.push_back(0);
    host_index_.push_back(it->second);
    local_index_.push_back(host_sizes_[static_cast<std::size_t>(it->second)]++);
  }
  const int per_host = max_local_size();
  bool blocked = host_count() >= 2 && per_host >= 2 && uniform();
  for (int r = 0; blocked && r < size(); ++r) blocked = host_index(r) == r / per_host;
  blocked_ = blocked ? per_host : 0;
}

int Topology::max_local_size() const {
  return host_sizes_.empty() ? 0 : *std::max_element(host_sizes_.begin(), host_sizes_.end());
}

bool Topology::uniform() const {
  return std::all_of(host_sizes_.begin(), host_sizes_.end(), [&](int s) { return s == host_sizes_.front(); });
}

Topology Topology::subset(std::span<const int> ranks) const {
  std::vector<std::uint64_t> hosts;
  for (int r : ranks) hosts.push_back(host_of_rank_[static_cast<std::size_t>(r)]);
  return Topology(std::move(hosts));
}

bool prefers_hierarchical(const Topology& topology, std::size_t bytes) {
  return topology.spans_hosts_with_neighbours() && bytes >= hierarchical_min_bytes;
}

}  // namespace tutti::comm
