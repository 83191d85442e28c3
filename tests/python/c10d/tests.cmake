# Tests of the torch.distributed backend "tutti" (python/c10d.cmake includes this file): every
# collective, checked exactly on every rank, under each launcher (tutti-run at p = 2 and 4 over
# shared memory and p = 3 over TCP, torchrun's env:// at p = 3, mpirun at p = 2 with label mpi), DDP against Gloo
# at p = 2 and 4, ZeroRedundancyOptimizer and FSDP against Gloo at p = 2 and 4, and a subset of
# PyTorch's own DistributedTest against "tutti" and "gloo". They
# need the targets _c10d, _tutti and tutti-run built, and import the package from the build tree,
# with the build's interpreter (Debian's torch 1.13, or a venv's torch 2.x in a build configured
# with -DPython_EXECUTABLE=VENV/bin/python). python.torch2 builds for PyPI's torch 2.x on its own.
set(tutti_c10d_tests ${PROJECT_SOURCE_DIR}/tests/python/c10d)
# A rank that fails leaves its peers waiting: TUTTI_TIMEOUT_MS and `timeout` bound that wait.
set(tutti_c10d_env "PYTHONPATH=${TUTTI_PYTHON_DIR}" "PYTHONDONTWRITEBYTECODE=1" "TUTTI_TIMEOUT_MS=60000")

# tutti_c10d_test(NAME LABEL COMMAND...): python.c10d.NAME with labels LABEL and python.
function(tutti_c10d_test name label)
  add_test(NAME python.c10d.${name} COMMAND ${ARGN})
  set_tests_properties(python.c10d.${name} PROPERTIES LABELS "${label};python" TIMEOUT 300
                       ENVIRONMENT "${tutti_c10d_env}")
endfunction()

if(TARGET tutti-run)
  foreach(p 2 4)
    tutti_c10d_test(collectives_p${p} mp timeout 240 $<TARGET_FILE:tutti-run> -n ${p} --timeout-ms 60000
                    ${Python_EXECUTABLE} ${tutti_c10d_tests}/collectives_test.py)
    tutti_c10d_test(ddp_p${p} mp timeout 240 $<TARGET_FILE:tutti-run> -n ${p} --timeout-ms 60000
                    ${Python_EXECUTABLE} ${tutti_c10d_tests}/ddp_test.py)
    # ZeroRedundancyOptimizer and FSDP (FSDP1 and FSDP2 on torch 2.x) against Gloo; what torch
    # itself does not support on the CPU is printed as skipped, with the reason.
    tutti_c10d_test(zero_fsdp_p${p} mp timeout 240 $<TARGET_FILE:tutti-run> -n ${p} --timeout-ms 60000
                    ${Python_EXECUTABLE} ${tutti_c10d_tests}/zero_fsdp_test.py)
  endforeach()
  # A script that ends without destroy_process_group(), works in flight: every rank exits with 0.
  tutti_c10d_test(exit_p4 mp timeout 120 $<TARGET_FILE:tutti-run> -n 4 --timeout-ms 60000 ${Python_EXECUTABLE}
                  ${tutti_c10d_tests}/exit_test.py)
  # init_process_group's timeout bounds a collective a peer never joins (tutti.Timeout).
  tutti_c10d_test(timeout_p2 mp timeout 120 $<TARGET_FILE:tutti-run> -n 2 ${Python_EXECUTABLE}
                  ${tutti_c10d_tests}/timeout_test.py)
  # `pip install .` into a fresh venv with build isolation (PyPI's newest pybind11), then imports
  # and DDP at p = 2 from the installed package, not from this build tree (skipped without PyPI).
  add_test(NAME python.pip_install COMMAND bash ${PROJECT_SOURCE_DIR}/tests/python/pip_install_test.sh
                                           ${PROJECT_SOURCE_DIR} $<TARGET_FILE:tutti-run>)
  set_tests_properties(python.pip_install PROPERTIES LABELS "mp;python" TIMEOUT 1800 RUN_SERIAL TRUE
                                                     SKIP_RETURN_CODE 77)
  # The backend on PyPI's torch 2.x (scripts/torch2_check.sh): a venv of its own with PyPI's torch,
  # pip install . into it, collectives (with the profiler's trace) and DDP at p = 2 from the installed
  # package. The venv and the package's build directory stay in BUILD/torch2-check: a later run
  # installs nothing and rebuilds only what changed (skipped, 77, when the venv lacks torch and PyPI
  # cannot be reached).
  add_test(NAME python.torch2 COMMAND bash ${PROJECT_SOURCE_DIR}/scripts/torch2_check.sh
                                      --work ${CMAKE_BINARY_DIR}/torch2-check --tutti-run $<TARGET_FILE:tutti-run>)
  set_tests_properties(python.torch2 PROPERTIES LABELS "python;mp;torch2" TIMEOUT 2400 RUN_SERIAL TRUE
                                                SKIP_RETURN_CODE 77)
  tutti_c10d_test(collectives_tcp_p3 mp timeout 240 $<TARGET_FILE:tutti-run> -n 3 --transport tcp --timeout-ms 60000
                  ${Python_EXECUTABLE} ${tutti_c10d_tests}/collectives_test.py)
endif()
tutti_c10d_test(collectives_torchrun_p3 mp timeout 240 ${Python_EXECUTABLE} ${tutti_c10d_tests}/torchrun.py --standalone
                --nproc_per_node 3 ${tutti_c10d_tests}/collectives_test.py)
# torch 1.13's --standalone rendezvous listens on port 29400: one torchrun test at a time.
set_tests_properties(python.c10d.collectives_torchrun_p3 PROPERTIES RESOURCE_LOCK torchrun_port_29400)
if(TUTTI_WITH_MPI AND MPIEXEC_EXECUTABLE)
  tutti_c10d_test(collectives_mpirun_p2 mpi bash ${tutti_c10d_tests}/mpirun.sh ${MPIEXEC_EXECUTABLE} ${Python_EXECUTABLE}
                  ${tutti_c10d_tests}/collectives_test.py 2)
endif()
# A subset of PyTorch's own DistributedTest against tutti (the list: torch_subset.txt; skipped,
# code 77, without expecttest, which scripts/torch_dist_tests.sh installs into BUILD/pydeps).
tutti_c10d_test(torch_subset mp ${CMAKE_COMMAND} -E env PYTHON=${Python_EXECUTABLE} bash ${tutti_c10d_tests}/torch_subset.sh
                ${CMAKE_BINARY_DIR})
set_tests_properties(python.c10d.torch_subset PROPERTIES TIMEOUT 600 SKIP_RETURN_CODE 77)
