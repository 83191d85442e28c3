// tutti._c10d: the torch.distributed backend "tutti" (python/tutti/distributed.py registers it).
//
// create(store, rank, size, timeout) is the backend's creator: it joins the group's Tutti
// communicator through the c10d Store torch.distributed hands every backend (a PrefixStore of its
// own for each group), then returns the ProcessGroupTutti over it (a c10d::ProcessGroup on torch
// 1.x, a c10d::Backend that torch wraps in its ProcessGroup on 2.x).
#include <string>

#include <pybind11/chrono.h>
#include <pybind11/pybind11.h>
#include <torch/csrc/utils/pybind.h>  // c10::intrusive_ptr as a pybind11 holder, as torch declares it

#include <torch/csrc/distributed/c10d/Store.hpp>

#include "c10d/process_group.hpp"
#include "common/communicator_capsule.hpp"
#include "common/errors.hpp"
#include "common/storage_pin.hpp"
#include "tutti/rendezvous.hpp"

namespace tutti::c10d_backend {
namespace {

// The c10d Store as Tutti's rendezvous store.
class C10dStore final : public KeyValueStore {
 public:
  explicit C10dStore(c10::intrusive_ptr<::c10d::Store> store) : store_(std::move(store)) {}
  void set(const std::string& key, const std::string& value) override {
    store_->set(key, std::vector<std::uint8_t>(value.begin(), value.end()));
  }
  std::string get(const std::string& key, std::chrono::milliseconds timeout) override {
    try {
      store_->wait({key}, timeout);
    } catch (const std::exception& e) {
      throw Error(ErrorCode::timeout, "tutti: joining the group: key '" + key + "' was not set within " +
                                          std::to_string(timeout.count()) +
                                          " ms (a rank did not arrive?): " + e.what());
    }
    const std::vector<std::uint8_t> value = store_->get(key);
    return std::string(value.begin(), value.end());
  }
  std::int64_t add(const std::string& key, std::int64_t delta) override { return store_->add(key, delta); }

 private:
  c10::intrusive_ptr<::c10d::Store> store_;
};

c10::intrusive_ptr<ProcessGroupTutti> create(const c10::intrusive_ptr<::c10d::Store>& store, int rank, int size,
                                             std::chrono::milliseconds timeout) {
  C10dStore rendezvous(store);
  tutti::Communicator comm = tutti::init(rendezvous, rank, size, timeout);
  return c10::make_intrusive<ProcessGroupTutti>(std::move(comm), timeout);
}

// The group over a communicator the caller has (tutti.distributed.init_process_group(communicator=)).
c10::intrusive_ptr<ProcessGroupTutti> create_from(const pybind11::object& communicator, int rank, int size,
                                                  std::chrono::milliseconds timeout) {
  tutti::Communicator comm = tutti_python::from_capsule(communicator, "tutti.distributed: communicator");
  if (comm.rank() != rank || comm.size() != size)
    throw Error(ErrorCode::invalid_argument, "tutti.distributed: the communicator is rank " +
                                                 std::to_string(comm.rank()) + " of " + std::to_string(comm.size()) +
                                                 ", but torch.distributed asks for rank " + std::to_string(rank) +
                                                 " of " + std::to_string(size));
  return c10::make_intrusive<ProcessGroupTutti>(std::move(comm), timeout);
}

}  // namespace
}  // namespace tutti::c10d_backend

PYBIND11_MODULE(_c10d, m) {
  namespace py = pybind11;
  using tutti::c10d_backend::ProcessGroupTutti;
  m.doc() = "The torch.distributed backend \"tutti\" (import tutti.distributed to register it)";
  tutti_python::register_error_translator();
  if (!tutti_python::import_storage_pins()) throw py::error_already_set();  // works pin their tensors' storages
  // Built against one torch, imported with another: torch's classes would not be ours. Say so
  // at import, naming both, rather than fail later in a collective.
  const std::string built = std::to_string(TORCH_VERSION_MAJOR) + "." + std::to_string(TORCH_VERSION_MINOR);
  const std::string running = py::module_::import("torch").attr("__version__").cast<std::string>();
  if (running.rfind(built + ".", 0) != 0 && running != built)
    throw py::import_error("tutti._c10d was built against torch " + built + ", but this interpreter runs torch " +
                           running + ": rebuild tutti against it (pip install . in this environment)");
  py::module_::import("torch.distributed");  // c10d's Python classes, our base among them
  py::class_<ProcessGroupTutti, tutti::c10d_backend::C10dBase, c10::intrusive_ptr<ProcessGroupTutti>>(
      m, "ProcessGroupTutti", "A c10d backend over a tutti communicator")
      .def(
          "_capsule", [](const ProcessGroupTutti& group) { return tutti_python::to_capsule(group.communicator()); },
          "The group's communicator, for tutti.Communicator._from_capsule().");
  m.attr("TORCH_VERSION") = built;                  // the torch it was built against
  m.attr("IS_BACKEND") = bool(TUTTI_C10D_BACKEND);  // a c10d::Backend (torch 2.x), not a ProcessGroup
  m.def("create", &tutti::c10d_backend::create, py::arg("store"), py::arg("rank"), py::arg("size"), py::arg("timeout"),
        py::call_guard<py::gil_scoped_release>(),
        "Joins the group of `size` ranks as `rank` through the c10d `store` and returns its ProcessGroupTutti; "
        "`timeout` (a timedelta) bounds the rendezvous and every operation.");
  m.def("_stop_progress", &tutti::c10d_backend::WorkProgress::stop_all, py::call_guard<py::gil_scoped_release>(),
        "Stops and joins every group's progress thread (tutti.distributed calls it at exit, before the "
        "interpreter finalizes); works are then completed by whoever waits on them.");
  m.def("create_from", &tutti::c10d_backend::create_from, py::arg("communicator"), py::arg("rank"), py::arg("size"),
        py::arg("timeout"),
        "The ProcessGroupTutti over `communicator` (a tutti.Communicator, whose rank and size must be torch's); "
        "`timeout` bounds every operation.");
}
