// tutti.horovod._horovod: the C++ half of tutti.horovod.torch (python/tutti/horovod/torch/), which
// holds the API; this module only starts collectives on torch tensors and returns handles.
#include <torch/extension.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/errors.hpp"
#include "common/py_store.hpp"
#include "common/storage_pin.hpp"
#include "horovod/context.hpp"

namespace py = pybind11;

namespace tutti_python::horovod {

namespace {

// Created by init(), destroyed by shutdown(). Never destroyed at exit: that would be collective,
// and a rank leaving on an error would wait for peers that are waiting for it (the Python module
// calls shutdown() at exit unless an exception is on its way out).
Context* context = nullptr;

Context& ctx() {
  if (!context)
    throw tutti::Error(tutti::ErrorCode::invalid_argument,
                       "tutti.horovod.torch has not been initialized; call hvd.init() first");
  return *context;
}

/// `name`, or the name Horovod gives an unnamed operation (the same on every rank that issues the
/// same operations in the same order).
std::string name_of(const std::optional<std::string>& name, const char* kind, int handle) {
  if (name && !name->empty()) return *name;
  return std::string(kind) + ".noname." + std::to_string(handle);
}

template <class Start>
int start(const std::optional<std::string>& name, const char* kind, Start&& start_op) {
  Context& c = ctx();
  const int handle = c.next_handle();
  c.add(handle, start_op(c, name_of(name, kind, handle)));
  return handle;
}

void init(std::optional<std::size_t> fusion_threshold, std::optional<double> cycle_time_ms,
          std::optional<std::string> timeline, const py::object& store, std::optional<int> rank,
          std::optional<int> size) {
  if (context) return;  // as Horovod: a second init() is a no-op
  HorovodSettings settings{fusion_threshold, cycle_time_ms, timeline};
  tutti::Communicator world = join(store, rank, size, std::nullopt);  // waits for the others without the GIL
  py::gil_scoped_release release;
  context = new Context(settings, std::move(world));
}

void shutdown() {
  if (!context) return;
  std::unique_ptr<Context> doomed(context);
  context = nullptr;
  py::gil_scoped_release release;  // collective: waits for the other ranks' engines
  doomed.reset();
}

/// Horovod's join, the part Tutti can do: blocks until every rank has called join(); returns the
/// rank whose call came last (by the wall clock of each rank's host).
int join() {
  static int joins = 0;
  Context& c = ctx();
  const std::int64_t now =
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch()).count();
  auto send = ::torch::tensor({now}, ::torch::kLong);
  const int handle = c.next_handle();
  c.add(handle, start_allgather(c.engine(), "join." + std::to_string(joins++), send));
  const ::torch::Tensor times = c.synchronize(handle).at(0);
  return static_cast<int>(times.argmax().item<std::int64_t>());
}

}  // namespace

}  // namespace tutti_python::horovod

PYBIND11_MODULE(_horovod, m) {
  using namespace tutti_python::horovod;
  m.doc() = "C++ half of tutti.horovod.torch: collectives on torch tensors over Tutti's training engine";
  tutti_python::register_error_translator();
  if (!tutti_python::import_storage_pins()) throw py::error_already_set();  // operations pin their tensors' storages
  m.def("init", &init, py::arg("fusion_threshold") = py::none(), py::arg("cycle_time_ms") = py::none(),
        py::arg("timeline") = py::none(), py::arg("store") = py::none(), py::arg("rank") = py::none(),
        py::arg("size") = py::none(),
        "Joins the job (collective): the launcher's, or through `store` (torch.distributed.Store's methods) as "
        "`rank` of `size`; the other arguments replace TUTTI_FUSION_THRESHOLD, TUTTI_CYCLE_TIME_MS and "
        "TUTTI_TIMELINE");
  m.def("shutdown", &shutdown, "Stops the engine (collective)");
  m.def("is_initialized", [] { return context != nullptr; });
  m.def("rank", [] { return ctx().rank(); });
  m.def("size", [] { return ctx().size(); });
  m.def("local_rank", [] { return ctx().local_rank(); });
  m.def("local_size", [] { return ctx().local_size(); });
  m.def("cross_rank", [] { return ctx().cross_rank(); });
  m.def("cross_size", [] { return ctx().cross_size(); });
  m.def(
      "allreduce_async",
      [](::torch::Tensor input, ::torch::Tensor output, std::optional<std::string> name, int op) {
        return start(name, "allreduce", [&](Context& c, const std::string& n) {
          return start_allreduce(c.engine(), n, input, output, op);
        });
      },
      py::arg("input"), py::arg("output"), py::arg("name"), py::arg("op"));
  m.def(
      "broadcast_async",
      [](::torch::Tensor tensor, int root, std::optional<std::string> name) {
        return start(name, "broadcast",
                     [&](Context& c, const std::string& n) { return start_broadcast(c.engine(), n, tensor, root); });
      },
      py::arg("tensor"), py::arg("root_rank"), py::arg("name"));
  m.def(
      "allgather_async",
      [](::torch::Tensor tensor, std::optional<std::string> name) {
        return start(name, "allgather",
                     [&](Context& c, const std::string& n) { return start_allgather(c.engine(), n, tensor); });
      },
      py::arg("tensor"), py::arg("name"));
  m.def(
      "alltoall_async",
      [](::torch::Tensor tensor, std::optional<::torch::Tensor> splits, std::optional<std::string> name) {
        return start(name, "alltoall", [&](Context& c, const std::string& n) {
          return start_alltoall(c.world(), n, tensor, splits.value_or(::torch::Tensor()));
        });
      },
      py::arg("tensor"), py::arg("splits"), py::arg("name"));
  m.def("poll", [](int handle) { return ctx().poll(handle); });
  m.def("synchronize", [](int handle) { return ctx().synchronize(handle); });
  m.def("pending", [] { return ctx().pending(); });
  m.def("join", &join);
  m.def(
      "stats",
      [] {
        const tutti::EngineStats s = ctx().engine().stats();
        return py::dict(py::arg("tensors") = s.tensors, py::arg("collectives") = s.collectives,
                        py::arg("bytes") = s.bytes, py::arg("cycles") = s.cycles);
      },
      "The engine's counters since init: tensors completed, collective calls made for them (a fused "
      "message counts once), bytes, negotiation rounds");
  m.def(
      "engine_options",
      [] {
        const tutti::EngineOptions& o = ctx().engine().options();
        return py::dict(py::arg("fusion_threshold") = o.fusion_threshold,
                        py::arg("cycle_time_us") = o.cycle_time.count(), py::arg("timeline") = o.timeline_path);
      },
      "The engine's settings in force");
  m.def("barrier", [] {
    Context& c = ctx();
    py::gil_scoped_release release;
    c.world().barrier();
  });
}
