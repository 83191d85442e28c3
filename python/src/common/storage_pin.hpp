// Pins on torch storages: a buffer handed to an operation keeps its memory until the operation
// completes (docs/python.md). Holding the tensor is not enough: `t.set_(other)` drops the old
// storage, and `t.resize_(bigger)` reallocates the storage's memory in place and frees the old one.
// A pin holds the storage itself (set_, del) and makes it non-resizable (resize_ raises "Trying to
// resize storage that is not resizable") until the last pin on it goes.
//
// The pin counts live in one table per process, in the module tutti._storage; the other modules
// reach it through its capsule, so that operations of different modules (core, c10d, Horovod) on
// one storage count together and the last one restores what the storage was.
#pragma once

#include <Python.h>

#include <ATen/core/Tensor.h>
#include <c10/core/Storage.h>

#include <utility>

namespace tutti_python {

/// The table's entry points. Thread-safe (a mutex): c10d's works complete on a thread of their
/// own, without the GIL.
struct StoragePinApi {
  void (*pin)(c10::StorageImpl* storage);    // +1; the first pin makes it non-resizable
  void (*unpin)(c10::StorageImpl* storage);  // -1; the last restores resizable() as it was
};

inline constexpr const char* storage_pin_capsule = "tutti._storage._api";

namespace detail {
// This module's pointer to the table (each extension module has its own copy: hidden symbols).
inline const StoragePinApi*& storage_pin_api() {
  static const StoragePinApi* api = nullptr;
  return api;
}
}  // namespace detail

/// Imports tutti._storage and keeps its table for StoragePin; at module init (GIL held). False,
/// with the Python error (ImportError) set, when the module is missing.
inline bool import_storage_pins() {
  // PyCapsule_Import imports only the package and then looks up attributes: import the submodule.
  PyObject* module = PyImport_ImportModule("tutti._storage");
  if (module == nullptr) return false;
  Py_DECREF(module);
  void* api = PyCapsule_Import(storage_pin_capsule, 0);
  if (api == nullptr) return false;
  detail::storage_pin_api() = static_cast<const StoragePinApi*>(api);
  return true;
}

/// Holds `tensor`'s storage, non-resizable, for as long as it lives. Needs no GIL. A tensor
/// without storage (undefined) gives an empty pin; before import_storage_pins() the storage is
/// held but stays resizable.
class StoragePin {
 public:
  explicit StoragePin(const at::Tensor& tensor) : api_(detail::storage_pin_api()) {
    if (!tensor.defined() || !tensor.has_storage()) return;
    storage_ = tensor.storage();
    if (api_ != nullptr) api_->pin(storage_.unsafeGetStorageImpl());
  }
  ~StoragePin() {
    if (storage_ && api_ != nullptr) api_->unpin(storage_.unsafeGetStorageImpl());
  }
  StoragePin(StoragePin&& other) noexcept : api_(other.api_), storage_(std::exchange(other.storage_, c10::Storage())) {}
  StoragePin& operator=(StoragePin&&) = delete;
  StoragePin(const StoragePin&) = delete;
  StoragePin& operator=(const StoragePin&) = delete;

 private:
  const StoragePinApi* api_;
  c10::Storage storage_;
};

}  // namespace tutti_python
