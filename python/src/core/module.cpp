// tutti._tutti: the core module (docs/python.md). Thin: every call goes to include/tutti/tutti.hpp;
// the GIL is released wherever Tutti waits or works, so other Python threads (and the ranks of a
// local_group, each in its own thread) go on meanwhile.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <functional>
#include <string>

#include "common/communicator_capsule.hpp"
#include "common/errors.hpp"
#include "common/py_store.hpp"
#include "core/call.hpp"
#include "core/collectives.hpp"
#include "tutti/topology.hpp"
#include "tutti/tutti.hpp"

namespace py = pybind11;

namespace {

// Binds the values 0..last of E under the names to_string gives them.
template <class E>
void bind_enum(py::module_& m, const char* name, E last, const char* doc) {
  py::enum_<E> e(m, name, doc);
  for (int i = 0; i <= static_cast<int>(last); ++i) {
    const auto value = static_cast<E>(i);
    e.value(std::string(tutti::to_string(value)).c_str(), value);
  }
}

void bind_host_layout(py::module_& m) {
  py::class_<tutti::HostLayout>(m, "HostLayout", "Where a communicator's ranks live (Communicator.host_layout).")
      .def_readonly("host_count", &tutti::HostLayout::host_count, "Hosts, numbered by their lowest rank.")
      .def_readonly("host", &tutti::HostLayout::host, "This rank's host.")
      .def_readonly("local_rank", &tutti::HostLayout::local_rank, "This rank's position among its host's ranks.")
      .def_readonly("local_size", &tutti::HostLayout::local_size, "The number of ranks on this rank's host.")
      .def_readonly("host_of_rank", &tutti::HostLayout::host_of_rank, "The host of every rank.")
      .def("__repr__", [](const tutti::HostLayout& l) {
        return "<tutti.HostLayout host " + std::to_string(l.host) + " of " + std::to_string(l.host_count) +
               ", local rank " + std::to_string(l.local_rank) + " of " + std::to_string(l.local_size) + ">";
      });
}

void bind_shared_buffer(py::module_& m) {
  py::class_<tutti::SharedBuffer>(m, "SharedBuffer", py::buffer_protocol(),
                                  "Memory from Communicator.allocate: writable bytes (the buffer protocol), freed "
                                  "once no Python object refers to it.")
      .def_buffer([](tutti::SharedBuffer& b) {
        return py::buffer_info(b.data(), 1, py::format_descriptor<std::uint8_t>::format(), 1,
                               {static_cast<py::ssize_t>(b.size())}, {py::ssize_t{1}}, false);
      })
      .def("__len__", &tutti::SharedBuffer::size)
      .def("__repr__",
           [](const tutti::SharedBuffer& b) { return "<tutti.SharedBuffer " + std::to_string(b.size()) + " bytes>"; });
}

void bind_communicator(py::module_& m) {
  py::class_<tutti::Communicator> cls(m, "Communicator",
                                      "A group of ranks that run collectives together (include/tutti/tutti.hpp). "
                                      "Calls must be issued in the same order on every rank.");
  cls.def("_capsule", &tutti_python::to_capsule,
          "This communicator for another of the package's modules (the torch backend, Horovod's API), which "
          "share its native library.")
      .def_static(
          "_from_capsule",
          [](const py::object& capsule) { return tutti_python::from_capsule(capsule, "Communicator._from_capsule"); },
          "The communicator another of the package's modules handed out (e.g. a torch process group's).")
      .def(
          "__eq__",
          [](const tutti::Communicator& a, const py::object& b) {
            return py::isinstance<tutti::Communicator>(b) && a == b.cast<const tutti::Communicator&>();
          },
          "The same group: this communicator or a copy of it (not another group of the same ranks).")
      .def("__hash__", [](const tutti::Communicator& c) { return std::hash<tutti::Communicator>()(c); })
      .def_property_readonly("rank", &tutti::Communicator::rank, "This rank, 0 <= rank < size (-1 if empty).")
      .def_property_readonly("size", &tutti::Communicator::size, "The number of ranks (0 if empty).")
      .def(
          "split",
          [](const tutti::Communicator& c, int color, int key) {
            py::gil_scoped_release release;
            return c.split(color, key);
          },
          py::arg("color"), py::arg("key") = 0,
          "Ranks with the same color form a communicator, ordered by (key, rank); a negative color gives an "
          "empty one. Collective.")
      .def(
          "host_layout",
          [](const tutti::Communicator& c) {
            py::gil_scoped_release release;
            return tutti::host_layout(c);
          },
          "Where the ranks live (tutti/topology.hpp): hosts as TUTTI_HOST or the host name gives them. "
          "Collective.")
      .def(
          "allocate", [](const tutti::Communicator& c, std::size_t nbytes) { return c.allocate(nbytes); },
          py::arg("nbytes"),
          "nbytes of zero-filled memory that this rank's peers on the host can read in place "
          "(tutti::SharedBuffer): collectives whose buffers lie in such memory on every rank run zero copy "
          "over shared memory. View it with numpy.frombuffer(buffer, dtype).")
      .def("__repr__", [](const tutti::Communicator& c) {
        return "<tutti.Communicator rank " + std::to_string(c.rank()) + " of " + std::to_string(c.size()) + ">";
      });
  tutti_python::bind_collectives(cls);
}

}  // namespace

PYBIND11_MODULE(_tutti, m) {
  m.doc() = "Tutti's core bindings; import them from the package `tutti`.";
  m.attr("__version__") = TUTTI_VERSION;  // CMake's project version (pyproject.toml's is checked equal)
  tutti_python::register_error_translator();

  bind_enum(m, "DataType", tutti::DataType::f64, "Element types (taken from the buffers' dtypes).");
  bind_enum(m, "ReduceOp", tutti::ReduceOp::avg, "Element-wise reductions; avg truncates toward zero for integers.");
  bind_enum(m, "Algorithm", tutti::Algorithm::mpi, "Collective algorithms (automatic: the cost model chooses).");

  py::class_<tutti_python::PyRequest>(m, "Request", "The handle of a nonblocking call; it keeps the buffers alive.")
      .def("wait", &tutti_python::PyRequest::wait, py::arg("timeout") = py::none(),
           "Blocks until complete (True), or until timeout seconds passed (False; the call goes on). "
           "Raises the call's error.")
      .def("test", &tutti_python::PyRequest::test, "True when complete. Raises the call's error.");

  bind_host_layout(m);
  bind_shared_buffer(m);
  bind_communicator(m);

  m.def("init", &tutti_python::join, py::arg("store") = py::none(), py::arg("rank") = py::none(),
        py::arg("size") = py::none(), py::arg("timeout") = py::none(),
        "Joins the job the environment describes (tutti-run, mpirun, srun; TUTTI_STORE); without a launcher, "
        "a job of one rank. With `store` (an object with torch.distributed.Store's methods), joins through it "
        "as `rank` of `size`; `timeout` (a timedelta) bounds the rendezvous.");
  m.def(
      "local_group",
      [](int p) {
        py::gil_scoped_release release;
        return tutti::local_group(p);
      },
      py::arg("p"), "p communicators over the in-process transport, one per rank: give each to its own thread.");
}
