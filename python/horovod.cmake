# tutti.horovod.torch: Horovod's PyTorch API over Tutti's training engine (docs/horovod.md).
#
# The extension tutti.horovod._horovod takes torch tensors from Python, so it links libtorch (the
# imported target, as tools/train does) and torch's Python bindings (libtorch_python: the pybind11
# caster between torch.Tensor and at::Tensor), which python3-torch ships beside libtorch.
find_library(TUTTI_TORCH_PYTHON_LIBRARY torch_python
             HINTS ${TORCH_INSTALL_PREFIX}/lib /usr/lib/python3/dist-packages/torch/lib)
if(NOT TUTTI_TORCH_PYTHON_LIBRARY)
  message(STATUS "libtorch_python not found: tutti.horovod.torch is not built (install python3-torch)")
  return()
endif()

include(${CMAKE_CURRENT_SOURCE_DIR}/storage.cmake)
tutti_python_extension(_horovod tutti/horovod
                       ${CMAKE_CURRENT_SOURCE_DIR}/src/horovod/module.cpp
                       ${CMAKE_CURRENT_SOURCE_DIR}/src/horovod/context.cpp
                       ${CMAKE_CURRENT_SOURCE_DIR}/src/horovod/ops.cpp)
target_link_libraries(_horovod PRIVATE torch ${TUTTI_TORCH_PYTHON_LIBRARY})
tutti_torch_pybind11(_horovod)
tutti_torch_target(_horovod PCH <torch/extension.h>)
# As torch.utils.cpp_extension compiles extensions (torch/library.h needs the first).
target_compile_definitions(_horovod PRIVATE TORCH_API_INCLUDE_EXTENSION_H TORCH_EXTENSION_NAME=_horovod)
# Importing tutti.horovod runs the package's __init__.py, which imports the core module: building
# _horovod builds it too, so that `ninja _horovod` gives an importable package.
if(TARGET _tutti)
  add_dependencies(_horovod _tutti)
endif()
add_dependencies(_horovod _storage)  # its operations pin the tensors' storages through it

if(TUTTI_BUILD_TESTS)
  # Each script runs under tutti-run at p = 2 and 4, from the build tree's package; every rank
  # checks every element it receives. Labels python (needs python3-torch) and mp (processes).
  set(hvd_tests ${PROJECT_SOURCE_DIR}/tests/python/horovod)
  # A tensor some rank never enqueues fails after 30 s (TUTTI_STALL_SHUTDOWN_S) instead of hanging.
  set(hvd_env PYTHONPATH=${TUTTI_PYTHON_DIR} PYTHONDONTWRITEBYTECODE=1 OMP_NUM_THREADS=1 TUTTI_STALL_SHUTDOWN_S=30)
  foreach(script collectives optimizer errors api)
    foreach(ranks 2 4)
      add_test(NAME python.horovod.${script}.p${ranks}
               COMMAND ${CMAKE_COMMAND} -E env ${hvd_env}
                       $<TARGET_FILE:tutti-run> -n ${ranks} ${Python_EXECUTABLE} ${hvd_tests}/${script}_test.py)
      set_tests_properties(python.horovod.${script}.p${ranks} PROPERTIES LABELS "python;mp" TIMEOUT 240)
    endforeach()
  endforeach()
  # hvd.elastic under tutti-run --elastic: a rank killed, a rank joining (labels python, mp, fault).
  add_test(NAME python.horovod.elastic
           COMMAND ${CMAKE_COMMAND} -E env ${hvd_env} bash ${hvd_tests}/elastic_test.sh $<TARGET_FILE:tutti-run>
                   ${Python_EXECUTABLE})
  set_tests_properties(python.horovod.elastic PROPERTIES LABELS "python;mp;fault" TIMEOUT 240)
  # hvd.elastic.ElasticSampler in one process (a job of one rank; other sizes by the partition
  # alone, other ranks' processed indices through a stand-in for the allgather): label python.
  add_test(NAME python.horovod.elastic_sampler
           COMMAND ${CMAKE_COMMAND} -E env ${hvd_env} timeout 100 ${Python_EXECUTABLE}
                   ${hvd_tests}/elastic_sampler_test.py)
  set_tests_properties(python.horovod.elastic_sampler PROPERTIES LABELS "python" TIMEOUT 120)
  # Under torchrun (Debian's, through the test's fixed copy): hvd.init() joins through torchrun's store.
  add_test(NAME python.horovod.collectives.torchrun_p3
           COMMAND ${CMAKE_COMMAND} -E env ${hvd_env} timeout 200 ${Python_EXECUTABLE}
                   ${PROJECT_SOURCE_DIR}/tests/python/c10d/torchrun.py --standalone --nproc_per_node 3
                   ${hvd_tests}/collectives_test.py)
  set_tests_properties(python.horovod.collectives.torchrun_p3 PROPERTIES LABELS "python;mp" TIMEOUT 240
                                                                      RESOURCE_LOCK torchrun_port_29400)
  # Ranks spread over emulated hosts (TUTTI_HOST per rank): local and cross ranks, collectives
  # across hosts; p = 3 has an uneven last host.
  foreach(ranks 3 4)
    add_test(NAME python.horovod.hosts.p${ranks}
             COMMAND ${CMAKE_COMMAND} -E env ${hvd_env} $<TARGET_FILE:tutti-run> -n ${ranks} bash -c
                     "TUTTI_HOST=host$((TUTTI_RANK / 2)) exec ${Python_EXECUTABLE} ${hvd_tests}/hosts_test.py")
    set_tests_properties(python.horovod.hosts.p${ranks} PROPERTIES LABELS "python;mp" TIMEOUT 120)
  endforeach()
  # The equivalent of Horovod's MNIST example (examples/horovod_mnist.py; Horovod's own script is
  # run by examples/horovod_mnist_compare.sh, see docs/horovod.md) for one short epoch at p = 2 on
  # Fashion-MNIST.
  add_test(NAME python.horovod.mnist_example
           COMMAND bash ${hvd_tests}/mnist_example_test.sh $<TARGET_FILE:tutti-run> ${Python_EXECUTABLE}
                   ${TUTTI_PYTHON_DIR} ${PROJECT_SOURCE_DIR}/examples/horovod_mnist.py)
  set_tests_properties(python.horovod.mnist_example PROPERTIES LABELS "python;mp" TIMEOUT 300 SKIP_RETURN_CODE 77)
endif()
