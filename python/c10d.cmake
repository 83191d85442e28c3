# The torch.distributed backend "tutti" (docs/torch-distributed.md): tutti._c10d, a c10d::ProcessGroup
# over a Tutti communicator, registered by python/tutti/distributed.py.
#
# libtorch's include directories come from its imported target, hence as SYSTEM (its headers'
# warnings do not trip -Werror), as for tutti-train. c10d itself lives in libtorch_cpu; pybind11
# declarations of torch's Python classes (the ProcessGroup base, the Store argument) come from
# libtorch_python, which `import torch` has loaded already.
find_library(TUTTI_TORCH_PYTHON_LIBRARY torch_python
             HINTS ${TORCH_INSTALL_PREFIX}/lib ${Python_SITELIB}/torch/lib /usr/lib/python3/dist-packages/torch/lib)
if(NOT TUTTI_TORCH_PYTHON_LIBRARY)
  message(STATUS "libtorch_python not found: the torch.distributed backend is not built")
  return()
endif()
include(${CMAKE_CURRENT_SOURCE_DIR}/storage.cmake)
tutti_python_extension(_c10d tutti src/c10d/module.cpp src/c10d/process_group.cpp
                       src/c10d/process_group_exchange.cpp src/c10d/sparse_allreduce.cpp src/c10d/tensors.cpp
                       src/c10d/work.cpp)
target_link_libraries(_c10d PRIVATE torch ${TUTTI_TORCH_PYTHON_LIBRARY})
tutti_torch_pybind11(_c10d)
tutti_torch_target(_c10d)
add_dependencies(_c10d _storage)  # its works pin the tensors' storages through it

if(TUTTI_BUILD_TESTS)
  include(${PROJECT_SOURCE_DIR}/tests/python/c10d/tests.cmake OPTIONAL)
endif()
