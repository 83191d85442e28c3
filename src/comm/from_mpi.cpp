// tutti::from_mpi: a communicator over the mpi transport, and the MPI mapping of Tutti's types and
// reductions (built only with MPI).
#include "comm/access.hpp"
#include "comm/comm_impl.hpp"
#include "transport/mpi/mpi_support.hpp"
#include "transport/mpi/mpi_transport.hpp"
#include "tutti/mpi.hpp"

namespace tutti {

Communicator from_mpi(MPI_Comm comm) {
  return comm::Access::make(std::make_shared<comm::CommImpl>(std::make_unique<transport::mpi::MpiTransport>(comm)));
}

MPI_Datatype mpi_datatype(DataType type) { return transport::mpi::datatype(type); }

MPI_Op mpi_op(ReduceOp op, DataType type) { return transport::mpi::reduction(op, type); }

}  // namespace tutti
