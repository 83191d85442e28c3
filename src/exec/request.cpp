#include "exec/request.hpp"

#include "tutti/tutti.hpp"

namespace tutti {

void Request::wait() {
  if (op_) op_->queue->wait(*op_->op, std::nullopt);
}

bool Request::test() { return !op_ || op_->queue->test(*op_->op); }

bool Request::wait_for(std::chrono::milliseconds duration) { return !op_ || op_->queue->wait(*op_->op, duration); }

bool Request::wait_for(std::chrono::milliseconds duration, std::chrono::steady_clock::time_point since) {
  return !op_ || op_->queue->wait(*op_->op, duration, since);
}

int Request::source() const { return op_ ? op_->op->source() : -1; }

}  // namespace tutti
