// tutti::host_layout: the public face of the communicator's Topology (comm/topology.hpp).
#include "comm/access.hpp"
#include "comm/comm_impl.hpp"
#include "tutti/topology.hpp"

namespace tutti {

HostLayout host_layout(const Communicator& comm) {
  if (comm::Access::impl(comm) == nullptr || comm.size() < 1)
    throw Error(ErrorCode::invalid_argument, "host_layout: the communicator is empty");
  const comm::Topology& topology = comm::Access::impl(comm)->topology();
  const int rank = comm.rank();
  HostLayout out;
  out.host_count = topology.host_count();
  out.host = topology.host_index(rank);
  out.local_rank = topology.local_index(rank);
  out.local_size = topology.local_size(rank);
  for (int r = 0; r < topology.size(); ++r) out.host_of_rank.push_back(topology.host_index(r));
  return out;
}

}  // namespace tutti
