#include "bench/device_collectives.hpp"

#include <stdexcept>
#include <string_view>

namespace tutti::bench {

namespace {

// One row per collective of gpu::Communicator (include/tutti/gpu.hpp).
constexpr DeviceCollective table[] = {
    {Collective::allreduce, [](gpu::Communicator& g, const Case& c, const void* send, void* recv, gpu::Stream s,
                               const gpu::Options& o) { g.allreduce(send, recv, c.count, c.type, c.op, s, o); }},
    {Collective::reduce_scatter,
     [](gpu::Communicator& g, const Case& c, const void* send, void* recv, gpu::Stream s, const gpu::Options& o) {
       g.reduce_scatter(send, recv, c.count, c.type, c.op, s, o);
     }},
    {Collective::allgather, [](gpu::Communicator& g, const Case& c, const void* send, void* recv, gpu::Stream s,
                               const gpu::Options& o) { g.allgather(send, recv, c.count, c.type, s, o); }},
    {Collective::broadcast, [](gpu::Communicator& g, const Case& c, const void*, void* recv, gpu::Stream s,
                               const gpu::Options& o) { g.broadcast(recv, c.count, c.type, c.root, s, o); }},
    {Collective::reduce, [](gpu::Communicator& g, const Case& c, const void* send, void* recv, gpu::Stream s,
                            const gpu::Options& o) { g.reduce(send, recv, c.count, c.type, c.op, c.root, s, o); }},
    {Collective::alltoall, [](gpu::Communicator& g, const Case& c, const void* send, void* recv, gpu::Stream s,
                              const gpu::Options& o) { g.alltoall(send, recv, c.count, c.type, s, o); }},
};

// The backends --backend may name, in gpu::Backend's order (their names are gpu::to_string's).
constexpr gpu::Backend backends[] = {gpu::Backend::automatic, gpu::Backend::host_transfer, gpu::Backend::ipc,
                                     gpu::Backend::nccl};

template <class Range>
std::string join(const Range& names) {
  std::string out;
  for (const auto& name : names) out += (out.empty() ? "" : ", ") + std::string(name);
  return out;
}

}  // namespace

std::span<const DeviceCollective> device_collectives() { return table; }

const DeviceCollective* find_device_collective(Kind kind) {
  for (const DeviceCollective& row : table)
    if (kind == row.kind) return &row;
  return nullptr;
}

std::vector<Kind> device_kinds() {
  std::vector<Kind> out;
  for (const DeviceCollective& row : table) out.push_back(row.kind);
  return out;
}

std::string device_collective_names() {
  std::vector<std::string_view> names;
  for (const DeviceCollective& row : table) names.push_back(tutti::to_string(row.kind));
  return join(names);
}

void check_backend(const std::string& backend) {
  if (gpu::backend_from_name(backend)) return;
  std::vector<std::string_view> names;
  for (gpu::Backend b : backends) names.push_back(gpu::to_string(b));
  throw std::invalid_argument("--backend: unknown backend '" + backend + "' (" + join(names) + ")");
}

gpu::Options device_options(const std::string& backend) {
  check_backend(backend);
  return gpu::Options{*gpu::backend_from_name(backend)};
}

}  // namespace tutti::bench
