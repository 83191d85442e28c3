// tutti::from_mpi lives with the MPI transport (the comm layer need not know MPI); it is the one
// place that assembles a communicator over it.
#include "comm/comm_impl.hpp"
#include "transport/mpi/mpi_transport.hpp"
#include "tutti/mpi.hpp"

namespace tutti {

Communicator from_mpi(MPI_Comm comm) {
  return Communicator(std::make_shared<detail::CommImpl>(std::make_unique<transport::mpi::MpiTransport>(comm)));
}

}  // namespace tutti
