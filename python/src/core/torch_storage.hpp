// The storage behind a torch tensor, held while an operation uses the tensor's memory. The DLPack
// export keeps the tensor (its TensorImpl) alive, not its memory: t.set_(other) frees the old
// storage and t.resize_(bigger) reallocates it. This module is not linked against torch, so it
// asks tutti._storage (torch-linked; common/storage_pin.hpp) for a pin.
#pragma once

#include <pybind11/pybind11.h>

namespace tutti_python {

namespace py = pybind11;

/// For a torch tensor: an object that holds its storage until dropped, non-resizable (resize_
/// raises RuntimeError) through tutti._storage.pin; where that module is missing, the storage
/// object itself (resize_ then stays undefined behaviour). None for anything else. Never imports
/// torch: an object can only be a tensor once torch was imported. GIL held.
py::object hold_torch_storage(py::handle object);

}  // namespace tutti_python
