// The entry points of the direct collectives: start_direct (arguments checked, in-place forms
// mapped onto what DirectRun takes), direct_collective, and the shm transport's native collectives.
#include "transport/shm/direct_run.hpp"

#include <string>

namespace tutti::transport::shm {

namespace {

ReduceOp required_op(Collective kind, std::optional<ReduceOp> op) {
  if (!op)
    throw Error(ErrorCode::invalid_argument,
                "shm direct " + std::string(to_string(kind)) + ": a reduction needs an op");
  return *op;
}

}  // namespace

std::unique_ptr<DirectCollective> start_direct(Transport& transport, Collective kind, const void* send, void* recv,
                                               std::size_t count, DataType type, std::optional<ReduceOp> op, int root,
                                               std::chrono::milliseconds timeout) {
  if (!is_shm(transport)) return nullptr;
  auto* shm = static_cast<ShmTransport*>(&transport);
  if (!serves(kind))
    throw Error(ErrorCode::unsupported, "shm direct: no direct algorithm for " + std::string(to_string(kind)));
  // A rank's part of a data set must hold one element of each of the p blocks.
  if (kind == Collective::reduce_scatter &&
      shm->segment().layout().direct_chunk / size_of(type) < std::size_t(shm->size()))
    throw Error(ErrorCode::unsupported, "shm direct reduce_scatter: too many ranks for the data area");
  if (kind == Collective::broadcast && (root < 0 || root >= shm->size()))
    throw Error(ErrorCode::invalid_argument, "shm direct broadcast: root " + std::to_string(root) +
                                                 " is out of range for size " + std::to_string(shm->size()));
  const bool reduces = kind == Collective::allreduce || kind == Collective::reduce_scatter;
  const ReduceOp reduce_op = reduces ? required_op(kind, op) : ReduceOp::sum;
  // The in-place forms, mapped onto the forms DirectRun takes.
  const auto* in = static_cast<const std::byte*>(send);
  auto* out = static_cast<std::byte*>(recv);
  const std::size_t block = static_cast<std::size_t>(shm->rank()) * count * size_of(type);
  std::unique_ptr<std::byte[]> staging;
  if (kind == Collective::allgather && send == recv) in = out + block;
  if (kind == Collective::reduce_scatter && send == recv && block != 0 && count > 0) {
    staging = std::make_unique_for_overwrite<std::byte[]>(count * size_of(type));
    out = staging.get();
  }
  auto run = std::make_unique<DirectRun>(*shm, kind, in, out, count, type, reduce_op, root, timeout);
  if (staging) run->deliver_to(static_cast<std::byte*>(recv), std::move(staging));
  return run;
}

bool serves(Collective kind) {
  return kind == Collective::allreduce || kind == Collective::reduce_scatter || kind == Collective::allgather ||
         kind == Collective::broadcast;
}

bool direct_collective(Transport& transport, Collective kind, const void* send, void* recv, std::size_t count,
                       DataType type, std::optional<ReduceOp> op, int root, std::chrono::milliseconds timeout) {
  auto run = start_direct(transport, kind, send, recv, count, type, op, root, timeout);
  if (!run) return false;
  Signature signature;  // for the errors only: nothing was announced
  signature.seq = no_seq;
  signature.collective = kind;
  signature.count = count;
  signature.type = type;
  signature.op = op;
  signature.root = root;
  signature.algorithm = Algorithm::direct;
  transport::finish(*run, transport, signature, timeout);
  return true;
}

bool ShmTransport::serves_natively(Algorithm algorithm, Collective collective) const {
  return algorithm == Algorithm::direct && serves(collective);
}

std::unique_ptr<NativeCollective> ShmTransport::start_native(Algorithm algorithm, const NativeCall& call,
                                                             std::chrono::milliseconds timeout) {
  if (!serves_natively(algorithm, call.collective)) return Transport::start_native(algorithm, call, timeout);
  return start_direct(*this, call.collective, call.send, call.recv, call.count, call.type, call.op, call.root, timeout);
}

// By kind, not dynamic_cast: this is on every direct call's path.
bool is_shm(const Transport& transport) { return transport.kind() == Kind::shm; }

}  // namespace tutti::transport::shm
