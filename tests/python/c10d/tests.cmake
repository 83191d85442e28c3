# Tests of the torch.distributed backend "tutti" (python/c10d.cmake includes this file): every
# collective, checked exactly on every rank, under each launcher (tutti-run at p = 2 and 4 over
# shared memory and p = 3 over TCP, torchrun's env:// at p = 3, mpirun at p = 2), DDP against Gloo
# at p = 2 and 4, and a subset of PyTorch's own DistributedTest against "tutti" and "gloo". They
# need the targets _c10d, _tutti and tutti-run built, and import the package from the build tree.
set(tutti_c10d_tests ${PROJECT_SOURCE_DIR}/tests/python/c10d)
# A rank that fails leaves its peers waiting: TUTTI_TIMEOUT_MS and `timeout` bound that wait.
set(tutti_c10d_env "PYTHONPATH=${TUTTI_PYTHON_DIR}" "PYTHONDONTWRITEBYTECODE=1" "TUTTI_TIMEOUT_MS=60000")

function(tutti_c10d_test name)
  add_test(NAME python.c10d.${name} COMMAND ${ARGN})
  set_tests_properties(python.c10d.${name} PROPERTIES LABELS "mp;python" TIMEOUT 300 ENVIRONMENT "${tutti_c10d_env}")
endfunction()

if(TARGET tutti-run)
  foreach(p 2 4)
    tutti_c10d_test(collectives_p${p} timeout 240 $<TARGET_FILE:tutti-run> -n ${p} --timeout-ms 60000
                    ${Python_EXECUTABLE} ${tutti_c10d_tests}/collectives_test.py)
    tutti_c10d_test(ddp_p${p} timeout 240 $<TARGET_FILE:tutti-run> -n ${p} --timeout-ms 60000
                    ${Python_EXECUTABLE} ${tutti_c10d_tests}/ddp_test.py)
  endforeach()
  tutti_c10d_test(collectives_tcp_p3 timeout 240 $<TARGET_FILE:tutti-run> -n 3 --transport tcp --timeout-ms 60000
                  ${Python_EXECUTABLE} ${tutti_c10d_tests}/collectives_test.py)
endif()
tutti_c10d_test(collectives_torchrun_p3 timeout 240 ${Python_EXECUTABLE} ${tutti_c10d_tests}/torchrun.py --standalone
                --nproc_per_node 3 ${tutti_c10d_tests}/collectives_test.py)
if(TUTTI_WITH_MPI AND MPIEXEC_EXECUTABLE)
  tutti_c10d_test(collectives_mpirun_p2 bash ${tutti_c10d_tests}/mpirun.sh ${MPIEXEC_EXECUTABLE} ${Python_EXECUTABLE}
                  ${tutti_c10d_tests}/collectives_test.py 2)
endif()
