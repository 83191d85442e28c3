# The core module tutti._tutti (import tutti; docs/python.md).
tutti_python_extension(_tutti tutti src/core/module.cpp src/core/buffer.cpp src/core/call.cpp
                       src/core/collectives.cpp src/core/names.cpp src/core/torch_storage.cpp)
target_compile_definitions(_tutti PRIVATE TUTTI_VERSION="${PROJECT_VERSION}")
target_link_libraries(_tutti PRIVATE dlpack::dlpack)  # <dlpack/dlpack.h>: the tensors it takes (src/core/buffer.cpp)
# tutti.__version__ is CMake's project version; pip's metadata comes from pyproject.toml: one number.
file(STRINGS ${PROJECT_SOURCE_DIR}/pyproject.toml tutti_pyproject_version REGEX "^version = ")
if(NOT tutti_pyproject_version STREQUAL "version = \"${PROJECT_VERSION}\"")
  message(FATAL_ERROR "pyproject.toml says ${tutti_pyproject_version}, CMakeLists.txt's project() ${PROJECT_VERSION}")
endif()

# Its tests (tests/python/core, plain unittest): ranks as threads over local_group (unit), and as
# processes under tutti-run at p = 2 and 4 over shared memory and p = 3 over TCP (mp). They
# import the package from the build tree.
if(TUTTI_BUILD_TESTS)
  set(tutti_core_tests ${PROJECT_SOURCE_DIR}/tests/python/core)
  # A rank that fails leaves its peers waiting: TUTTI_TIMEOUT_MS bounds that wait (local_group too).
  set(tutti_core_env "PYTHONPATH=${TUTTI_PYTHON_DIR}:${tutti_core_tests}" "PYTHONDONTWRITEBYTECODE=1"
                     "TUTTI_TIMEOUT_MS=60000")
  add_test(NAME python.core.threads
           COMMAND timeout 600 ${Python_EXECUTABLE} ${tutti_core_tests}/threads_test.py -v)
  set_tests_properties(python.core.threads PROPERTIES LABELS "unit;python" TIMEOUT 660
                       ENVIRONMENT "${tutti_core_env}")
  # A torch tensor keeps its memory while a call uses it (set_, del, resize_), each case in a
  # subprocess of its own, so that a crash fails the case rather than the runner.
  add_test(NAME python.core.buffer_lifetime
           COMMAND timeout 600 ${Python_EXECUTABLE} ${tutti_core_tests}/buffer_lifetime_test.py -v)
  set_tests_properties(python.core.buffer_lifetime PROPERTIES LABELS "unit;python" TIMEOUT 660
                       ENVIRONMENT "${tutti_core_env}")
  if(TARGET tutti-run)
    foreach(p 2 4)
      add_test(NAME python.core.processes_p${p}
               COMMAND $<TARGET_FILE:tutti-run> -n ${p} --timeout-ms 60000
                       ${Python_EXECUTABLE} ${tutti_core_tests}/processes_test.py)
      set_tests_properties(python.core.processes_p${p} PROPERTIES LABELS "mp;python" TIMEOUT 600
                           ENVIRONMENT "${tutti_core_env}")
    endforeach()
    add_test(NAME python.core.processes_tcp_p3
             COMMAND $<TARGET_FILE:tutti-run> -n 3 --transport tcp --timeout-ms 60000
                     ${Python_EXECUTABLE} ${tutti_core_tests}/processes_test.py)
    set_tests_properties(python.core.processes_tcp_p3 PROPERTIES LABELS "mp;python" TIMEOUT 600
                         ENVIRONMENT "${tutti_core_env}")
  endif()
  # mpirun instead of tutti-run: tutti.init() bootstraps through MPI (label mpi).
  if(TUTTI_WITH_MPI AND MPIEXEC_EXECUTABLE)
    add_test(NAME python.core.mpirun_p2
             COMMAND timeout 300 ${MPIEXEC_EXECUTABLE} --oversubscribe --allow-run-as-root ${MPIEXEC_NUMPROC_FLAG} 2
                     ${Python_EXECUTABLE} ${tutti_core_tests}/processes_test.py)
    set_tests_properties(python.core.mpirun_p2 PROPERTIES LABELS "mpi;python" TIMEOUT 360
                         ENVIRONMENT "${tutti_core_env}")
  endif()
endif()
