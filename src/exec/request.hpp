// What a public Request holds: the operation and the queue that progresses it (not itself an
// operation: exec::Operation is the one abstract operation).
#pragma once

#include <memory>

#include "exec/queue.hpp"

namespace tutti::exec {

class RequestState {
 public:
  RequestState(std::shared_ptr<exec::OperationQueue> queue, std::shared_ptr<exec::Operation> op)
      : queue(std::move(queue)), op(std::move(op)) {}
  std::shared_ptr<exec::OperationQueue> queue;
  std::shared_ptr<exec::Operation> op;
};

}  // namespace tutti::exec
