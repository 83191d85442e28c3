# Writes tutti.pc (cmake/tutti.pc.in) and installs it to ${CMAKE_INSTALL_LIBDIR}/pkgconfig, so that
# `pkg-config --cflags --libs tutti` builds a program against an installed Tutti. Included from
# src/CMakeLists.txt once the library's dependencies are known; the fields mirror what the
# exported target Tutti::tutti carries (the install test checks both ways).
#
# What libtutti links privately (libcrypto, librt, the static CUDA runtime) goes to Requires.private
# and Libs.private for a shared libtutti; a static libtutti cannot link without them, so there they
# are public: `pkg-config --libs tutti` is enough either way.

# The prefix relative to the file (${pcfiledir}), so that `cmake --install --prefix` anywhere works.
if(IS_ABSOLUTE "${CMAKE_INSTALL_LIBDIR}" OR IS_ABSOLUTE "${CMAKE_INSTALL_INCLUDEDIR}")
  set(TUTTI_PC_PREFIX "${CMAKE_INSTALL_PREFIX}")
  set(TUTTI_PC_LIBDIR "${CMAKE_INSTALL_FULL_LIBDIR}")
  set(TUTTI_PC_INCLUDEDIR "${CMAKE_INSTALL_FULL_INCLUDEDIR}")
else()
  file(RELATIVE_PATH tutti_pc_up "/${CMAKE_INSTALL_LIBDIR}/pkgconfig" "/")
  string(REGEX REPLACE "/$" "" tutti_pc_up "${tutti_pc_up}")
  set(TUTTI_PC_PREFIX "\${pcfiledir}/${tutti_pc_up}")
  set(TUTTI_PC_LIBDIR "\${prefix}/${CMAKE_INSTALL_LIBDIR}")
  set(TUTTI_PC_INCLUDEDIR "\${prefix}/${CMAKE_INSTALL_INCLUDEDIR}")
endif()

# Public: what users of the headers need (MPI's, as the exported target names them).
set(TUTTI_PC_REQUIRES "")
set(TUTTI_PC_CFLAGS "")
set(TUTTI_PC_LIBS "")
if(TUTTI_WITH_MPI)
  string(APPEND TUTTI_PC_CFLAGS " -DTUTTI_WITH_MPI=1")
  foreach(dir IN LISTS MPI_CXX_INCLUDE_DIRS)
    string(APPEND TUTTI_PC_CFLAGS " -I${dir}")
  endforeach()
  foreach(lib IN LISTS MPI_CXX_LIBRARIES)
    string(APPEND TUTTI_PC_LIBS " ${lib}")
  endforeach()
endif()

# Private: what libtutti itself links.
set(tutti_pc_requires_private libcrypto)
set(tutti_pc_libs_private -lrt)
if(TUTTI_WITH_CUDA)
  list(PREPEND tutti_pc_libs_private -L${CUDAToolkit_LIBRARY_DIR} -lcudart_static -ldl)
endif()
list(JOIN tutti_pc_libs_private " " tutti_pc_libs_private)
get_target_property(tutti_pc_type tutti TYPE)
if(tutti_pc_type STREQUAL "STATIC_LIBRARY")
  string(APPEND TUTTI_PC_REQUIRES "${tutti_pc_requires_private}")
  string(APPEND TUTTI_PC_LIBS " ${tutti_pc_libs_private}")
  set(TUTTI_PC_REQUIRES_PRIVATE "")
  set(TUTTI_PC_LIBS_PRIVATE "")
else()
  set(TUTTI_PC_REQUIRES_PRIVATE "${tutti_pc_requires_private}")
  set(TUTTI_PC_LIBS_PRIVATE "${tutti_pc_libs_private}")
endif()

configure_file(${PROJECT_SOURCE_DIR}/cmake/tutti.pc.in ${PROJECT_BINARY_DIR}/tutti.pc @ONLY)
install(FILES ${PROJECT_BINARY_DIR}/tutti.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
