// What a public Request holds: the operation and the queue that progresses it.
#pragma once

#include <memory>

#include "exec/queue.hpp"

namespace tutti::detail {

class Operation {
 public:
  Operation(std::shared_ptr<exec::OperationQueue> queue, std::shared_ptr<exec::Operation> op)
      : queue(std::move(queue)), op(std::move(op)) {}
  std::shared_ptr<exec::OperationQueue> queue;
  std::shared_ptr<exec::Operation> op;
};

}  // namespace tutti::detail
