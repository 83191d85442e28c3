// Where a communicator's ranks live: the hosts as Tutti's hierarchical algorithms see them
// (TUTTI_HOST where set, which emulates several hosts on one machine; else the host name).
//
//   const tutti::HostLayout layout = tutti::host_layout(world);   // collective
//   int gpu = layout.local_rank;                                   // one GPU per rank of a host
#pragma once

#include <vector>

#include "tutti/tutti.hpp"

namespace tutti {

struct HostLayout {
  /// Hosts, numbered in order of each host's lowest rank.
  int host_count = 1;
  /// This rank's host.
  int host = 0;
  /// This rank's position among its host's ranks, in rank order, and how many ranks the host has.
  int local_rank = 0;
  int local_size = 1;
  /// The host of every rank of the communicator.
  std::vector<int> host_of_rank;
};

/// The layout of `comm`'s ranks. Collective: every rank calls it, with no other call of `comm` in
/// flight (the first time, the ranks exchange their hosts unless the communicator learned them when
/// it was made, as init()'s do). Error(invalid_argument) for an empty communicator.
HostLayout host_layout(const Communicator& comm);

}  // namespace tutti
