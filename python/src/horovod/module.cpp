// tutti.horovod._horovod: the C++ half of tutti.horovod.torch (python/tutti/horovod/torch/), which
// holds the API; this module only starts collectives on torch tensors and returns handles.
#include <torch/extension.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/communicator_capsule.hpp"
#include "common/errors.hpp"
#include "common/py_store.hpp"
#include "common/storage_pin.hpp"
#include "horovod/context.hpp"
#include "tutti/elastic.hpp"

namespace py = pybind11;

namespace tutti_python::horovod {

namespace {

// Created by init(), destroyed by shutdown(). Never destroyed at exit: that would be collective,
// and a rank leaving on an error would wait for peers that are waiting for it (the Python module
// calls shutdown() at exit unless an exception is on its way out).
Context* context = nullptr;
// In an elastic job (tutti-run --elastic sets TUTTI_ELASTIC=1; a joiner has TUTTI_ELASTIC_JOIN=1):
// the job's membership, and the settings the context is rebuilt with in every generation.
std::unique_ptr<tutti::elastic::Job> elastic_job;
HorovodSettings elastic_settings;

tutti::elastic::Job& elastic() {
  if (!elastic_job)
    throw tutti::Error(tutti::ErrorCode::invalid_argument,
                       "tutti.horovod.torch.elastic: not an elastic job (start it with tutti-run --elastic)");
  return *elastic_job;
}

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

/// Starts an operation on process set `set` and returns its handle. Unnamed operations are named
/// by their number among the set's operations on this rank.
template <class Start>
int start(const std::optional<std::string>& name, const char* kind, int set, Start&& start_op) {
  Context& c = ctx();
  ProcessSet& ps = c.process_set(set);
  const std::string op_name = name_of(name, kind, c.next_unnamed(set));
  c.check_not_in_flight(set, kind, op_name);
  const int handle = c.next_handle();
  c.add(handle, set, start_op(ps, op_name), std::string(kind) + " " + op_name);
  return handle;
}

/// The index of job rank `root` in the process set (Horovod's roots are job ranks).
int set_root(const ProcessSet& ps, int root, int set) {
  auto it = std::find(ps.ranks.begin(), ps.ranks.end(), root);
  if (it == ps.ranks.end())
    throw tutti::Error(tutti::ErrorCode::invalid_argument,
                       "tutti.horovod broadcast: root_rank " + std::to_string(root) +
                           " is not a member of process set " + std::to_string(set));
  return static_cast<int>(it - ps.ranks.begin());
}

void init(std::optional<std::size_t> fusion_threshold, std::optional<double> cycle_time_ms,
          std::optional<std::string> timeline, std::optional<double> stall_warning_s,
          std::optional<double> stall_shutdown_s, const py::object& store, std::optional<int> rank,
          std::optional<int> size, const py::object& communicator) {
  if (context) return;  // as Horovod: a second init() is a no-op
  HorovodSettings settings{fusion_threshold, cycle_time_ms, timeline, stall_warning_s, stall_shutdown_s};
  if (elastic_job || (store.is_none() && communicator.is_none() && tutti::elastic::launched_elastic())) {
    py::gil_scoped_release release;  // generation 0's rendezvous, or a joiner's wait to be admitted
    if (!elastic_job) elastic_job = std::make_unique<tutti::elastic::Job>();
    elastic_settings = settings;
    context = new Context(settings, elastic_job->communicator());
    return;
  }
  // A tutti.Communicator the program has (the same group), else the job's: waits for the others
  // without the GIL.
  tutti::Communicator world =
      communicator.is_none() ? join(store, rank, size, std::nullopt) : from_capsule(communicator, "hvd.init: comm");
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

/// Horovod's join: this rank has no more data; until every rank has joined it takes part in the
/// others' allreduces with zeros (the engine answers for it) and their allgathers and broadcasts
/// fail. Blocks (without the GIL; Ctrl-C interrupts it) until every rank has joined; returns the
/// rank that joined last.
int join() {
  Context& c = ctx();
  tutti::Handle h = c.engine().join();
  for (;;) {
    bool done = false;
    {
      py::gil_scoped_release release;
      done = h.wait_for(std::chrono::milliseconds(50));
    }
    if (done) break;
    if (PyErr_CheckSignals() != 0) throw py::error_already_set();
  }
  return c.engine().last_joined();
}

/// hvd.elastic's commit: how many ranks wait to join, rank 0's count given to every rank
/// (collective over the world); 0 when the job has no room for them.
std::int64_t elastic_waiting() {
  tutti::elastic::Job& job = elastic();
  Context& c = ctx();
  py::gil_scoped_release release;
  std::int64_t waiting = c.rank() == 0 ? job.waiting() : 0;
  c.world().allreduce(&waiting, &waiting, 1, tutti::DataType::i64, tutti::ReduceOp::max);
  return waiting;
}

/// hvd.elastic's reset: drops this generation's context (local once its communicator failed;
/// collective, and met by every rank, when ranks join), meets the survivors in the next
/// generation (tutti::elastic::Job::rebuild) and builds the context over its world.
void elastic_rebuild(const std::string& failure) {
  tutti::elastic::Job& job = elastic();
  py::gil_scoped_release release;
  std::unique_ptr<Context> doomed(context);
  context = nullptr;
  doomed.reset();
  job.rebuild(failure);
  context = new Context(elastic_settings, job.communicator());
}

}  // namespace

}  // namespace tutti_python::horovod

PYBIND11_MODULE(_horovod, m) {
  using namespace tutti_python::horovod;
  m.doc() = "C++ half of tutti.horovod.torch: collectives on torch tensors over Tutti's training engine";
  tutti_python::register_error_translator();
  if (!tutti_python::import_storage_pins()) throw py::error_already_set();  // operations pin their tensors' storages
  m.def("init", &init, py::arg("fusion_threshold") = py::none(), py::arg("cycle_time_ms") = py::none(),
        py::arg("timeline") = py::none(), py::arg("stall_warning_s") = py::none(),
        py::arg("stall_shutdown_s") = py::none(), py::arg("store") = py::none(), py::arg("rank") = py::none(),
        py::arg("size") = py::none(), py::arg("communicator") = py::none(),
        "Joins the job (collective): the launcher's, through `store` (torch.distributed.Store's methods) as "
        "`rank` of `size`, or runs over `communicator` (a tutti.Communicator); the other arguments replace "
        "TUTTI_FUSION_THRESHOLD, TUTTI_CYCLE_TIME_MS, "
        "TUTTI_TIMELINE, TUTTI_STALL_WARNING_S and TUTTI_STALL_SHUTDOWN_S");
  m.def("shutdown", &shutdown, "Stops the engine (collective)");
  m.def("elastic_waiting", &elastic_waiting, "Ranks waiting to join, the same on every rank (collective)");
  m.def("elastic_rebuild", &elastic_rebuild, py::arg("failure"),
        "Meets the survivors in the next generation and rebuilds the context over its world");
  m.def(
      "elastic_finish", [] { elastic().finish(); }, "This rank's training ended (tells waiting joiners)");
  m.def(
      "elastic_generation", [] { return elastic_job ? elastic_job->generation() : -1; },
      "The elastic job's generation; -1 outside an elastic job");
  m.def("is_initialized", [] { return context != nullptr; });
  m.def("rank", [] { return ctx().rank(); });
  m.def("size", [] { return ctx().size(); });
  m.def("local_rank", [] { return ctx().local_rank(); });
  m.def("local_size", [] { return ctx().local_size(); });
  m.def("cross_rank", [] { return ctx().cross_rank(); });
  m.def("cross_size", [] { return ctx().cross_size(); });
  m.def(
      "allreduce_async",
      [](torch::Tensor input, torch::Tensor output, std::optional<std::string> name, int op, int process_set,
         const std::string& kind) {
        return start(name, kind.c_str(), process_set, [&](ProcessSet& ps, const std::string& n) {
          return start_allreduce(*ps.engine, n, input, output, op);
        });
      },
      py::arg("input"), py::arg("output"), py::arg("name"), py::arg("op"), py::arg("process_set") = 0,
      py::arg("kind") = "allreduce");
  m.def(
      "broadcast_async",
      [](torch::Tensor tensor, int root, std::optional<std::string> name, int process_set) {
        return start(name, "broadcast", process_set, [&](ProcessSet& ps, const std::string& n) {
          return start_broadcast(*ps.engine, n, tensor, set_root(ps, root, process_set));
        });
      },
      py::arg("tensor"), py::arg("root_rank"), py::arg("name"), py::arg("process_set") = 0);
  m.def(
      "allgather_async",
      [](torch::Tensor tensor, std::optional<std::string> name, int process_set) {
        return start(name, "allgather", process_set,
                     [&](ProcessSet& ps, const std::string& n) { return start_allgather(*ps.engine, n, tensor); });
      },
      py::arg("tensor"), py::arg("name"), py::arg("process_set") = 0);
  m.def(
      "alltoall_async",
      [](torch::Tensor tensor, std::optional<torch::Tensor> splits, std::optional<std::string> name, int process_set) {
        return start(name, "alltoall", process_set, [&](ProcessSet& ps, const std::string& n) {
          return start_alltoall(*ps.comm, n, tensor, splits.value_or(torch::Tensor()));
        });
      },
      py::arg("tensor"), py::arg("splits"), py::arg("name"), py::arg("process_set") = 0);
  m.def(
      "add_process_set",
      [](std::vector<int> ranks) -> std::optional<int> {
        const int id = ctx().add_process_set(std::move(ranks));
        return id < 0 ? std::nullopt : std::optional<int>(id);
      },
      "Collective over the job: a process set of `ranks`; its id, or None where one of these ranks exists");
  m.def(
      "remove_process_set", [](int id) { return ctx().remove_process_set(id); },
      "Collective over the job: removes process set `id`; False for 0 or an unknown id");
  m.def("process_set_ranks", [](int id) { return ctx().process_set_ranks(id); });
  m.def("process_set_ids", [] { return ctx().process_set_ids(); });
  m.def("poll", [](int handle) { return ctx().poll(handle); });
  m.def("synchronize", [](int handle) { return ctx().synchronize(handle); });
  m.def("pending", [] { return ctx().pending(); });
  m.def("join", &join);
  m.def(
      "start_timeline",
      [](const std::string& path, bool mark_cycles) {
        tutti::Engine& engine = ctx().engine();
        if (path.empty())
          throw tutti::Error(tutti::ErrorCode::invalid_argument, "hvd.start_timeline: file_path is empty");
        engine.start_timeline(path, mark_cycles);
      },
      py::arg("file_path"), py::arg("mark_cycles") = false,
      "Starts writing the global set's engine's timeline to `file_path` (rank 0 writes it; every rank, its "
      "own, where it contains {rank}), closing the one written until now");
  m.def(
      "stop_timeline", [] { ctx().engine().stop_timeline(); },
      "Closes the timeline being written (complete JSON once it returns); nothing without one");
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
                        py::arg("cycle_time_us") = o.cycle_time.count(), py::arg("timeline") = o.timeline_path,
                        py::arg("stall_warning_ms") = o.stall_warning.count(),
                        py::arg("stall_error_ms") = o.stall_error.count());
      },
      "The engine's settings in force");
  m.def(
      "barrier",
      [](int process_set) {
        tutti::Communicator& comm = *ctx().process_set(process_set).comm;
        py::gil_scoped_release release;
        comm.barrier();
      },
      py::arg("process_set") = 0);
}
