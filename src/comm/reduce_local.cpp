// tutti::reduce_local: the reduction kernels of the collectives, on the calling thread.
#include "comm/reduce_local.hpp"

#include "reduce/reduce.hpp"
#include "tutti/tutti.hpp"

namespace tutti {

void comm::check_local_op(ReduceOp op) {
  if (op == ReduceOp::avg)
    throw Error(ErrorCode::invalid_argument,
                "reduce_local: avg is not element-wise (reduce with sum, then divide by the ranks)");
}

void reduce_local(void* dst, const void* a, const void* b, std::size_t count, DataType type, ReduceOp op) {
  comm::check_local_op(op);
  reduce::apply(op, type, dst, a, b, count);
}

}  // namespace tutti
