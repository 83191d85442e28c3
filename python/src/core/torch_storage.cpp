#include "core/torch_storage.hpp"

namespace tutti_python {

namespace {

// torch.Tensor, if torch was imported; else null.
py::object torch_tensor_type() {
  PyObject* torch = PyDict_GetItemString(PyImport_GetModuleDict(), "torch");  // borrowed
  if (torch == nullptr || !py::hasattr(torch, "Tensor")) return py::object();
  return py::reinterpret_borrow<py::object>(torch).attr("Tensor");
}

// tutti._storage.pin, or None where the module was not built (torch without libtorch_python at
// build time) or cannot be loaded. Looked up once; leaked, since a py::object must not outlive the
// interpreter. No function-local static: its guard would be held while the import releases the GIL.
py::object pin_function() {
  static py::object* pin = nullptr;
  if (pin == nullptr) {
    py::object found = py::none();
    try {
      found = py::module_::import("tutti._storage").attr("pin");
    } catch (py::error_already_set&) {
      // Fallback below: the storage is held, resize_ is not refused.
    }
    if (pin == nullptr) pin = new py::object(std::move(found));
  }
  return *pin;
}

py::object storage_of(py::handle tensor) {
  // torch >= 2.0: untyped_storage(); torch 1.x: storage() (a TypedStorage over the same memory).
  if (py::hasattr(tensor, "untyped_storage")) return tensor.attr("untyped_storage")();
  return tensor.attr("storage")();
}

}  // namespace

py::object hold_torch_storage(py::handle object) {
  const py::object tensor_type = torch_tensor_type();
  if (!tensor_type || !py::isinstance(object, tensor_type)) return py::none();
  const py::object pin = pin_function();
  return pin.is_none() ? storage_of(object) : pin(object);
}

}  // namespace tutti_python
