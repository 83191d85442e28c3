# tutti._storage: the table of pinned torch storages (python/src/common/storage_pin.hpp) that keeps
# a tensor's memory alive, and unresizable, while an operation uses it. One module for the whole
# process, so that the core module (not linked against torch, it calls tutti._storage.pin), the
# torch.distributed backend and tutti.horovod.torch count their pins on one storage together.
# Included by c10d.cmake and horovod.cmake once they found libtorch_python.
include_guard(GLOBAL)
tutti_python_extension(_storage tutti src/storage/module.cpp)
target_link_libraries(_storage PRIVATE torch ${TUTTI_TORCH_PYTHON_LIBRARY})
tutti_torch_pybind11(_storage)
tutti_torch_target(_storage)
# The core module pins torch tensors through it (and falls back to holding the storage without it).
if(TARGET _tutti)
  add_dependencies(_tutti _storage)
endif()
