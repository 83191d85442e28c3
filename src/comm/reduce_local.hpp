// tutti::reduce_local's argument check, which gpu::Communicator::reduce_local shares.
#pragma once

#include "tutti/types.hpp"

namespace tutti::comm {

/// Error(invalid_argument) for ReduceOp::avg, which is no element-wise operation.
void check_local_op(ReduceOp op);

}  // namespace tutti::comm
