#include "bench/device_collectives.hpp"

#include <algorithm>
#include <iterator>
#include <stdexcept>
#include <string_view>

#include "core/names.hpp"

namespace tutti::bench {

namespace {

// One row per collective of gpu::Communicator (include/tutti/gpu.hpp).
constexpr DeviceCollective table[] = {
    {Collective::allreduce, [](gpu::Communicator& g, const Case& c, const void* send, void* recv, gpu::Stream s,
                               const Options& o) { g.allreduce(send, recv, c.count, c.type, c.op, s, o); }},
    {Collective::reduce_scatter, [](gpu::Communicator& g, const Case& c, const void* send, void* recv, gpu::Stream s,
                                    const Options& o) { g.reduce_scatter(send, recv, c.count, c.type, c.op, s, o); }},
    {Collective::allgather, [](gpu::Communicator& g, const Case& c, const void* send, void* recv, gpu::Stream s,
                               const Options& o) { g.allgather(send, recv, c.count, c.type, s, o); }},
    {Collective::broadcast, [](gpu::Communicator& g, const Case& c, const void*, void* recv, gpu::Stream s,
                               const Options& o) { g.broadcast(recv, c.count, c.type, c.root, s, o); }},
    {Collective::reduce, [](gpu::Communicator& g, const Case& c, const void* send, void* recv, gpu::Stream s,
                            const Options& o) { g.reduce(send, recv, c.count, c.type, c.op, c.root, s, o); }},
    {Collective::alltoall, [](gpu::Communicator& g, const Case& c, const void* send, void* recv, gpu::Stream s,
                              const Options& o) { g.alltoall(send, recv, c.count, c.type, s, o); }},
};

// The backends gpu::Communicator has (Options::algorithm picks one); the others are refused here
// with the list, before any rank enqueues.
constexpr std::string_view available_backends[] = {"automatic", "host_transfer", "ipc", "nccl"};
constexpr std::string_view known_backends[] = {"automatic", "host_transfer", "ipc", "nccl"};

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
  if (std::ranges::find(available_backends, backend) != std::end(available_backends)) return;
  if (std::ranges::find(known_backends, backend) != std::end(known_backends))
    throw std::invalid_argument("--backend: gpu::Communicator has no " + backend + " backend yet (it has " +
                                join(available_backends) + ")");
  throw std::invalid_argument("--backend: unknown backend '" + backend + "' (" + join(known_backends) + ")");
}

Options device_options(const std::string& backend) {
  check_backend(backend);
  return Options{.algorithm = *core::algorithm_from_name(backend)};
}

}  // namespace tutti::bench
