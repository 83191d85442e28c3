// sparse::Communicator: nonblocking sparse collectives. Why a progress thread over a private
// split rather than a state machine of nonblocking point-to-point Requests: every algorithm
// exchanges sizes before data and sizes its buffers from them, merges between rounds, and calls
// the host's collectives (alltoallv, allgatherv) whose arguments depend on the previous step; as
// a state machine each would be several states per round, written twice (blocking and not).
// Running the blocking code on one thread per object, in issue order, over a duplicate of the
// host communicator (as gpu::Communicator's host_transfer does) keeps one code path, keeps the
// host free for the caller's own calls, and orders the sparse calls the same on every rank.
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <utility>

#include "tutti/sparse.hpp"

namespace tutti::sparse {

namespace detail {

class Queue {
 public:
  explicit Queue(tutti::Communicator& host) : comm_(host.split(0, host.rank())) {
    thread_ = std::thread([this] { run(); });
  }
  ~Queue() {
    {
      std::lock_guard lock(mutex_);
      stopping_ = true;
    }
    wake_.notify_one();
    thread_.join();
  }
  tutti::Communicator& comm() { return comm_; }

  template <class R>
  Request<R> submit(std::function<R(tutti::Communicator&)> work) {
    auto task = std::make_shared<std::packaged_task<R()>>([this, work = std::move(work)] { return work(comm_); });
    Request<R> request(task->get_future());
    {
      std::lock_guard lock(mutex_);
      tasks_.emplace_back([task] { (*task)(); });
    }
    wake_.notify_one();
    return request;
  }

 private:
  // Runs the tasks in order; a task's failure is its own request's (packaged_task keeps it), so
  // the next task still runs: its peers issued it too.
  void run() {
    for (;;) {
      std::function<void()> task;
      {
        std::unique_lock lock(mutex_);
        wake_.wait(lock, [this] { return stopping_ || !tasks_.empty(); });
        if (tasks_.empty()) return;
        task = std::move(tasks_.front());
        tasks_.pop_front();
      }
      task();
    }
  }

  tutti::Communicator comm_;
  std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<std::function<void()>> tasks_;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace detail

Communicator::Communicator(tutti::Communicator& host) : queue_(std::make_unique<detail::Queue>(host)) {}
Communicator::~Communicator() = default;
Communicator::Communicator(Communicator&&) noexcept = default;
Communicator& Communicator::operator=(Communicator&&) noexcept = default;

detail::Queue& Communicator::checked() const {
  if (!queue_) throw Error(ErrorCode::invalid_argument, "sparse::Communicator: used after it was moved from");
  return *queue_;
}

int Communicator::rank() const { return checked().comm().rank(); }
int Communicator::size() const { return checked().comm().size(); }

Request<Result> Communicator::iallreduce(const Vector& input, ReduceOp op, const Options& options) {
  return iallreduce(input, op, options, Result{});
}

Request<Result> Communicator::iallreduce(const Vector& input, ReduceOp op, const Options& options, Result&& recycled) {
  // Left empty at once, as the blocking call leaves it.
  return checked().submit<Result>(
      [input, op, options, spare = std::exchange(recycled, {})](tutti::Communicator& comm) mutable {
        return sparse_allreduce(comm, input, op, options, std::move(spare));
      });
}

Request<GatherResult> Communicator::iallgather(const Vector& input, ReduceOp op, const Options& options) {
  return checked().submit<GatherResult>(
      [input, op, options](tutti::Communicator& comm) { return sparse_allgather(comm, input, op, options); });
}

Result Communicator::allreduce(const Vector& input, ReduceOp op, const Options& options) {
  return iallreduce(input, op, options).wait();
}

Result Communicator::allreduce(const Vector& input, ReduceOp op, const Options& options, Result&& recycled) {
  return iallreduce(input, op, options, std::move(recycled)).wait();
}

GatherResult Communicator::allgather(const Vector& input, ReduceOp op, const Options& options) {
  return iallgather(input, op, options).wait();
}

}  // namespace tutti::sparse
