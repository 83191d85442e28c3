# The pybind11 that the torch.distributed backend, tutti.horovod.torch and tutti._storage compile
# against: the one whose internals match those of the torch they will import. These modules pass
# torch's own objects (its ProcessGroup base, tensors, stores); compiled against another pybind11
# (pip's build isolation fetches the newest from PyPI), torch's classes are unknown to them and the
# import fails ("referenced unknown base type c10d::ProcessGroup").
#
# torch's internals id is asked of torch itself (build_support/torch_pybind11_id.py); candidates
# are torch's own copy of the headers (PyPI's wheels ship one), the pybind11 CMake found, and the
# system's (/usr/include: Debian's torch was built against Debian's pybind11). The first whose id
# matches is used, through a directory of its own holding only `pybind11` (an -I that comes before
# every -isystem, /usr/include included). None matching is refused here, naming both ids.
include_guard(GLOBAL)

# The interpreter as its user runs it: without what pip's build isolation adds to PYTHONPATH (a
# sitecustomize that hides the environment's own packages, torch among them).
set(_tutti_python ${CMAKE_COMMAND} -E env --unset=PYTHONPATH --unset=PYTHONNOUSERSITE ${Python_EXECUTABLE})
set(TUTTI_TORCH_PYBIND11_SHIM "")
execute_process(COMMAND ${_tutti_python} ${CMAKE_CURRENT_SOURCE_DIR}/build_support/torch_pybind11_id.py
                OUTPUT_VARIABLE TUTTI_TORCH_PYBIND11_ID ERROR_VARIABLE _tutti_why RESULT_VARIABLE _tutti_status)
if(NOT _tutti_status EQUAL 0)
  message(WARNING "libtorch was found, but ${Python_EXECUTABLE} cannot import torch: the torch.distributed "
                  "backend and tutti.horovod.torch are not built (${_tutti_why})")
  return()
endif()
execute_process(COMMAND ${_tutti_python} -c "import os, torch; print(os.path.dirname(torch.__file__), end='')"
                OUTPUT_VARIABLE _tutti_torch_dir)
# The libtorch CMake found must be the one this interpreter imports: a module compiled against
# another torch's headers (Debian's 1.13 in /usr, found before a venv's torch 2.x) fails at import
# or, worse, in a collective. Torch_DIR is <torch>/share/cmake/Torch for a pip-installed torch.
get_filename_component(_tutti_found_torch ${Torch_DIR}/../../.. ABSOLUTE)
get_filename_component(_tutti_found_torch ${_tutti_found_torch} REALPATH)
get_filename_component(_tutti_imported_torch ${_tutti_torch_dir} REALPATH)
if(EXISTS ${_tutti_imported_torch}/share/cmake/Torch AND NOT _tutti_found_torch STREQUAL _tutti_imported_torch)
  execute_process(COMMAND ${_tutti_python} -c "import torch; print(torch.utils.cmake_prefix_path, end='')"
                  OUTPUT_VARIABLE _tutti_prefix)
  message(FATAL_ERROR
          "CMake found libtorch in ${Torch_DIR}, but ${Python_EXECUTABLE} imports the torch in "
          "${_tutti_torch_dir}: the torch modules would not load there. Point CMake at the interpreter's torch: "
          "-DCMAKE_PREFIX_PATH=${_tutti_prefix} (or CMAKE_PREFIX_PATH=${_tutti_prefix} in the environment of pip install).")
endif()

set(_tutti_candidates)
if(EXISTS ${_tutti_torch_dir}/include/pybind11/pybind11.h)
  list(APPEND _tutti_candidates ${_tutti_torch_dir}/include)
endif()
list(APPEND _tutti_candidates ${pybind11_INCLUDE_DIRS} /usr/include)
list(REMOVE_DUPLICATES _tutti_candidates)
set(_tutti_tried "")
set(CMAKE_TRY_COMPILE_TARGET_TYPE STATIC_LIBRARY)  # compiled only: the check is a static_assert
set(_tutti_index 0)
foreach(_tutti_dir IN LISTS _tutti_candidates)
  if(NOT EXISTS ${_tutti_dir}/pybind11/pybind11.h)
    continue()
  endif()
  math(EXPR _tutti_index "${_tutti_index} + 1")
  set(_tutti_shim ${CMAKE_CURRENT_BINARY_DIR}/torch_pybind11/${_tutti_index})
  file(REMOVE_RECURSE ${_tutti_shim})
  file(MAKE_DIRECTORY ${_tutti_shim})
  file(CREATE_LINK ${_tutti_dir}/pybind11 ${_tutti_shim}/pybind11 SYMBOLIC)
  set(_tutti_check ${CMAKE_CURRENT_BINARY_DIR}/torch_pybind11/check${_tutti_index}.cpp)
  file(WRITE ${_tutti_check}
       "#include <pybind11/pybind11.h>\n#include <string_view>\n"
       "static_assert(std::string_view(PYBIND11_INTERNALS_ID) == \"${TUTTI_TORCH_PYBIND11_ID}\");\n"
       "int main() { return 0; }\n")
  try_compile(_tutti_match ${CMAKE_CURRENT_BINARY_DIR}/torch_pybind11/try${_tutti_index} SOURCES ${_tutti_check}
              CMAKE_FLAGS "-DINCLUDE_DIRECTORIES=${_tutti_shim};${Python_INCLUDE_DIRS}" CXX_STANDARD 20
              OUTPUT_VARIABLE _tutti_output NO_CACHE)
  if(_tutti_match)
    set(TUTTI_TORCH_PYBIND11_SHIM ${_tutti_shim})
    message(STATUS "torch's pybind11 (${TUTTI_TORCH_PYBIND11_ID}): the headers in ${_tutti_dir}")
    break()
  endif()
  string(APPEND _tutti_tried "\n  ${_tutti_dir}")
endforeach()
if(NOT TUTTI_TORCH_PYBIND11_SHIM)
  message(FATAL_ERROR
          "The torch of ${Python_EXECUTABLE} (${_tutti_torch_dir}) was built with pybind11 internals "
          "${TUTTI_TORCH_PYBIND11_ID}, and none of these pybind11 headers match it:${_tutti_tried}\n"
          "Modules built against them could not use torch's classes. Install the pybind11 torch was built "
          "with (Debian's torch: apt-get install pybind11-dev), or build without torch.")
endif()

# Compiles TARGET against that pybind11.
function(tutti_torch_pybind11 target)
  target_include_directories(${target} BEFORE PRIVATE ${TUTTI_TORCH_PYBIND11_SHIM})
endfunction()
