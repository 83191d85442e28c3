// Where the ranks of a communicator live: the host of every rank, and what follows from it
// (hosts, local index, local size). Hierarchical algorithms and the algorithm choice read it.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace tutti::comm {

/// This process's host as topology sees it: TUTTI_HOST if set (emulates several hosts on one
/// machine), else gethostname().
std::string topology_host_name();

/// A 64-bit hash of a host name (FNV-1a): what ranks exchange to learn the topology.
std::uint64_t hash_host(std::string_view name);

class Topology {
 public:
  /// `host_of_rank[r]` identifies rank r's host (e.g. hash_host of its name).
  explicit Topology(std::vector<std::uint64_t> host_of_rank);

  int size() const { return static_cast<int>(host_of_rank_.size()); }
  int host_count() const { return static_cast<int>(host_sizes_.size()); }
  /// Index of the rank's host among the distinct hosts, in order of each host's lowest rank.
  int host_index(int rank) const { return host_index_[static_cast<std::size_t>(rank)]; }
  /// Position of the rank among the ranks of its host, in rank order.
  int local_index(int rank) const { return local_index_[static_cast<std::size_t>(rank)]; }
  int local_size(int rank) const { return host_sizes_[static_cast<std::size_t>(host_index(rank))]; }
  int max_local_size() const;
  /// Every host has the same number of ranks.
  bool uniform() const;
  /// L where the ranks span hosts in blocks of L (ranks [h·L, (h+1)·L) on host h) with at least 2
  /// hosts and L ≥ 2; else 0. Then the cost model prices the hosts' links and chooses hierarchical
  /// allreduce where it pays (choice::ChoiceContext::ranks_per_host), and reduce_scatter's
  /// Rabenseifner and allgather's recursive doubling order their rounds so that the links carry
  /// the least (schedule::Params::ranks_per_host). Found once, at construction.
  int blocked_ranks_per_host() const { return blocked_; }
  /// Several hosts, and several ranks on one of them: hierarchical allreduce has something to do.
  bool spans_hosts_with_neighbours() const { return host_count() >= 2 && max_local_size() >= 2; }
  /// The topology of a communicator made of `ranks` (its rank i is our rank ranks[i]).
  Topology subset(std::span<const int> ranks) const;

 private:
  std::vector<std::uint64_t> host_of_rank_;
  std::vector<int> host_index_;
  std::vector<int> local_index_;
  std::vector<int> host_sizes_;
  int blocked_ = 0;
};

/// The automatic choice where the ranks do not lie in blocks: hierarchical allreduce pays off when the ranks span
/// several hosts, some host has several ranks, and the message is large enough for bandwidth to dominate.
bool prefers_hierarchical(const Topology& topology, std::size_t bytes);

}  // namespace tutti::comm
