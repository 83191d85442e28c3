// The public Communicator: thin wrappers that describe each call and hand it to CommImpl.
#include "comm/access.hpp"
#include "comm/comm_impl.hpp"
#include "core/shared_memory.hpp"
#include "schedule/schedule.hpp"
#include "transport/inproc/inproc.hpp"

namespace tutti {

using comm::Call;
using comm::make_call;

Call comm::make_call(Collective collective, const void* send, void* recv, std::size_t count, DataType type,
                     std::optional<ReduceOp> op, int root, const Options& options, std::span<const std::size_t> counts,
                     std::span<const std::size_t> recv_counts) {
  Call call;
  call.counts = counts;
  call.recv_counts = recv_counts;
  call.collective = collective;
  call.send = send;
  call.recv = recv;
  call.count = count;
  call.type = type;
  call.op = op;
  call.root = root;
  call.options = options;
  return call;
}

namespace {

// The blocking forms pass blocking = true: the caller waits at once and progresses the operation
// itself, so the progress engine is not woken for it.
constexpr bool blocking = true, nonblocking = false;

}  // namespace

comm::CommImpl& Communicator::checked() const {
  if (!impl_) throw Error(ErrorCode::invalid_argument, "the communicator is empty (split with a negative color)");
  return *impl_;
}

void Communicator::check_span_sizes(std::size_t a, std::size_t b, std::size_t factor, const char* message) {
  if (a != b * factor) throw Error(ErrorCode::invalid_argument, message);
}

int Communicator::rank() const { return impl_ ? impl_->rank() : -1; }
int Communicator::size() const { return impl_ ? impl_->size() : 0; }

Request Communicator::iallreduce(const void* send, void* recv, std::size_t count, DataType type, ReduceOp op,
                                 const Options& options) {
  return checked().start(make_call(Collective::allreduce, send, recv, count, type, op, -1, options), nonblocking);
}
Request Communicator::ireduce(const void* send, void* recv, std::size_t count, DataType type, ReduceOp op, int root,
                              const Options& options) {
  return checked().start(make_call(Collective::reduce, send, recv, count, type, op, root, options), nonblocking);
}
Request Communicator::ireduce_scatter(const void* send, void* recv, std::size_t recv_count, DataType type, ReduceOp op,
                                      const Options& options) {
  return checked().start(make_call(Collective::reduce_scatter, send, recv, recv_count, type, op, -1, options),
                         nonblocking);
}
Request Communicator::iallgather(const void* send, void* recv, std::size_t send_count, DataType type,
                                 const Options& options) {
  return checked().start(make_call(Collective::allgather, send, recv, send_count, type, std::nullopt, -1, options),
                         nonblocking);
}
Request Communicator::iallgatherv(const void* send, std::size_t send_count, void* recv,
                                  std::span<const std::size_t> recv_counts, DataType type, const Options& options) {
  return checked().start(
      make_call(Collective::allgatherv, send, recv, send_count, type, std::nullopt, -1, options, recv_counts),
      nonblocking);
}
Request Communicator::ibroadcast(void* buffer, std::size_t count, DataType type, int root, const Options& options) {
  return checked().start(make_call(Collective::broadcast, buffer, buffer, count, type, std::nullopt, root, options),
                         nonblocking);
}
Request Communicator::ialltoall(const void* send, void* recv, std::size_t count_per_rank, DataType type,
                                const Options& options) {
  return checked().start(make_call(Collective::alltoall, send, recv, count_per_rank, type, std::nullopt, -1, options),
                         nonblocking);
}
Request Communicator::ialltoallv(const void* send, std::span<const std::size_t> send_counts, void* recv,
                                 std::span<const std::size_t> recv_counts, DataType type, const Options& options) {
  return checked().start(
      make_call(Collective::alltoallv, send, recv, 0, type, std::nullopt, -1, options, send_counts, recv_counts),
      nonblocking);
}
Request Communicator::igather(const void* send, void* recv, std::size_t send_count, DataType type, int root,
                              const Options& options) {
  return checked().start(make_call(Collective::gather, send, recv, send_count, type, std::nullopt, root, options),
                         nonblocking);
}
Request Communicator::iscatter(const void* send, void* recv, std::size_t recv_count, DataType type, int root,
                               const Options& options) {
  return checked().start(make_call(Collective::scatter, send, recv, recv_count, type, std::nullopt, root, options),
                         nonblocking);
}
Request Communicator::ibarrier(const Options& options) {
  return checked().start(make_call(Collective::barrier, nullptr, nullptr, 0, DataType::u8, std::nullopt, -1, options),
                         nonblocking);
}
Request Communicator::isend(const void* data, std::size_t count, DataType type, int peer, int tag) {
  return checked().start_point_to_point(true, data, count, type, peer, tag, nonblocking);
}
Request Communicator::irecv(void* data, std::size_t count, DataType type, int peer, int tag) {
  return checked().start_point_to_point(false, data, count, type, peer, tag, nonblocking);
}

void Communicator::allreduce(const void* send, void* recv, std::size_t count, DataType type, ReduceOp op,
                             const Options& options) {
  checked().start(make_call(Collective::allreduce, send, recv, count, type, op, -1, options), blocking).wait();
}
void Communicator::reduce(const void* send, void* recv, std::size_t count, DataType type, ReduceOp op, int root,
                          const Options& options) {
  checked().start(make_call(Collective::reduce, send, recv, count, type, op, root, options), blocking).wait();
}
void Communicator::reduce_scatter(const void* send, void* recv, std::size_t recv_count, DataType type, ReduceOp op,
                                  const Options& options) {
  checked()
      .start(make_call(Collective::reduce_scatter, send, recv, recv_count, type, op, -1, options), blocking)
      .wait();
}
void Communicator::allgather(const void* send, void* recv, std::size_t send_count, DataType type,
                             const Options& options) {
  checked()
      .start(make_call(Collective::allgather, send, recv, send_count, type, std::nullopt, -1, options), blocking)
      .wait();
}
void Communicator::allgatherv(const void* send, std::size_t send_count, void* recv,
                              std::span<const std::size_t> recv_counts, DataType type, const Options& options) {
  checked()
      .start(make_call(Collective::allgatherv, send, recv, send_count, type, std::nullopt, -1, options, recv_counts),
             blocking)
      .wait();
}
void Communicator::broadcast(void* buffer, std::size_t count, DataType type, int root, const Options& options) {
  checked()
      .start(make_call(Collective::broadcast, buffer, buffer, count, type, std::nullopt, root, options), blocking)
      .wait();
}
void Communicator::alltoall(const void* send, void* recv, std::size_t count_per_rank, DataType type,
                            const Options& options) {
  checked()
      .start(make_call(Collective::alltoall, send, recv, count_per_rank, type, std::nullopt, -1, options), blocking)
      .wait();
}
void Communicator::alltoallv(const void* send, std::span<const std::size_t> send_counts, void* recv,
                             std::span<const std::size_t> recv_counts, DataType type, const Options& options) {
  checked()
      .start(make_call(Collective::alltoallv, send, recv, 0, type, std::nullopt, -1, options, send_counts, recv_counts),
             blocking)
      .wait();
}
void Communicator::gather(const void* send, void* recv, std::size_t send_count, DataType type, int root,
                          const Options& options) {
  checked()
      .start(make_call(Collective::gather, send, recv, send_count, type, std::nullopt, root, options), blocking)
      .wait();
}
void Communicator::scatter(const void* send, void* recv, std::size_t recv_count, DataType type, int root,
                           const Options& options) {
  checked()
      .start(make_call(Collective::scatter, send, recv, recv_count, type, std::nullopt, root, options), blocking)
      .wait();
}
void Communicator::barrier(const Options& options) {
  checked()
      .start(make_call(Collective::barrier, nullptr, nullptr, 0, DataType::u8, std::nullopt, -1, options), blocking)
      .wait();
}
void Communicator::send(const void* data, std::size_t count, DataType type, int peer, int tag) {
  checked().run_point_to_point(true, data, count, type, peer, tag);
}
int Communicator::recv(void* data, std::size_t count, DataType type, int peer, int tag) {
  return checked().run_point_to_point(false, data, count, type, peer, tag);
}

int Communicator::sendrecv(const void* send, std::size_t send_count, int dest, void* recv, std::size_t recv_count,
                           int source, DataType type, int send_tag, int recv_tag) {
  return checked().sendrecv(send, send_count, dest, recv, recv_count, source, type, send_tag, recv_tag);
}

Communicator Communicator::split(int color, int key) const { return checked().split(color, key); }

std::string_view Communicator::transport_name() const { return checked().transport_name(); }

Algorithm Communicator::chosen_algorithm(Collective collective, std::size_t bytes, Algorithm requested) const {
  return checked().chosen_algorithm(collective, requested, bytes);
}

bool Communicator::serves_direct(Collective collective) const { return checked().direct_serves(collective); }

std::vector<Algorithm> Communicator::algorithms(Collective collective) const {
  const comm::CommImpl& impl = checked();
  std::vector<Algorithm> out{Algorithm::automatic};
  for (Algorithm a : schedule::algorithms_for(collective)) out.push_back(a);
  if (impl.direct_serves(collective)) out.push_back(Algorithm::direct);
  if (impl.transport_kind() == transport::Kind::mpi) out.push_back(Algorithm::mpi);
  if (collective == Collective::allreduce && impl.spans_hosts_with_neighbours()) out.push_back(Algorithm::hierarchical);
  return out;
}

SharedBuffer::SharedBuffer(std::shared_ptr<core::SharedRegion> region)
    : region_(std::move(region)), data_(region_ ? region_->base() : nullptr), size_(region_ ? region_->bytes() : 0) {}

SharedBuffer Communicator::allocate(std::size_t bytes) const { return SharedBuffer(core::SharedRegion::create(bytes)); }

std::vector<Communicator> local_group(int p) {
  if (p < 1) throw Error(ErrorCode::invalid_argument, "local_group: p must be at least 1, got " + std::to_string(p));
  std::vector<Communicator> out;
  for (auto& transport : transport::inproc::make_group(p))
    out.push_back(comm::Access::make(std::make_shared<comm::CommImpl>(std::move(transport))));
  return out;
}

}  // namespace tutti
