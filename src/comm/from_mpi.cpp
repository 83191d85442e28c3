// tutti::from_mpi: a communicator over the mpi transport (built only with MPI).
#include "comm/access.hpp"
#include "comm/comm_impl.hpp"
#include "transport/mpi/mpi_transport.hpp"
#include "tutti/mpi.hpp"

namespace tutti {

Communicator from_mpi(MPI_Comm comm) {
  return comm::Access::make(std::make_shared<comm::CommImpl>(std::make_unique<transport::mpi::MpiTransport>(comm)));
}

}  // namespace tutti
