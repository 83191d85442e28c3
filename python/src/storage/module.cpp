// tutti._storage: the process's table of pinned torch storages (common/storage_pin.hpp), shared
// with the other extension modules through the capsule `_api`, and pin(tensor) for the core module,
// which is not linked against torch and pins the storage of a torch tensor it is handed through
// this function.
#include <pybind11/pybind11.h>
#include <torch/csrc/utils/pybind.h>  // the caster between torch.Tensor and at::Tensor

#include <memory>
#include <mutex>
#include <unordered_map>

#include "common/storage_pin.hpp"

namespace tutti_python {
namespace {

struct Entry {
  long pins = 0;
  bool was_resizable = false;  // restored when the last pin goes
};

std::mutex& table_mutex() {
  static auto* mutex = new std::mutex();  // leaked: pins may still go during interpreter exit
  return *mutex;
}

std::unordered_map<c10::StorageImpl*, Entry>& table() {
  static auto* map = new std::unordered_map<c10::StorageImpl*, Entry>();
  return *map;
}

// Every pin holds a reference to the storage, so an entry's key stays valid while it is listed.
void pin(c10::StorageImpl* storage) {
  std::lock_guard lock(table_mutex());
  Entry& entry = table()[storage];
  if (entry.pins++ == 0) {
    entry.was_resizable = storage->resizable();
    storage->set_resizable(false);
  }
}

void unpin(c10::StorageImpl* storage) {
  std::lock_guard lock(table_mutex());
  auto it = table().find(storage);
  if (it == table().end() || --it->second.pins > 0) return;
  storage->set_resizable(it->second.was_resizable);
  table().erase(it);
}

const StoragePinApi api{&pin, &unpin};

}  // namespace
}  // namespace tutti_python

PYBIND11_MODULE(_storage, m) {
  namespace py = pybind11;
  using tutti_python::StoragePin;
  m.doc() = "Pins on torch storages: a tensor handed to a running operation keeps its memory";
  tutti_python::detail::storage_pin_api() = &tutti_python::api;
  m.attr("_api") = py::capsule(&tutti_python::api, tutti_python::storage_pin_capsule);
  py::class_<StoragePin, std::unique_ptr<StoragePin>>(m, "StoragePin",
                                                      "Holds a tensor's storage, non-resizable, until dropped");
  m.def(
      "pin", [](const at::Tensor& tensor) { return std::make_unique<StoragePin>(tensor); }, py::arg("tensor"),
      "Holds `tensor`'s storage and makes it non-resizable (resize_ raises) until the returned object is "
      "dropped and no other pin holds the same storage.");
}
